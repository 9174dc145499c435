"""Small pure pieces: file names, settings, fusion, query terms, error classes, blobs, locks."""

from __future__ import annotations

import errno
import random
import re
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy.exc import OperationalError

from knowledgeops.db.blobs import LocalBlobStore
from knowledgeops.db.lockfile import DataDirLock
from knowledgeops.errors import (
    DataDirLocked,
    ErrorCategory,
    InvalidRequest,
    PayloadTooLarge,
    PermanentError,
    SettingsError,
    TransientError,
)
from knowledgeops.ingest.index import terms
from knowledgeops.ingest.index.base import Hit, chunk_id
from knowledgeops.ingest.index.keywords import tokens
from knowledgeops.ingest.index.terms import (
    coverage,
    index_text,
    query_terms,
    query_words,
    rarest_terms,
)
from knowledgeops.jobs.classify import classify
from knowledgeops.lab.bench.passages import faq_pages
from knowledgeops.lab.embedders import HashingEmbedder
from knowledgeops.service import search as search_module
from knowledgeops.service.search import merge_scaled, score_fusion
from knowledgeops.service.uploads import check_idempotency_key, display_name
from knowledgeops.settings import Settings, load_settings


# --- file names -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("report.pdf", "report.pdf"),
        ("../../etc/passwd.txt", "passwd.txt"),
        ("C:\\Users\\me\\notes.md", "notes.md"),
        ("bad\x00na\x1bme\x7f.txt", "badname.txt"),
        ("  spaced  .docx ", "spaced  .docx"),
        ("..", "upload.pdf"),
        ("", "upload.pdf"),
        (None, "upload.pdf"),
    ],
)
def test_display_names_are_sanitised(raw: str | None, shown: str) -> None:
    assert display_name(raw, "application/pdf") == shown


def test_long_names_keep_their_extension() -> None:
    name = display_name("x" * 500 + ".pdf")
    assert len(name) <= 255
    assert name.endswith("….pdf")
    assert len(display_name("y" * 600)) <= 255


def test_idempotency_keys() -> None:
    assert check_idempotency_key(None) is None
    assert check_idempotency_key("order-42") == "order-42"
    for bad in ["", "x" * 201, "has space", "naïve"]:
        with pytest.raises(InvalidRequest):
            check_idempotency_key(bad)


# --- settings ---------------------------------------------------------------------------------
def test_settings_defaults_and_sqlite_url(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    assert settings.is_sqlite
    assert settings.resolved_database_url == f"sqlite:///{(tmp_path / 'kops.db').resolve()}"
    assert settings.max_upload_bytes == 100 * 1024 * 1024


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KOPS_PORT", "9123")
    monkeypatch.setenv("KOPS_MAX_UPLOAD_MB", "2.5")
    settings = load_settings()
    assert (settings.port, settings.max_upload_bytes) == (9123, int(2.5 * 1024 * 1024))


def test_bad_settings_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KOPS_PORT", "not-a-port")
    monkeypatch.setenv("KOPS_WORKERS", "0")
    with pytest.raises(SettingsError) as raised:
        load_settings()
    message = str(raised.value)
    assert "KOPS_PORT" in message
    assert "not-a-port" in message
    assert "KOPS_WORKERS" in message


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"chunk_size": 300}, "chunk_size"),
        ({"chunk_size": 100, "chunk_overlap": 60}, "chunk_overlap"),
        ({"backoff_base_s": 10, "backoff_max_s": 5}, "backoff_max_s"),
        ({"heartbeat_interval_s": 30, "stale_after_s": 60}, "stale_after_s"),
    ],
)
def test_inconsistent_settings_are_refused(overrides: dict[str, float], words: str) -> None:
    with pytest.raises(SettingsError, match=words):
        load_settings(**overrides)


def test_secrets_never_show_in_the_description() -> None:
    settings = Settings(database_url="postgresql://kops:hunter2@db/kops")  # type: ignore[arg-type]
    shown = str(settings.describe())
    assert "hunter2" not in shown
    assert "'database_url': 'set'" in shown
    assert "hunter2" not in repr(settings)


# --- fusion and query terms -------------------------------------------------------------------
def hit(chunk: str, score: float = 0.0) -> Hit:
    return Hit(chunk, "doc", 0, chunk, None, None, None, score)


def test_score_fusion_weighs_scores_and_the_words_a_keyword_hit_holds() -> None:
    query = "rotate etcd certificates"
    vector = [hit("a", 0.80), hit("b", 0.79), hit("c", 0.40)]
    keyword = [
        Hit("c", "doc", 0, "rotate the etcd certificates yearly", None, None, None, 10.0),
        Hit("a", "doc", 0, "etcd backups", None, None, None, 9.0),
    ]
    fused = score_fusion(query, vector, keyword, vector_weight=0.5)
    assert [h.chunk_id for h in fused] == ["a", "c", "b"]
    # a: the best vector (1) and one word of three: its keyword share counts (1/3)²
    assert fused[0].score == pytest.approx(0.5 * 1.0 + 0.5 * 0.9 * (1 / 3) ** 2)
    # c: the last vector candidate (0) but every word of the query, at the best keyword score
    assert fused[1].score == pytest.approx(0.5 * 0.0 + 0.5 * 1.0 * 1.0**2)
    # b is missing from the keyword list: its vector share only
    assert fused[2].score == pytest.approx(0.5 * (0.79 - 0.40) / (0.80 - 0.40))
    # a limit keeps the best so many, in the same order and with the same scores
    assert score_fusion(query, vector, keyword, 0.5, limit=2) == fused[:2]
    assert score_fusion(query, [], [], 0.5) == []
    assert [h.chunk_id for h in score_fusion(query, vector, [], 0.9)] == ["a", "b", "c"]


def test_a_limited_fusion_looks_at_fewer_texts_and_returns_what_scoring_every_hit_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # lists like a hybrid search's: 40 a side, overlapping, keyword texts holding some of the
    # question's words; scores drawn with ties, so the tie order is checked too
    rng = random.Random(5)
    words = ["etcd", "rotate", "certificates", "backup", "restore", "kubelet", "yearly"]
    looked = 0

    def counted(query_words: list[str], text: str) -> float:
        nonlocal looked
        looked += 1
        return coverage(query_words, text)

    monkeypatch.setattr(search_module, "coverage", counted)
    pruned = 0
    for _ in range(300):
        pool = [f"c{n}" for n in range(70)]
        vector = [hit(c, round(rng.uniform(0.2, 0.9), 2)) for c in rng.sample(pool, 40)]
        vector.sort(key=lambda h: -h.score)
        keyword = [
            Hit(
                c,
                "doc",
                0,
                " ".join(rng.sample(words, rng.randint(1, 5))),
                None,
                None,
                None,
                float(rng.randint(1, 12)),
            )
            for c in rng.sample(pool, rng.randint(0, 40))
        ]
        keyword.sort(key=lambda h: -h.score)
        query = " ".join(rng.sample(words, 3))
        weight = rng.choice([0.3, 0.5, 0.7])
        looked = 0
        every = score_fusion(query, vector, keyword, weight)
        assert looked == len(keyword)
        for limit in (1, 10, 25):
            looked = 0
            assert score_fusion(query, vector, keyword, weight, limit=limit) == every[:limit]
            pruned += looked < len(keyword)
    assert pruned > 300  # the bound leaves texts unread in most fusions
    assert score_fusion("etcd", [hit("a", 0.5)], [hit("a", 1.0)], 0.5, limit=0) == []


def test_a_keyword_hit_holding_one_word_of_the_question_does_not_outvote_the_vectors() -> None:
    # an English question against Japanese pages: the words match "Debian" and nothing else
    query = "How do I install Debian on a laptop"
    vector = [hit("right", 0.62), hit("other", 0.55)]
    keyword = [Hit("other", "doc", 0, "Debian のパッケージ", None, None, None, 3.0)]
    assert score_fusion(query, vector, keyword, 0.5)[0].chunk_id == "right"


def test_equal_fused_scores_keep_the_lists_order() -> None:
    vector = [hit("x", 0.5), hit("y", 0.5)]
    assert [h.chunk_id for h in score_fusion("q", vector, [], 0.5)] == ["x", "y"]
    assert [h.chunk_id for h in score_fusion("q", vector, [], 0.5)] == ["x", "y"]  # every time
    negative = [hit("p", -0.1), hit("q", -0.3)]
    assert [h.chunk_id for h in score_fusion("q", negative, [], 0.5)] == ["p", "q"]


def test_query_terms() -> None:
    assert query_terms("How does Ownership work? ownership!") == ["ownership", "work"]
    assert query_terms("what is it") == ["what", "is", "it"]  # only function words: kept
    assert query_terms("?! ()") == []


def test_chinese_is_cut_into_words_and_the_query_into_the_same_words() -> None:
    # jieba's search mode: the words of a long word too; a query also asks for the bigrams a
    # Japanese text would hold; function words (后, 怎么) dropped
    assert query_terms("任务状态 retry") == ["任务", "状态", "务状", "retry"]
    assert query_terms("Worker 崩溃后任务怎么恢复")[:4] == ["worker", "崩溃", "任务", "恢复"]
    assert index_text("abc状态机def") == "abc 状态 状态机 def"
    assert index_text("数据库是唯一的真相来源。").split()[:3] == ["数据", "据库", "数据库"]
    assert {"心跳", "检测"} <= set(index_text("通过心跳检测发现崩溃的 worker").split())


def test_japanese_and_korean_are_cut_into_bigrams() -> None:
    # kana anywhere in the text: every CJK run (kanji too) becomes overlapping bigrams
    assert index_text("設定ファイル").split() == ["設定", "定フ", "ファ", "ァイ", "イル"]
    assert query_terms("設定ファイル") == ["設定", "定フ", "ファ", "ァイ", "イル"]
    assert index_text("데비안을 설치").split() == ["데비", "비안", "안을", "설치"]
    assert index_text("no CJK here") == "no CJK here"


def _whole_text_tokens(text: str) -> list[str]:
    """The keyword index's terms as first defined: the text normalised whole (no cut caches)."""
    japanese = terms._HAS_KANA.search(text) is not None
    lowered = terms._CJK_RUN.sub(lambda m: terms._run_text(m.group(), japanese), text).lower()
    bare = re.sub("[\u0300-\u036f]+", "", unicodedata.normalize("NFD", lowered))
    return re.findall(r"[^\W_]+", unicodedata.normalize("NFC", bare))


def test_the_keyword_terms_taken_a_piece_at_a_time_are_those_of_the_whole_text() -> None:
    tricky = [
        "Cafe\u0301 na\u00efve ÉCOLE",  # a mark decomposed, precomposed, upper case
        "ΟΔΟΣ ΟΔΟΣ. ΣΑΣ",  # final sigma: lower-cased by its neighbours
        "\u1100\u1161\u11a8 \u1100 \u1161",  # Hangul jamo composed into a syllable, or not
        " \u0301a b\u0301 \u3099か が",  # marks after a space, a kana voicing mark
        "İstanbul ǅemal ﬁle Å",  # İ lower-cases to two; a ligature; the angstrom sign
        "x" * 70 + "é " + "データベース" * 10 + " 数据库是唯一的真相来源",  # long pieces, CJK
        "tab\tand\nnew line é\u00a0nbsp  two  spaces ",
    ]
    pages = faq_pages(Path(__file__).parents[2] / "eval")
    texts = tricky + [page[start : start + 1500] for page in pages for start in (0, 7000)]
    for text in texts:
        assert tokens(text) == _whole_text_tokens(text), text[:80]
        assert tokens(text) == _whole_text_tokens(text), text[:80]  # from the caches
    assert tokens("Ἀθῆναι naïve") == ["αθηναι", "naive"]


def test_a_long_question_asks_for_its_rarest_terms_within_the_budget() -> None:
    held = {"debian": 880, "linux": 690, "gnu": 610, "package": 700, "slackware": 3, "rpm": 40}
    held |= {"use": 300, "软件": 0}
    question = ["use", "debian", "rpm", "linux", "slackware", "gnu", "package", "软件"]
    # 0 + 3 + 40 + 300 + 610 + 690 + 700 postings fit in 3 × 900; debian's 880 would pass it
    assert rarest_terms(question, held.get, 900) == [
        "use",
        "rpm",
        "linux",
        "slackware",
        "gnu",
        "package",
        "软件",
    ]
    assert rarest_terms(question, held.get, 1200) == question  # all fit
    assert rarest_terms(["gnu", "rpm", "gnu"], held.get, 900) == ["gnu", "rpm"]  # once each
    # counts that disagree (deleted chunks not merged away yet): the rarest is always asked
    assert rarest_terms(["debian", "linux"], held.get, 100) == ["linux"]
    # another budget (the candidates' words: rarest_first.py): 0 + 3 + 40 + 300 fit in 1 × 900
    assert rarest_terms(question, held.get, 900, 1.0) == ["use", "rpm", "slackware", "软件"]
    # equally rare: the query's order decides
    assert rarest_terms(["b", "a", "c"], {"a": 5, "b": 5, "c": 5}.get, 4) == ["b", "a"]
    assert rarest_terms([], held.get, 10) == []


def test_chunk_ids_are_stable_and_distinct() -> None:
    assert chunk_id("d", 1, 0) == chunk_id("d", 1, 0)
    assert len({chunk_id("d", 1, 0), chunk_id("d", 2, 0), chunk_id("d", 1, 1)}) == 3


def test_hashing_embedder_is_deterministic_and_normalised() -> None:
    embedder = HashingEmbedder(dimension=32)
    a, b = embedder.embed(["ownership rules", "ownership rules"])
    assert np.array_equal(a, b)
    assert float(np.linalg.norm(a)) == pytest.approx(1.0)
    assert (embedder.calls, embedder.texts, embedder.batch_sizes) == (1, 2, [2])


# --- error classification ----------------------------------------------------------------------
def test_classification() -> None:
    transient = TransientError("x", code="y")
    assert classify(transient, job_id="j") is transient
    db = classify(OperationalError("SELECT 1", {}, Exception("database is locked")), job_id="j")
    assert (db.category, db.code) == (ErrorCategory.TRANSIENT, "database_unavailable")
    assert classify(TimeoutError(), job_id="j").category is ErrorCategory.TRANSIENT
    disk = classify(OSError(errno.ENOSPC, "No space left on device"), job_id="j")
    assert disk.category is ErrorCategory.TRANSIENT
    missing = classify(FileNotFoundError(errno.ENOENT, "gone"), job_id="j")
    assert (missing.category, missing.code) == (ErrorCategory.PERMANENT, "internal_error")
    bug = classify(ZeroDivisionError(), job_id="j")
    assert isinstance(bug, PermanentError)
    assert "reference" in bug.message


# --- blobs -------------------------------------------------------------------------------------
def test_staged_uploads_are_content_addressed(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    staged = store.stage(max_bytes=100)
    staged.write(b"hello ")
    staged.write(b"world")
    key = staged.commit()
    assert key == "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9"
    assert store.path(key).read_bytes() == b"hello world"
    assert store.path(key).relative_to(tmp_path / "blobs").parts[:2] == ("b9", "4d")
    assert list(store.incoming.iterdir()) == []
    again = store.stage(max_bytes=100)
    again.write(b"hello world")
    assert again.commit() == key
    assert list(store.incoming.iterdir()) == []


def test_staged_uploads_stop_at_the_limit(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    staged = store.stage(max_bytes=10)
    staged.write(b"12345")
    with pytest.raises(PayloadTooLarge, match="KOPS_MAX_UPLOAD_MB"):
        staged.write(b"678901")
    assert list(store.incoming.iterdir()) == []
    assert list((tmp_path / "blobs").rglob("*")) == []


def test_blob_keys_cannot_name_paths(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    for bad in ["../../etc/passwd", "a" * 63 + "/", "Z" * 64]:
        with pytest.raises(ValueError, match="not a blob key"):
            store.path(bad)


def test_leftover_partial_uploads_are_cleared(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path)
    store.stage(max_bytes=10).write(b"abc")
    assert store.clear_incoming() == 1
    assert list(store.incoming.iterdir()) == []


# --- the data folder lock ----------------------------------------------------------------------
def test_one_process_per_data_folder(tmp_path: Path) -> None:
    first = DataDirLock(tmp_path)
    first.acquire()
    first.acquire()  # idempotent in the holder
    second = DataDirLock(tmp_path)
    with pytest.raises(DataDirLocked, match="scale-out") as raised:
        second.acquire()
    assert str(tmp_path.resolve()) in str(raised.value)
    first.release()
    second.acquire()
    second.release()


def test_display_names_lose_bidi_overrides_and_keep_dotfiles() -> None:
    assert display_name("invoice\u202egpj.exe.pdf") == "invoicegpj.exe.pdf"
    assert display_name(".txt") == ".txt"
    assert display_name("zero\u200bwidth.md") == "zerowidth.md"


def test_query_words_and_how_much_of_them_a_text_holds() -> None:
    assert query_words("任务状态 retry") == ["任务", "状态", "retry"]  # no Japanese bigrams
    assert coverage(["worker", "崩溃", "恢复"], "worker 进程崩溃后由心跳检测恢复") == 1.0
    assert coverage(["install", "debian", "laptop"], "Debian のパッケージ") == pytest.approx(1 / 3)
    assert coverage([], "anything") == 0.0
    # a word is a whole run of letters, digits and underscores: a CJK character or any other
    # character ends it, and a later occurrence counts when the first is inside a longer run
    assert coverage(["mail"], "e-mail") == 1.0
    assert coverage(["mail"], "email mailbox mail_box") == 0.0
    assert coverage(["debian"], "debian中文") == 1.0
    assert coverage(["x2"], "ax2 x2b x2") == 1.0
    assert coverage(["café"], "cafés") == 0.0


def test_coverage_is_the_share_of_words_among_the_texts_index_terms() -> None:
    """The fast path (CJK cut only when a CJK word occurs) against the definition, on the
    Debian FAQ in its seven languages: a question is words of another page and of this one."""
    pages = faq_pages(Path(__file__).resolve().parents[2] / "eval")
    rng = random.Random(7)
    for _ in range(600):
        page, other = rng.choice(pages), rng.choice(pages)
        start = rng.randrange(max(len(page) - 400, 1))
        text = page[start : start + 400]
        words = query_words(other[:40] + " " + text[100:130])
        held = set(re.findall(r"\w+", index_text(text).lower()))
        expected = sum(word in held for word in words) / len(words) if words else 0.0
        assert coverage(words, text) == expected, (words, text)


def test_rankings_of_two_models_merge_by_scores_scaled_within_each() -> None:
    """e5's cosines sit near 0.8, MiniLM's near 0.3: merged raw, every e5 hit would come
    first; scaled within each list, the best of each come first, then the rest by their place."""
    e5 = [hit("e1", 0.86), hit("e2", 0.84), hit("e3", 0.80)]
    minilm = [hit("m1", 0.40), hit("m2", 0.25), hit("m3", 0.10)]
    merged = merge_scaled([e5, minilm])
    assert [h.chunk_id for h in merged] == ["e1", "m1", "e2", "m2", "e3", "m3"]
    assert [round(h.score, 3) for h in merged] == [1.0, 1.0, 0.667, 0.5, 0.0, 0.0]
    assert merge_scaled([[], minilm])[0].chunk_id == "m1"
