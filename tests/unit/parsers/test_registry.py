from __future__ import annotations

import zipfile
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from lxml import etree  # type: ignore[import-untyped, unused-ignore]

from knowledgeops.errors import PermanentError, TransientError, UserActionRequired
from knowledgeops.ingest.parsers.base import Block, ContentType
from knowledgeops.ingest.parsers.registry import parse, parser_for, translate_errors
from tests.fixtures.documents import (
    SAMPLE_MARKDOWN,
    make_docx,
    make_html,
    make_markdown,
    make_pdf,
    make_scanned_pdf,
    make_text,
)


@pytest.mark.parametrize("content_type", ContentType.ALL)
def test_every_content_type_has_its_parser(content_type: str) -> None:
    assert parser_for(content_type).content_type == content_type


def test_unknown_content_type_is_refused_at_once() -> None:
    with pytest.raises(PermanentError) as caught:
        parser_for("image/gif")
    assert caught.value.code == "unsupported_type"
    # parse() refuses when called, before anyone iterates.
    with pytest.raises(PermanentError) as caught:
        parse(Path("/nonexistent"), "application/zip")
    assert caught.value.code == "unsupported_type"


def test_parse_dispatches_every_format(tmp_path: Path) -> None:
    files = {
        ContentType.PDF: make_pdf(tmp_path / "a.pdf", ["pdf words"]),
        ContentType.DOCX: make_docx(tmp_path / "a.docx"),
        ContentType.HTML: make_html(tmp_path / "a.html"),
        ContentType.MARKDOWN: make_markdown(tmp_path / "a.md", SAMPLE_MARKDOWN),
        ContentType.TEXT: make_text(tmp_path / "a.txt", "plain words"),
    }
    expected = {
        ContentType.PDF: "pdf words",
        ContentType.DOCX: "Revenue grew strongly.",
        ContentType.HTML: "Welcome to the guide.",
        ContentType.MARKDOWN: "Run setup.exe as administrator.",
        ContentType.TEXT: "plain words",
    }
    for content_type, path in files.items():
        text = "\n".join(b.text for b in parse(path, content_type))
        assert expected[content_type] in text, content_type


def test_library_errors_on_a_real_file_become_corrupt_file(tmp_path: Path) -> None:
    # A DOCX whose document.xml is well-formed but has no <w:body>: python-docx opens it and
    # the walk then fails inside the library's object model.
    source = make_docx(tmp_path / "good.docx")
    broken = tmp_path / "nobody.docx"
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(broken, "w") as archive:
        for item in original.infolist():
            data = original.read(item.filename)
            if item.filename == "word/document.xml":
                data = (
                    b'<?xml version="1.0"?><w:document xmlns:w="http://schemas.openxmlformats'
                    b'.org/wordprocessingml/2006/main"></w:document>'
                )
            archive.writestr(item, data)
    with pytest.raises(PermanentError) as caught:
        list(parse(broken, ContentType.DOCX))
    assert caught.value.code == "corrupt_file"
    assert caught.value.message.startswith("The file could not be read as a Word document: ")
    assert caught.value.__cause__ is not None


def test_job_errors_from_parsers_pass_through_unchanged(tmp_path: Path) -> None:
    with pytest.raises(PermanentError) as caught:
        list(parse(make_scanned_pdf(tmp_path / "s.pdf"), ContentType.PDF))
    assert caught.value.code == "no_text_layer"
    with pytest.raises(UserActionRequired) as needs_user:
        list(parse(make_pdf(tmp_path / "e.pdf", ["x"], password="pw"), ContentType.PDF))
    assert needs_user.value.code == "pdf_encrypted"


def failing_after_one(exc: BaseException) -> Iterator[Block]:
    yield Block(text="first")
    raise exc


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("bad value"),
        KeyError("word/document.xml"),
        zipfile.BadZipFile("File is not a zip file"),
        etree.XMLSyntaxError("mismatched tag", None, 1, 1, "doc.xml"),
        RuntimeError("x" * 1000),
    ],
)
def test_unexpected_exceptions_become_corrupt_file_after_earlier_blocks(
    exc: BaseException,
) -> None:
    blocks = translate_errors(failing_after_one(exc), "a PDF")
    assert next(blocks) == Block(text="first")
    with pytest.raises(PermanentError) as caught:
        next(blocks)
    assert caught.value.code == "corrupt_file"
    assert caught.value.message.startswith("The file could not be read as a PDF: ")
    assert len(caught.value.message) < 300
    assert caught.value.__cause__ is exc


@pytest.mark.parametrize(
    "exc",
    [
        TransientError("try later"),
        UserActionRequired("do something", code="x"),
        MemoryError(),
        KeyboardInterrupt(),
        FileNotFoundError("blob missing"),
    ],
)
def test_job_errors_memory_interrupts_and_os_errors_are_not_swallowed(
    exc: BaseException,
) -> None:
    blocks = translate_errors(failing_after_one(exc), "text")
    next(blocks)
    with pytest.raises(type(exc)) as caught:
        next(blocks)
    assert caught.value is exc


def test_closing_the_wrapper_closes_the_parser() -> None:
    closed: list[bool] = []

    def parser() -> Iterator[Block]:
        try:
            yield Block(text="a")
            yield Block(text="b")
        finally:
            closed.append(True)

    blocks = translate_errors(parser(), "text")
    assert next(blocks).text == "a"
    assert isinstance(blocks, Generator)
    blocks.close()
    assert closed == [True]
