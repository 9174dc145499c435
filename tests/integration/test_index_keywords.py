"""The embedded keyword index at scale (ingest/index/keywords.py: Tantivy beside SQLite) against a
real SQLite database and a real Tantivy index on disk: its searches answer without FTS5, a
chunk activated a moment ago is found before the index holds it, nothing dropped by the
database answers, a restart opens the committed index and replays the log (a damaged one is
rebuilt), and the graphs' pruning keeps the log rows it still needs."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import tantivy

from knowledgeops.db.engine import Database
from knowledgeops.ingest.index import graphs, keywords, rarest_first, terms
from knowledgeops.ingest.index.filters import SearchFilter
from knowledgeops.ingest.index.keys import dataset_key
from knowledgeops.ingest.index.keywords import tokens
from knowledgeops.ingest.index.sqlite import SqliteIndex, side_folder
from knowledgeops.lab.bench.search import _keyword_budget_sweep, _rarest_first_sweep
from knowledgeops.roles.wiring import make_index
from knowledgeops.settings import Settings
from tests.fixtures.rows import insert_dataset, insert_document
from tests.integration.test_index_graphs import EMBED, chunks, write

WORDS = [f"w{n}" for n in range(300)]


def texts(seed: int, count: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=15)) for _ in range(count)]


def make(db: Database) -> SqliteIndex:
    index = SqliteIndex(db, EMBED.dimension, graph_min_chunks=10**9, keyword_min_chunks=0)
    index.ensure()
    return index


def kept(index: SqliteIndex) -> None:
    """The index built and holding the whole log."""
    index.keywords.want()
    assert index.keywords.caught_up(timeout=60)


def without_fts(index: SqliteIndex) -> None:
    """Empty FTS5's table: whatever a keyword search finds now, Tantivy found."""
    with index.db.write() as tx:
        tx.exec_driver_sql(f"DELETE FROM {index.fts}")


def found(index: SqliteIndex, dataset: str, query: str, k: int = 5, where=None) -> list[str]:
    return [hit.text for hit in index.search_keyword(dataset, query, k, where)]


@pytest.fixture
def setup(sqlite_db: Database):
    index = make(sqlite_db)
    with sqlite_db.write() as conn:
        dataset = insert_dataset(conn)
    yield index, dataset
    index.close()


def test_searches_answer_from_tantivy_within_their_dataset(setup) -> None:
    index, dataset = setup
    with index.db.write() as conn:
        other = insert_dataset(conn, str(uuid.uuid4()))
        document = insert_document(conn, dataset)
        elsewhere = insert_document(conn, other)
    write(index, dataset, document, 1, [*texts(1, 200), "the okapi grazes at dawn"])
    write(index, other, elsewhere, 1, ["the okapi sleeps at noon"] * 20)
    kept(index)
    without_fts(index)
    assert found(index, dataset, "okapi dawn") == ["the okapi grazes at dawn"]
    assert found(index, other, "okapi grazes", k=3) == ["the okapi sleeps at noon"] * 3
    assert found(index, dataset, "tapir") == []
    assert index.keywords.builds == 1


def test_another_datasets_words_do_not_move_a_datasets_ranking(setup) -> None:
    """A word's BM25 weight is its dataset's: another tenant's many chunks holding "gamma"
    (which would make it a common word of the whole table) leave this dataset's order as it
    was, the chunk of its rarer word first."""
    index, dataset = setup
    with index.db.write() as conn:
        other = insert_dataset(conn, str(uuid.uuid4()))
        document = insert_document(conn, dataset)
        elsewhere = insert_document(conn, other)
    bodies = ["alpha w1 w2", "gamma w3 w4", "alpha w5 w6", *texts(5, 40)]
    write(index, dataset, document, 1, bodies)
    kept(index)
    without_fts(index)
    alone = found(index, dataset, "alpha gamma", k=3)
    assert alone == ["gamma w3 w4", "alpha w1 w2", "alpha w5 w6"]
    write(index, other, elsewhere, 1, [f"gamma {body}" for body in texts(6, 60)])
    kept(index)
    assert found(index, dataset, "alpha gamma", k=3) == alone
    assert len(found(index, other, "gamma", k=100)) == 60


def test_the_shards_rank_the_chunks_as_one_index_of_their_words_would(setup) -> None:
    """The chunks are split in shards, each with its own terms, so a word's count of chunks
    differs from shard to shard; the boosts give each shard the dataset's idf. Every chunk that
    holds a word of the question scores as in one Tantivy index of the same words (one chunk
    holds "okapi", so the other shard has no term of it), and both shards answer."""
    index, dataset = setup
    with index.db.write() as conn:
        document = insert_document(conn, dataset)
    rng = np.random.default_rng(31)
    bodies = [" ".join(rng.choice(WORDS[:60], size=int(rng.integers(4, 40)))) for _ in range(300)]
    write(index, dataset, document, 1, [*bodies, "the okapi w1 w7"])
    kept(index)
    reference = tantivy.Index(keywords._schema())
    writer = reference.writer(heap_size=15_000_000, num_threads=1)
    with index.db.read() as conn:
        rows = conn.exec_driver_sql("SELECT seq, text FROM chunks").all()
    for seq, body in rows:
        writer.add_document(tantivy.Document(text=" ".join(tokens(body)), seq=seq, dataset=0))
    writer.commit()
    reference.reload()
    searcher = reference.searcher()
    for question in ("okapi w1 w7", "w3 w11 w29 w40", "w59"):
        words = terms.query_terms(question)
        query = tantivy.Query.boolean_query(
            [
                (tantivy.Occur.Should, tantivy.Query.term_query(keywords._schema(), "text", word))
                for word in keywords.query_tokens(words)
            ]
        )
        one = dict(rarest_first.top(searcher, query, len(rows)))
        with index.db.read() as conn:
            found = index.keywords.candidates(conn, dataset_key(dataset), words, len(rows))
        assert found is not None
        shards = dict(found.scored)
        assert shards.keys() == one.keys()
        assert {seq % keywords.SHARDS for seq in shards} == set(range(keywords.SHARDS))
        for seq, score in one.items():
            assert shards[seq] == pytest.approx(score, rel=1e-5)
        ranked = [seq for seq, _ in found.scored]
        assert ranked == sorted(one, key=lambda seq: (-shards[seq], seq))
        assert found.ranked == len(one)


def test_a_word_most_chunks_hold_scores_only_the_candidates_and_the_ranking_is_kept(
    setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A word (nearly) every chunk of the dataset holds weighs almost nothing, and costs the
    most postings: the index's search finds its candidates by the rarer words and asks that
    word for those chunks alone (rarest_first.py). With a generation replaced (the old chunks
    deleted, still counted by Tantivy until a merge), the best ten of both shards are every
    word's plain disjunction's, scored as it scores them."""
    index, dataset = setup
    with index.db.write() as conn:
        document = insert_document(conn, dataset)
    rng = np.random.default_rng(8)
    bodies = [
        " ".join([*rng.choice(WORDS, size=int(rng.integers(4, 30))), *["debian"] * (1 + n % 3)])
        for n in range(400)
    ]
    write(index, dataset, document, 1, bodies)
    write(index, dataset, document, 2, bodies[:350])
    kept(index)
    words = terms.query_terms("debian w3 w11 w250")
    common: list[tuple[int, int]] = []
    real = rarest_first.common_part

    def spy(searcher, schema, terms_, seqs) -> dict[int, float]:  # type: ignore[no-untyped-def]
        common.append((len(terms_), len(seqs)))
        return real(searcher, schema, terms_, seqs)

    monkeypatch.setattr(rarest_first, "common_part", spy)
    with index.db.read() as conn:
        first = index.keywords.candidates(conn, dataset_key(dataset), words, 10)
    assert common  # "debian" was asked for the candidates alone, in each shard
    assert all(terms_ == 1 and seqs <= 10 * rarest_first.FIRST_ASK for terms_, seqs in common)
    monkeypatch.setattr(rarest_first, "RESCORE", False)
    monkeypatch.setattr(terms, "QUERY_POSTINGS_PER_CHUNK", float("inf"))
    with index.db.read() as conn:
        plain = index.keywords.candidates(conn, dataset_key(dataset), words, 10)
    assert first is not None
    assert plain is not None
    assert [seq for seq, _ in first.scored] == [seq for seq, _ in plain.scored]
    assert [score for _, score in first.scored] == pytest.approx(
        [score for _, score in plain.scored], rel=1e-6
    )
    assert {seq % keywords.SHARDS for seq, _ in first.scored} == set(range(keywords.SHARDS))


def test_a_process_forked_after_searching_still_searches_every_shard(setup) -> None:
    """The threads that search the other shards are the process's: a child forked after the
    parent searched (its threads started) makes its own instead of waiting for the parent's,
    which it does not have."""
    index, dataset = setup
    with index.db.write() as conn:
        document = insert_document(conn, dataset)
    write(index, dataset, document, 1, [*texts(3, 200), "the okapi grazes at dawn"])
    kept(index)
    view = index.keywords._view
    assert view is not None
    key = dataset_key(dataset)
    words = keywords.query_tokens(terms.query_terms("okapi w3 w5"))
    freqs = index.keywords._doc_freqs(view, key, words)
    before = index.keywords._search(view, key, words, words, 50, freqs)
    assert {seq % keywords.SHARDS for seq, _ in before} == set(range(keywords.SHARDS))
    index.keywords.close()  # no thread of the index's own writes while the process forks
    child = os.fork()
    if child == 0:  # pragma: no cover (the child's exit status is the assertion)
        code = 1
        try:
            code = 0 if index.keywords._search(view, key, words, words, 50, freqs) == before else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    pytest.fail("the forked child's search did not return within 60 s")


def test_a_chunk_is_found_before_the_index_holds_it_and_a_dropped_one_never(setup) -> None:
    index, dataset = setup
    with index.db.write() as conn:
        document, other = insert_document(conn, dataset), insert_document(conn, dataset)
    write(index, dataset, document, 1, [*texts(2, 100), "a heron waits in the reeds"])
    write(index, dataset, other, 1, ["the heron flies over the reeds"])
    kept(index)
    index.keywords.close()  # the thread stops: the index stays as it is
    without_fts(index)
    write(index, dataset, document, 2, ["a heron fishes at dusk", *texts(3, 50)])  # replaces 1
    with index.db.write() as tx:
        index.delete_document(tx, other)
    pending = found(index, dataset, "heron reeds dusk")
    assert pending == ["a heron fishes at dusk"]  # generation 2 at once; 1 and the deleted gone
    kept(index)  # the thread again: the index applies the log
    assert found(index, dataset, "heron reeds dusk") == pending
    view = index.keywords._view
    assert view is not None
    assert view.searcher.num_docs == 51  # generation 1 and the deleted document are gone


def long_question_dataset(index: SqliteIndex, dataset: str) -> tuple[list[str], list[str]]:
    """100 chunks: 80 of document "a" hold aa, bb and cc (the first also okapi), 60 of them
    dd too; the 20 of document "b" hold only dd. Asked "okapi aa bb cc dd", the rarest words
    reach 1 + 3 × 80 postings, and dd's 80 more would pass 3 × 100: dd is left out."""
    with index.db.write() as conn:
        first = insert_document(conn, dataset, meta={"part": "a"})
        second = insert_document(conn, dataset, meta={"part": "b"})
    fillers = texts(7, 100)
    a = [
        " ".join(["okapi"] * (n == 0) + ["aa", "bb", "cc"] + ["dd"] * (n >= 20) + [fillers[n]])
        for n in range(80)
    ]
    b = [f"dd {filler}" for filler in fillers[80:]]
    write(index, dataset, first, 1, a)
    write(index, dataset, second, 1, b)
    kept(index)
    without_fts(index)
    return a, b


def test_a_long_question_finds_by_its_rarest_words_and_ranks_by_every_word(
    setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked "okapi aa bb cc dd", the candidates are found by okapi and aa (81 postings of the
    100 a chunk allows: rarest_first.CANDIDATE_POSTINGS_PER_CHUNK); every word scores them, so
    after the chunk holding okapi come those holding dd too. Asked the old way, the plain
    disjunction of the words within 3 postings a chunk, dd is left out and those without it
    rank first (shorter)."""
    index, dataset = setup
    a, b = long_question_dataset(index, dataset)
    hits = found(index, dataset, "okapi aa bb cc dd", k=5)
    assert hits[0] == a[0]
    assert set(hits[1:]) <= set(a[20:])
    monkeypatch.setattr(rarest_first, "RESCORE", False)
    hits = found(index, dataset, "okapi aa bb cc dd", k=5)
    assert hits[0] == a[0]
    assert set(hits[1:]) <= set(a[1:20])
    assert set(found(index, dataset, "dd", k=5)) <= {*a[20:], *b}  # asked alone: found


def test_chunks_only_a_left_out_word_finds_are_found_under_a_filter(setup) -> None:
    """A filter admitting only document "b", whose chunks hold only the word left out: the
    rarest words match none of them, so every word is asked and they are found."""
    index, dataset = setup
    _, b = long_question_dataset(index, dataset)
    where = SearchFilter(metadata=(("part", ("b",)),))
    hits = found(index, dataset, "okapi aa bb cc dd", k=5, where=where)
    assert len(hits) == 5
    assert set(hits) <= set(b)


def test_the_bench_sweeps_the_postings_budget_against_every_word(setup) -> None:
    """`kops bench search`'s sweep: every word is the reference (its top 10 kept whole), a
    budget that leaves words out keeps less of it, rarest first keeps it whole (every word
    scores its candidates), and the settings found are put back."""
    index, dataset = setup
    with index.db.write() as conn:
        document = insert_document(conn, dataset)
    write(index, dataset, document, 1, texts(8, 400))
    kept(index)
    questions = [" ".join(WORDS[n : n + 30]) for n in range(0, 300, 30)]
    sweep = _keyword_budget_sweep(index, dataset, questions)
    assert set(sweep) == {
        "inf",
        "1.0",
        "2.0",
        "3.0",
        "4.0",
        "rarest 0.5",
        "rarest 1.0",
        "rarest 2.0",
    }
    assert sweep["inf"]["top10_kept"] == 1.0
    # thirty words in 5% of the chunks each (1.5 postings a chunk): a budget of one posting a
    # chunk asks about two thirds of them and ranks otherwise, three a chunk asks every word
    assert sweep["1.0"]["top10_kept"] < 0.9
    assert sweep["3.0"]["top10_kept"] == 1.0
    assert sweep["rarest 1.0"]["top10_kept"] > sweep["1.0"]["top10_kept"]
    assert all(0 < row["p50"] <= row["p95"] <= row["max"] for row in sweep.values())
    assert terms.QUERY_POSTINGS_PER_CHUNK == 3.0
    assert rarest_first.RESCORE
    assert rarest_first.CANDIDATE_POSTINGS_PER_CHUNK == 1.0


def test_the_bench_measures_keyword_and_hybrid_rarest_first_and_the_old_way(setup) -> None:
    """`kops bench search`'s rarest-first sweep: both ways for keyword and hybrid search, and
    rarest first put back on."""
    index, dataset = setup
    with index.db.write() as conn:
        document = insert_document(conn, dataset)
    rng = np.random.default_rng(12)
    bodies = [
        " ".join([*rng.choice(WORDS, size=5 + n % 23), *["debian"] * (1 + n % 4)])
        for n in range(400)
    ]
    write(index, dataset, document, 1, bodies)
    kept(index)
    questions = [f"debian w{n} w{n + 100}" for n in range(0, 100, 10)]
    sweep = _rarest_first_sweep(index, dataset, questions, EMBED.dimension)
    assert set(sweep) == {
        "keyword rarest first",
        "keyword budget",
        "hybrid rarest first",
        "hybrid budget",
    }
    assert all(0 < row["p50"] <= row["p95"] <= row["max"] for row in sweep.values())
    assert rarest_first.RESCORE


def test_a_pending_chunk_scores_as_the_index_will_score_it(setup) -> None:
    index, dataset = setup
    with index.db.write() as conn:
        document, later = insert_document(conn, dataset), insert_document(conn, dataset)
    write(
        index,
        dataset,
        document,
        1,
        [f"{body} heron" if n % 7 == 0 else body for n, body in enumerate(texts(20, 300))],
    )
    kept(index)
    index.keywords.close()
    write(index, dataset, later, 1, ["a heron fishes at dusk w1 w2 w3 w4 w5 w6 w7 w8 w9 w10"])
    query = "heron dusk w3"
    before = {hit.text: hit.score for hit in index.search_keyword(dataset, query, 10)}
    kept(index)
    after = {hit.text: hit.score for hit in index.search_keyword(dataset, query, 10)}
    new = "a heron fishes at dusk w1 w2 w3 w4 w5 w6 w7 w8 w9 w10"
    assert new in before
    assert before[new] == pytest.approx(after[new], rel=0.1)  # the same BM25, near enough
    assert next(iter(before)) == next(iter(after)) == new


def test_a_deleted_dataset_answers_nothing(setup) -> None:
    index, dataset = setup
    with index.db.write() as conn:
        document = insert_document(conn, dataset)
    write(index, dataset, document, 1, ["the lynx hunts in snow", *texts(4, 30)])
    kept(index)
    with index.db.write() as tx:
        index.delete_dataset(tx, dataset)
    assert found(index, dataset, "lynx snow") == []
    kept(index)
    view = index.keywords._view
    assert view is not None
    assert view.searcher.num_docs == 0


def test_a_filter_that_admits_few_chunks_still_fills_top_k(setup) -> None:
    index, dataset = setup
    with index.db.write() as conn:
        documents = [insert_document(conn, dataset, meta={"n": n}) for n in range(8)]
    for n, document in enumerate(documents):
        write(index, dataset, document, 1, [f"marmot {body}" for body in texts(10 + n, 60)])
    kept(index)
    where = SearchFilter(metadata=(("n", (5,)),))
    hits = index.search_keyword(dataset, "marmot w7", 10, where)
    assert len(hits) == 10
    assert {hit.document_id for hit in hits} == {documents[5]}


def test_stale_chunks_at_the_head_of_the_index_are_passed_over(setup) -> None:
    """The keyword index is asked for a list just longer than k; when the chunks at its head
    no longer answer (a newer generation replaced them, the index has not applied it yet), it
    is asked again for a wider one, and FTS5 (emptied here) is not needed."""
    index, dataset = setup
    with index.db.write() as conn:
        replaced, kept_document = insert_document(conn, dataset), insert_document(conn, dataset)
    write(index, dataset, replaced, 1, [f"heron heron heron {body}" for body in texts(30, 40)])
    lower = [f"heron {body}" for body in texts(31, 3)]
    write(index, dataset, kept_document, 1, lower)
    kept(index)
    index.keywords.close()  # the index keeps generation 1's forty chunks at its head
    without_fts(index)
    write(index, dataset, replaced, 2, texts(32, 5))
    assert sorted(found(index, dataset, "heron", k=3)) == sorted(lower)


def test_a_restart_opens_the_committed_index_and_replays_the_log(setup) -> None:
    index, dataset = setup
    with index.db.write() as conn:
        document, later = insert_document(conn, dataset), insert_document(conn, dataset)
    write(index, dataset, document, 1, ["the ibis wades", *texts(5, 80)])
    kept(index)
    index.close()
    # written while no process keeps the keyword index: the log holds it
    writer = SqliteIndex(index.db, EMBED.dimension, keyword_min_chunks=0)
    write(writer, dataset, later, 1, ["the ibis sleeps standing"])
    again = make(index.db)  # a state row exists: the index is opened and followed at once
    try:
        assert again.keywords.caught_up(timeout=60)
        assert again.keywords.builds == 0  # opened, not rebuilt
        without_fts(again)
        assert set(found(again, dataset, "ibis")) == {"the ibis wades", "the ibis sleeps standing"}
    finally:
        again.close()


@pytest.mark.parametrize("damage", ["meta", "folder"])
def test_a_damaged_or_missing_index_is_rebuilt(setup, damage: str) -> None:
    index, dataset = setup
    with index.db.write() as conn:
        document = insert_document(conn, dataset)
    write(index, dataset, document, 1, ["the civet climbs", *texts(6, 40)])
    kept(index)
    index.close()
    folder = side_folder(index.db, "keywords")
    assert folder is not None
    if damage == "meta":
        (folder / "meta.json").write_text("{ torn")
    else:
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()
    again = make(index.db)
    try:
        assert again.keywords.caught_up(timeout=60)
        assert again.keywords.builds == 1
        without_fts(again)
        assert found(again, dataset, "civet") == ["the civet climbs"]
    finally:
        again.close()


def test_an_index_whose_build_never_committed_is_built_again(setup) -> None:
    """A process killed while it built the index leaves a state row written before the build
    and an index folder without a commit: the next start builds it again instead of opening
    an empty index that would answer as if it held every chunk."""
    index, dataset = setup
    with index.db.write() as conn:
        document = insert_document(conn, dataset)
    write(index, dataset, document, 1, ["the serval leaps", *texts(22, 40)])
    index.close()
    index.keyword_log.start_build()  # what a build does first …
    index.keywords._fresh()  # … and its folder, before anything is committed
    again = make(index.db)
    try:
        kept(again)
        assert again.keywords.builds == 1
        without_fts(again)
        assert found(again, dataset, "serval") == ["the serval leaps"]
    finally:
        again.close()


def test_an_index_of_older_terms_is_rebuilt(setup, monkeypatch: pytest.MonkeyPatch) -> None:
    index, dataset = setup
    with index.db.write() as conn:
        document = insert_document(conn, dataset)
    write(index, dataset, document, 1, ["the genet prowls", *texts(21, 30)])
    kept(index)
    index.close()
    monkeypatch.setattr(keywords, "TOKENS_VERSION", keywords.TOKENS_VERSION + 1)
    again = make(index.db)
    try:
        with again.db.read() as conn:
            tables = {
                row[0]
                for row in conn.exec_driver_sql(
                    "SELECT name FROM sqlite_master WHERE name LIKE '%keywords%'"
                )
            }
        assert tables == {again.keyword_log.state}  # the old state is dropped
        kept(again)
        assert again.keywords.builds == 1
        without_fts(again)
        assert found(again, dataset, "genet") == ["the genet prowls"]
    finally:
        again.close()


def test_pruning_keeps_the_log_rows_the_keyword_index_needs(setup) -> None:
    index, dataset = setup
    with index.db.write() as conn:
        document, later = insert_document(conn, dataset), insert_document(conn, dataset)
    write(index, dataset, document, 1, texts(7, 20))
    kept(index)
    applied = index.keywords._view.applied[1]  # type: ignore[union-attr]
    index.keywords.close()
    write(index, dataset, later, 1, texts(8, 20))  # not applied: the thread is stopped
    index.graphs._prune()
    with index.db.read() as conn:
        left = conn.exec_driver_sql(f"SELECT min(id), count(*) FROM {index.log}").one()
    assert left[0] > applied  # what the index holds is pruned …
    assert left[1] == 20  # … what it does not is kept


def log_left(index: SqliteIndex, within_s: float) -> int:
    """The log's rows once it is empty, or when `within_s` have passed."""
    deadline = time.monotonic() + within_s
    while True:
        with index.db.read() as conn:
            left = int(conn.exec_driver_sql(f"SELECT count(*) FROM {index.log}").scalar() or 0)
        if left == 0 or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


@pytest.mark.parametrize("held_s", [0.0, 1.0])
def test_the_log_is_pruned_when_no_graph_and_no_keyword_index_is_kept(
    sqlite_db, monkeypatch: pytest.MonkeyPatch, held_s: float
) -> None:
    """With `held_s`, the writing transaction stays open that long after `logged` started the
    prune: the prune must see its rows all the same (it once read before the commit, found
    nothing, and left the rows for a minute: CI saw 30 rows left)."""
    monkeypatch.setattr(graphs, "PRUNE_AFTER_ROWS", 25)  # (10,000 by default)
    index = SqliteIndex(sqlite_db, EMBED.dimension, graph_min_chunks=10**9)
    index.ensure()
    with sqlite_db.write() as conn:
        dataset = insert_dataset(conn)
        document = insert_document(conn, dataset)
    try:
        with sqlite_db.write() as tx:  # 30 log rows: a prune starts
            index.upsert(tx, chunks(dataset, document, 1, texts(9, 30)))
            index.activate(tx, document, 1)
            time.sleep(held_s)
        assert log_left(index, within_s=30) == 0
    finally:
        index.close()


def test_terms_are_what_fts5_makes_of_the_text() -> None:
    assert tokens("Café au LAIT, e-mail_address") == ["cafe", "au", "lait", "e", "mail", "address"]
    assert tokens("数据库的事务") == ["数据", "据库", "数据库", "的", "事务"]
    assert tokens("がぎぐ ファイル") == ["がぎ", "ぎぐ", "ファ", "ァイ", "イル"]  # kana keep marks
    assert tokens("한국어 검색") == ["한국", "국어", "검색"]


def test_the_side_folders_sit_beside_the_database_file(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/kb.db")
    try:
        assert side_folder(db, "keywords") == tmp_path / "kb.db.keywords"
    finally:
        db.dispose()


def test_the_keyword_index_answers_from_the_size_the_settings_give(
    sqlite_db: Database, tmp_path: Path
) -> None:
    """KOPS_KEYWORD_INDEX_MIN_CHUNKS: 0 puts a table of three chunks on the keyword index (what
    `kops eval` runs to judge its ranking); the default leaves such a table to FTS5."""
    assert Settings(data_dir=tmp_path).keyword_index_min_chunks == keywords.KEYWORD_MIN_CHUNKS
    small = make_index(sqlite_db, EMBED.dimension, Settings(data_dir=tmp_path))
    index = make_index(
        sqlite_db, EMBED.dimension, Settings(data_dir=tmp_path, keyword_index_min_chunks=0)
    )
    assert isinstance(index, SqliteIndex)
    assert isinstance(small, SqliteIndex)
    index.ensure()
    try:
        with sqlite_db.write() as conn:
            dataset = insert_dataset(conn)
            document = insert_document(conn, dataset)
        write(index, dataset, document, 1, ["a heron waits", "an okapi grazes", "w1 w2"])
        # the first search of each: FTS5 answers both, and only the index set to 0 starts
        # building its keyword index
        assert found(index, dataset, "okapi") == found(small, dataset, "okapi")
        assert index.keywords.caught_up(timeout=20)
        assert not small.keywords.ready
        without_fts(index)
        assert found(index, dataset, "okapi") == ["an okapi grazes"]
        assert found(small, dataset, "okapi") == []  # FTS5, emptied above
    finally:
        index.close()
        small.close()
