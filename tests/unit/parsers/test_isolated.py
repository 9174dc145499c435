"""Parsing in a child process: the same blocks as parsing inline; a parse that takes too long,
runs out of memory, or whose process dies is stopped and classified, and the next parse works."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from knowledgeops.errors import ErrorCategory, JobError
from knowledgeops.ingest.chunker import ChunkDraft, HFTokenizer
from knowledgeops.ingest.embedders.local import load_tokenizer
from knowledgeops.ingest.parsers.base import ContentType
from knowledgeops.ingest.parsers.isolated import (
    InlineParsing,
    IsolatedParsing,
    ParserProcess,
)
from knowledgeops.ingest.parsers.limits import DEFAULT_LIMITS, ParseLimits
from knowledgeops.ingest.parsers.wire import DraftGuard, drafts_of
from knowledgeops.ingest.prepare import ChunkSpec, ChunkStream
from tests.conftest import wait_for
from tests.fixtures.documents import (
    make_corrupt_pdf,
    make_docx,
    make_html,
    make_markdown,
    make_pdf,
    make_text,
)


@pytest.fixture
def process() -> ParserProcess:
    parser = ParserProcess()
    yield parser  # type: ignore[misc]
    parser.stop()


@pytest.fixture(scope="module")
def big_pdf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pages = [f"Page {n} about lighthouses, tides and harbours. " * 40 for n in range(400)]
    return make_pdf(tmp_path_factory.mktemp("pdf") / "big.pdf", pages)


def _samples(tmp_path: Path) -> list[tuple[Path, str]]:
    return [
        (
            make_text(tmp_path / "a.txt", "First paragraph.\n\nSecond one, café.\n" * 50),
            "text/plain",
        ),
        (make_markdown(tmp_path / "b.md"), ContentType.MARKDOWN),
        (make_html(tmp_path / "c.html"), ContentType.HTML),
        (make_pdf(tmp_path / "d.pdf", ["One page.", "Two pages."]), ContentType.PDF),
        (make_docx(tmp_path / "e.docx"), ContentType.DOCX),
    ]


def test_the_same_blocks_as_parsing_inline(tmp_path: Path) -> None:
    isolated, inline = IsolatedParsing(DEFAULT_LIMITS), InlineParsing(DEFAULT_LIMITS)
    try:
        for path, content_type in _samples(tmp_path):
            expected = list(inline.parse(path, content_type))
            assert expected, path
            assert list(isolated.parse(path, content_type)) == expected, path
    finally:
        isolated.close()


def _drafts_and_pages(gen: Generator[ChunkDraft, None, int | None]) -> tuple[list[Any], Any]:
    stream = ChunkStream(gen)
    return list(stream), stream.pages


def test_the_child_cleans_and_chunks_exactly_as_the_worker_would(
    tmp_path: Path, big_pdf: Path
) -> None:
    """Chunking moved into the parser's process: the same drafts (text, ordinals, tokens, pages,
    sections) and the same page count as cleaning and chunking inline, for every format."""
    tokenizer = HFTokenizer(load_tokenizer())
    spec = ChunkSpec(size=48, overlap=8, max_text_chars=10**7, max_chunks=10**5)
    isolated, inline = IsolatedParsing(DEFAULT_LIMITS), InlineParsing(DEFAULT_LIMITS)
    try:
        for path, content_type in [*_samples(tmp_path), (big_pdf, ContentType.PDF)]:
            expected = _drafts_and_pages(inline.chunks(path, content_type, spec, tokenizer))
            assert expected[0], path
            got = _drafts_and_pages(isolated.chunks(path, content_type, spec, tokenizer))
            assert got == expected, path
        assert expected[1] == 400  # the big PDF's last page
        assert len(expected[0]) > 100
    finally:
        isolated.close()


def test_limits_met_while_chunking_in_the_child_keep_their_message(tmp_path: Path) -> None:
    tokenizer = HFTokenizer(load_tokenizer())
    path = make_text(tmp_path / "long.txt", "Words and more words here.\n\n" * 400)
    isolated = IsolatedParsing(DEFAULT_LIMITS)
    try:
        for spec, code in [
            (ChunkSpec(size=32, overlap=4, max_text_chars=1000, max_chunks=10**5), "text_too_long"),
            (ChunkSpec(size=32, overlap=4, max_text_chars=10**7, max_chunks=5), "too_many_chunks"),
        ]:
            with pytest.raises(JobError) as caught:
                list(isolated.chunks(path, "text/plain", spec, tokenizer))
            assert caught.value.code == code
            assert caught.value.category is ErrorCategory.USER_ACTION_REQUIRED
        # and the same child serves the next document
        ok = ChunkSpec(size=32, overlap=4, max_text_chars=10**7, max_chunks=10**5)
        assert list(isolated.chunks(path, "text/plain", ok, tokenizer))
    finally:
        isolated.close()


def test_one_child_serves_many_documents(process: ParserProcess, tmp_path: Path) -> None:
    for n in range(5):
        path = make_text(tmp_path / f"{n}.txt", f"document {n}")
        assert [b.text for b in process.parse(path, "text/plain", DEFAULT_LIMITS)] == [
            f"document {n}"
        ]
    first = process.pid
    process.parse(path, "text/plain", DEFAULT_LIMITS)  # lazy: nothing is sent yet
    assert process.pid == first


def test_parser_errors_keep_their_category(process: ParserProcess, tmp_path: Path) -> None:
    with pytest.raises(JobError) as caught:
        list(process.parse(make_corrupt_pdf(tmp_path / "bad.pdf"), ContentType.PDF, DEFAULT_LIMITS))
    assert caught.value.code == "corrupt_file"
    assert caught.value.category is ErrorCategory.PERMANENT
    # the child is still the same one: an error is an answer, not a crash
    pid = process.pid
    assert list(process.parse(make_text(tmp_path / "ok.txt", "ok"), "text/plain", DEFAULT_LIMITS))
    assert process.pid == pid


def test_a_slow_parse_is_stopped_and_the_next_one_works(
    process: ParserProcess, big_pdf: Path, tmp_path: Path
) -> None:
    limits = ParseLimits(parse_timeout_s=0.05)
    with pytest.raises(JobError) as caught:
        list(process.parse(big_pdf, ContentType.PDF, limits))
    assert caught.value.code == "parse_timeout"
    assert caught.value.category is ErrorCategory.USER_ACTION_REQUIRED
    assert "KOPS_PARSE_TIMEOUT_S" in caught.value.message
    assert process.pid is None  # killed
    blocks = list(process.parse(big_pdf, ContentType.PDF, DEFAULT_LIMITS))
    assert len(blocks) == 400


def test_a_killed_parser_is_a_classified_failure_and_the_next_parse_works(
    process: ParserProcess, big_pdf: Path, tmp_path: Path
) -> None:
    blocks = process.parse(big_pdf, ContentType.PDF, DEFAULT_LIMITS)
    first = next(blocks)  # the child is running now
    assert first.page == 1
    pid = process.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # as the OOM killer, or a segfault in a C library
    with pytest.raises(JobError) as caught:
        list(blocks)
    assert caught.value.code == "parser_crashed"
    assert "SIGKILL" in caught.value.message
    assert list(
        process.parse(make_text(tmp_path / "next.txt", "next"), "text/plain", DEFAULT_LIMITS)
    )
    assert process.pid != pid


def test_running_out_of_memory_is_stopped(process: ParserProcess, tmp_path: Path) -> None:
    """A child limited to a little more address space than it starts with, given a Markdown
    file it must read whole: it stops with a classified error, and a fresh child works."""
    list(
        process.parse(
            make_text(tmp_path / "warm.md", "# warm"), ContentType.MARKDOWN, DEFAULT_LIMITS
        )
    )
    assert process.pid is not None
    size_kb = _vm_size_kb(process.pid)
    process.stop()
    tight = ParseLimits(parse_memory_mb=size_kb // 1024 + 48)
    huge = tmp_path / "huge.md"
    huge.write_text(("word " * 200 + "\n\n") * 60_000)  # ~60 MB of text, parsed whole
    with pytest.raises(JobError) as caught:
        list(process.parse(huge, ContentType.MARKDOWN, tight))
    assert caught.value.code in {"parse_memory", "parser_crashed"}
    if caught.value.code == "parse_memory":
        assert caught.value.category is ErrorCategory.USER_ACTION_REQUIRED
        assert "KOPS_PARSE_MEMORY_MB" in caught.value.message
    small = make_text(tmp_path / "small.md", "# fine")
    assert list(process.parse(small, ContentType.MARKDOWN, DEFAULT_LIMITS))


def test_a_consumer_that_stops_early_leaves_no_process_behind(
    process: ParserProcess, big_pdf: Path
) -> None:
    blocks = process.parse(big_pdf, ContentType.PDF, DEFAULT_LIMITS)
    next(blocks)
    pid = process.pid
    assert pid is not None
    blocks.close()  # e.g. the document passed its chunk limit
    assert process.pid is None
    assert wait_for(lambda: not _alive(pid), timeout=5, what="the child to be gone")


def test_each_thread_gets_its_own_child(tmp_path: Path) -> None:
    parsing = IsolatedParsing(DEFAULT_LIMITS)
    pids: list[int | None] = []
    path = make_text(tmp_path / "t.txt", "threads")

    def work() -> None:
        assert list(parsing.parse(path, "text/plain"))
        pids.append(parsing._mine().pid)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert len(set(pids)) == 3
        assert None not in pids
    finally:
        parsing.close()
    assert wait_for(lambda: not any(_alive(p) for p in pids if p), timeout=5, what="all gone")


def _vm_size_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1])
    raise AssertionError("no VmSize")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = (
        Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}").exists() else "X"
    )
    return state not in {"Z", "X"}


def test_an_iterator_dropped_mid_document_costs_a_fresh_child_not_a_mixup(
    process: ParserProcess, big_pdf: Path, tmp_path: Path
) -> None:
    """Blocks of an unfinished request are never read as the next document's."""
    first = process.parse(big_pdf, ContentType.PDF, DEFAULT_LIMITS)
    next(first)  # started, then abandoned without close()
    pid = process.pid
    small = make_text(tmp_path / "small.txt", "only this")
    assert [b.text for b in process.parse(small, "text/plain", DEFAULT_LIMITS)] == ["only this"]
    assert process.pid != pid


def test_the_child_sees_none_of_the_workers_secrets(
    process: ParserProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KOPS_DATABASE_URL", "postgresql://u:hunter2@db/kops")
    monkeypatch.setenv("KOPS_OPENAI_API_KEY", "sk-secret")
    list(process.parse(make_text(tmp_path / "a.txt", "x"), "text/plain", DEFAULT_LIMITS))
    assert process.pid is not None
    environ = Path(f"/proc/{process.pid}/environ").read_bytes()
    assert b"hunter2" not in environ
    assert b"sk-secret" not in environ
    assert b"KOPS_" not in environ


def _draft(ordinal: int, tokens: int = 10, pages: tuple[Any, Any] = (1, 1)) -> list[Any]:
    return [ordinal, f"chunk {ordinal}", tokens, pages[0], pages[1], None]


@pytest.mark.parametrize(
    "items",
    [
        None,
        [[0, "text", 3]],  # too short
        [[True, "text", 3, 1, 1, None]],  # a bool is not an ordinal
        [[0, b"text", 3, 1, 1, None]],
        [[0, "text", 3.0, 1, 1, None]],
        [[0, "text", 3, 0, 1, None]],  # pages count from 1
        [[0, "text", 3, 1, 1, 7]],
    ],
)
def test_malformed_drafts_from_a_child_are_refused(items: Any) -> None:
    with pytest.raises(JobError) as caught:
        list(drafts_of({"kind": "drafts", "drafts": items}))
    assert caught.value.code == "parser_crashed"


def test_the_worker_checks_what_a_child_sends_whatever_the_child_did() -> None:
    spec = ChunkSpec(size=20, overlap=4, max_text_chars=50, max_chunks=3)

    def fed(*drafts: list[Any]) -> DraftGuard:
        guard = DraftGuard(spec)
        for item in drafts:
            guard.check(next(drafts_of({"drafts": [item]})))
        return guard

    for bad in ([_draft(1)], [_draft(0), _draft(0)], [_draft(0, tokens=21)], [_draft(0, 0)]):
        with pytest.raises(JobError) as caught:
            fed(*bad)
        assert caught.value.code == "parser_crashed"
    with pytest.raises(JobError) as caught:
        fed(_draft(0, pages=(3, 2)))
    assert caught.value.code == "parser_crashed"
    with pytest.raises(JobError) as caught:  # more chunks than the limit, however it was sent
        fed(*[_draft(n) for n in range(4)])
    assert caught.value.code == "too_many_chunks"
    big = [0, "x" * 101, 10, None, None, None]
    with pytest.raises(JobError) as caught:  # more text than the limit allows (twice, overlap)
        fed(big)
    assert caught.value.code == "text_too_long"
    guard = fed(_draft(0, pages=(1, 2)), _draft(1, pages=(2, 5)))
    assert guard.pages(5) == 5
    assert guard.pages(None) is None
    for wrong in (4, True, "5"):
        with pytest.raises(JobError):
            guard.pages(wrong)


def test_a_parse_error_in_the_childs_parser_thread_keeps_its_code(tmp_path: Path) -> None:
    """The child parses ahead of its chunker in a thread of its own: an error there still
    reaches the worker classified, and the child goes on with the next document."""
    tokenizer = HFTokenizer(load_tokenizer())
    spec = ChunkSpec(size=48, overlap=8, max_text_chars=10**7, max_chunks=10**5)
    isolated = IsolatedParsing(DEFAULT_LIMITS)
    try:
        with pytest.raises(JobError) as caught:
            list(
                isolated.chunks(
                    make_corrupt_pdf(tmp_path / "bad.pdf"), ContentType.PDF, spec, tokenizer
                )
            )
        assert caught.value.code == "corrupt_file"
        assert caught.value.category is ErrorCategory.PERMANENT
        good = make_pdf(tmp_path / "good.pdf", ["A page about tides.", "Another about harbours."])
        drafts = list(isolated.chunks(good, ContentType.PDF, spec, tokenizer))
        assert [d.page_start for d in drafts] == [1]
        assert "harbours" in drafts[0].text
    finally:
        isolated.close()


def test_a_worker_can_start_its_parser_before_its_first_document(tmp_path: Path) -> None:
    isolated = IsolatedParsing(DEFAULT_LIMITS)
    try:
        isolated.prestart()
        started = isolated._mine().pid
        assert started is not None
        path = make_text(tmp_path / "a.txt", "the first document")
        assert [b.text for b in isolated.parse(path, "text/plain")] == ["the first document"]
        assert isolated._mine().pid == started  # the same process served it
    finally:
        isolated.close()
