"""A PDF read by page range (one part of a split document) and its page count, inline and in the
parser's child process: the same pages, the same chunks, the same errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from knowledgeops.errors import JobError
from knowledgeops.ingest.chunker import HFTokenizer
from knowledgeops.ingest.embedders.local import load_tokenizer
from knowledgeops.ingest.parsers.base import ContentType
from knowledgeops.ingest.parsers.isolated import (
    InlineParsing,
    IsolatedParsing,
)
from knowledgeops.ingest.parsers.limits import DEFAULT_LIMITS
from knowledgeops.ingest.parsers.pdf import PdfParser
from knowledgeops.ingest.parsers.registry import page_count, parse
from knowledgeops.ingest.parsers.wire import DraftGuard, drafts_of
from knowledgeops.ingest.prepare import ChunkSpec, ChunkStream
from tests.fixtures.documents import make_pdf, make_scanned_pdf, make_text

SPEC = ChunkSpec(size=48, overlap=8, max_text_chars=10**7, max_chunks=10**5)


def pages_pdf(tmp_path: Path, count: int = 9, blank: tuple[int, ...] = ()) -> Path:
    texts = [
        "" if n in blank else f"Page {n} tells of harbour number {n} and its tides." * 3
        for n in range(1, count + 1)
    ]
    return make_pdf(tmp_path / "pages.pdf", texts)


def test_a_page_range_reads_those_pages_only(tmp_path: Path) -> None:
    pdf = pages_pdf(tmp_path)
    assert PdfParser().page_count(pdf) == 9
    assert [b.page for b in parse(pdf, ContentType.PDF, (4, 6))] == [4, 5, 6]
    assert [b.page for b in parse(pdf, ContentType.PDF, (9, 9))] == [9]
    whole = {b.page: b.text for b in parse(pdf, ContentType.PDF)}
    assert {b.page: b.text for b in parse(pdf, ContentType.PDF, (2, 3))} == {
        2: whole[2],
        3: whole[3],
    }


def test_a_range_without_text_is_empty_but_a_whole_pdf_without_text_fails(
    tmp_path: Path,
) -> None:
    pdf = pages_pdf(tmp_path, blank=(4, 5))
    assert list(parse(pdf, ContentType.PDF, (4, 5))) == []
    scanned = make_scanned_pdf(tmp_path / "scan.pdf", pages=3)
    assert list(parse(scanned, ContentType.PDF, (1, 3))) == []
    with pytest.raises(JobError) as caught:
        list(parse(scanned, ContentType.PDF))
    assert caught.value.code == "no_text_layer"


def test_a_range_outside_the_pdf_is_refused(tmp_path: Path) -> None:
    pdf = pages_pdf(tmp_path, count=3)
    for wrong in ((0, 2), (2, 4), (3, 2)):
        with pytest.raises(JobError) as caught:
            list(parse(pdf, ContentType.PDF, wrong))
        assert caught.value.code == "corrupt_file"
        assert "3-page PDF" in caught.value.message


def test_page_count_checks_the_pdf_like_parsing_does(tmp_path: Path) -> None:
    secret = make_pdf(tmp_path / "secret.pdf", ["classified"], password="s3cret")
    with pytest.raises(JobError) as caught:
        page_count(secret, ContentType.PDF)
    assert caught.value.code == "pdf_encrypted"
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(b"%PDF-1.7\nnot really\n")
    with pytest.raises(JobError) as caught:
        page_count(broken, ContentType.PDF)
    assert caught.value.code == "corrupt_file"
    text = make_text(tmp_path / "notes.txt", "plain words")
    assert page_count(text, ContentType.TEXT) is None
    with pytest.raises(JobError) as caught:
        list(parse(text, ContentType.TEXT, (1, 1)))
    assert caught.value.code == "unsupported_type"


def test_the_child_counts_pages_and_chunks_a_range_as_inline_does(tmp_path: Path) -> None:
    pdf = pages_pdf(tmp_path, count=12, blank=(7,))
    tokenizer = HFTokenizer(load_tokenizer())
    isolated, inline = IsolatedParsing(DEFAULT_LIMITS), InlineParsing(DEFAULT_LIMITS)
    try:
        assert isolated.page_count(pdf, ContentType.PDF) == inline.page_count(pdf, ContentType.PDF)
        assert isolated.page_count(pdf, ContentType.PDF) == 12
        text = make_text(tmp_path / "notes.txt", "plain words")
        assert isolated.page_count(text, ContentType.TEXT) is None
        secret = make_pdf(tmp_path / "secret.pdf", ["classified"], password="s3cret")
        with pytest.raises(JobError) as caught:
            isolated.page_count(secret, ContentType.PDF)
        assert caught.value.code == "pdf_encrypted"
        for first, last in ((1, 4), (5, 8), (9, 12), (7, 7)):
            spec = dataclasses.replace(SPEC, first_page=first, last_page=last)
            expected = _all(inline.chunks(pdf, ContentType.PDF, spec, tokenizer))
            got = _all(isolated.chunks(pdf, ContentType.PDF, spec, tokenizer))
            assert got == expected
            drafts, _ = got
            assert all(first <= d.page_start <= d.page_end <= last for d in drafts)
            assert [d.ordinal for d in drafts] == list(range(len(drafts)))
        assert _all(isolated.chunks(pdf, ContentType.PDF, _range(7, 7), tokenizer)) == ([], None)
    finally:
        isolated.close()


def test_the_worker_refuses_drafts_from_outside_the_range_it_asked_for() -> None:
    guard = DraftGuard(_range(5, 8))
    guard.check(next(drafts_of({"drafts": [[0, "in range", 5, 5, 6, None]]})))
    for pages in ((4, 5), (8, 9)):
        with pytest.raises(JobError) as caught:
            guard.check(next(drafts_of({"drafts": [[1, "outside", 5, *pages, None]]})))
        assert caught.value.code == "parser_crashed"


def _range(first: int, last: int) -> ChunkSpec:
    return dataclasses.replace(SPEC, first_page=first, last_page=last)


def _all(gen: Any) -> tuple[list[Any], Any]:
    stream = ChunkStream(gen)
    return list(stream), stream.pages
