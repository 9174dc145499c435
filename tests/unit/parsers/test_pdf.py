from __future__ import annotations

import threading
from collections.abc import Generator
from pathlib import Path

import pytest

from knowledgeops.errors import ErrorCategory, PermanentError, UserActionRequired
from knowledgeops.ingest.parsers.base import Block
from knowledgeops.ingest.parsers.pdf import PDFIUM_LOCK, PdfParser
from tests.fixtures.documents import (
    make_corrupt_pdf,
    make_pdf,
    make_random_bytes,
    make_scanned_pdf,
    make_truncated_pdf,
)


def parse_pdf(path: Path) -> list[Block]:
    return list(PdfParser().parse(path))


def lines(block: Block) -> list[str]:
    return [line.strip() for line in block.text.split("\n") if line.strip()]


def test_one_block_per_page_with_1_based_page_numbers(tmp_path: Path) -> None:
    pdf = make_pdf(
        tmp_path / "a.pdf",
        ["First page text.\nSecond line of page one.", "Page two says hello.", "Third page."],
    )
    blocks = parse_pdf(pdf)
    assert [b.page for b in blocks] == [1, 2, 3]
    assert lines(blocks[0]) == ["First page text.", "Second line of page one."]
    assert lines(blocks[1]) == ["Page two says hello."]
    assert lines(blocks[2]) == ["Third page."]
    assert all(b.section is None for b in blocks)  # no outline, no sections
    assert all("\r" not in b.text for b in blocks)


def test_empty_pages_are_skipped_and_numbers_kept(tmp_path: Path) -> None:
    blocks = parse_pdf(make_pdf(tmp_path / "a.pdf", ["one", "", "three"]))
    assert [(b.page, lines(b)) for b in blocks] == [(1, ["one"]), (3, ["three"])]


def test_sections_come_from_the_outline(tmp_path: Path) -> None:
    pdf = make_pdf(
        tmp_path / "a.pdf",
        ["cover", "intro text", "more intro", "install text", "linux text", "appendix"],
        outline=[
            ("Introduction", 2),
            ("Installation", 4),
            ("Linux", 5, 1),
            ("Appendix", 6),
        ],
    )
    sections = {b.page: b.section for b in parse_pdf(pdf)}
    assert sections == {
        1: None,  # before the first bookmark
        2: "Introduction",
        3: "Introduction",  # the last bookmark at or before the page
        4: "Installation",
        5: "Installation › Linux",
        6: "Appendix",
    }


def test_password_protected_pdf_needs_user_action(tmp_path: Path) -> None:
    pdf = make_pdf(tmp_path / "secret.pdf", ["classified"], password="s3cret")
    with pytest.raises(UserActionRequired) as caught:
        parse_pdf(pdf)
    error = caught.value
    assert error.code == "pdf_encrypted"
    assert error.category is ErrorCategory.USER_ACTION_REQUIRED
    assert "password" in error.message.lower()
    assert "upload it again" in error.message


def test_owner_password_only_pdf_is_readable(tmp_path: Path) -> None:
    pdf = make_pdf(tmp_path / "restricted.pdf", ["open to read"], password="")
    assert lines(parse_pdf(pdf)[0]) == ["open to read"]


def test_scanned_pdf_without_text_layer_is_permanent(tmp_path: Path) -> None:
    with pytest.raises(PermanentError) as caught:
        parse_pdf(make_scanned_pdf(tmp_path / "scan.pdf", pages=3))
    assert caught.value.code == "no_text_layer"
    assert "OCR" in caught.value.message


def test_no_text_error_comes_only_after_all_pages(tmp_path: Path) -> None:
    # Text on the last page only: the earlier empty pages must not fail the document.
    blocks = parse_pdf(make_pdf(tmp_path / "late.pdf", ["", "", "finally some text"]))
    assert [b.page for b in blocks] == [3]


@pytest.mark.parametrize("maker", ["garbage", "truncated", "random"])
def test_corrupt_files_are_permanent(tmp_path: Path, maker: str) -> None:
    path = tmp_path / "bad.pdf"
    if maker == "garbage":
        make_corrupt_pdf(path)
    elif maker == "truncated":
        make_truncated_pdf(path, make_pdf(tmp_path / "good.pdf", ["some text"] * 1))
    else:
        make_random_bytes(path)
    with pytest.raises(PermanentError) as caught:
        parse_pdf(path)
    assert caught.value.code == "corrupt_file"


def test_parsing_is_lazy_and_never_holds_the_pdfium_lock_between_pages(tmp_path: Path) -> None:
    pdf = make_pdf(tmp_path / "a.pdf", [f"page {i}" for i in range(1, 6)])
    blocks = PdfParser().parse(pdf)
    first = next(blocks)
    assert first.page == 1
    # While the consumer holds a page, other threads can use PDFium.
    assert PDFIUM_LOCK.acquire(blocking=False)
    PDFIUM_LOCK.release()
    assert isinstance(blocks, Generator)
    blocks.close()  # abandoning the iterator closes the document cleanly
    assert PDFIUM_LOCK.acquire(blocking=False)
    PDFIUM_LOCK.release()


def test_parallel_parsing_in_threads_is_correct(tmp_path: Path) -> None:
    paths = [
        make_pdf(tmp_path / f"t{n}.pdf", [f"doc {n} page {p}" for p in range(1, 21)])
        for n in range(4)
    ]
    results: dict[int, list[str]] = {}
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            results[n] = [lines(b)[0] for b in PdfParser().parse(paths[n])]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for n in range(4):
        assert results[n] == [f"doc {n} page {p}" for p in range(1, 21)]
