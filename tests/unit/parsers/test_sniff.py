from __future__ import annotations

import codecs
import gzip
import io
import zipfile
from pathlib import Path

import pytest

from knowledgeops.ingest.parsers.base import ContentType
from knowledgeops.ingest.parsers.sniff import SNIFF_BYTES, describe_unsupported, read_tail, sniff
from tests.fixtures.documents import (
    CHINESE_TEXT,
    LATIN1_TEXT,
    make_docx,
    make_gif,
    make_html,
    make_ole2,
    make_pdf,
    make_png,
    make_random_bytes,
)
from tests.fixtures.office import make_epub, make_pptx, make_xlsx


def head(path: Path) -> bytes:
    with path.open("rb") as fh:
        return fh.read(SNIFF_BYTES)


def zip_bytes(names: list[str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in names:
            archive.writestr(name, "<x/>")
    return buffer.getvalue()


# --- content wins for PDF, DOCX and binary ---------------------------------------------------


@pytest.mark.parametrize("name", ["report.pdf", "report.txt", "report", "report.docx"])
def test_pdf_is_recognised_by_its_magic_whatever_the_name(tmp_path: Path, name: str) -> None:
    pdf = make_pdf(tmp_path / "x.pdf", ["hello"])
    assert sniff(head(pdf), name) == ContentType.PDF


def test_pdf_magic_after_up_to_1_kib_of_junk_is_still_a_pdf(tmp_path: Path) -> None:
    pdf = make_pdf(tmp_path / "x.pdf", ["hello"]).read_bytes()
    assert sniff(b"\r\n" * 400 + pdf[:4000], "scan.pdf") == ContentType.PDF
    # The magic buried deeper than 1 KiB in text is just text that mentions it.
    assert sniff(b"x" * 2000 + b"%PDF-1.4", "notes.txt") == ContentType.TEXT


def test_docx_is_recognised_even_when_misnamed(tmp_path: Path) -> None:
    docx = make_docx(tmp_path / "x.docx")
    assert sniff(head(docx), "letter.docx") == ContentType.DOCX
    assert sniff(head(docx), "letter.txt") == ContentType.DOCX
    assert sniff(head(docx), "letter.zip") == ContentType.DOCX


def test_a_zip_named_docx_goes_to_the_docx_parser_which_checks_it_fully() -> None:
    assert sniff(zip_bytes(["data.csv"]), "fake.docx") == ContentType.DOCX


def test_other_zip_packages_are_refused() -> None:
    plain = zip_bytes(["a.txt", "b.txt"])
    assert sniff(plain, "archive.zip") is None
    assert describe_unsupported(plain, "archive.zip") == "a ZIP archive"


def test_office_packages_and_books_are_told_apart_by_their_parts(tmp_path: Path) -> None:
    pptx = make_pptx(tmp_path / "deck.pptx")
    xlsx = make_xlsx(tmp_path / "book.xlsx")
    epub = make_epub(tmp_path / "novel.epub")
    for path, kind in (
        (pptx, ContentType.PPTX),
        (xlsx, ContentType.XLSX),
        (epub, ContentType.EPUB),
    ):
        # whatever the name, and from the central directory when the first bytes do not say
        assert sniff(head(path), "upload.bin", None, read_tail(path)) == kind
        assert sniff(head(path)[:30], "upload", None, read_tail(path)) == kind
    assert (
        sniff(zip_bytes(["[Content_Types].xml", "ppt/presentation.xml"]), "x") == ContentType.PPTX
    )
    assert sniff(zip_bytes(["[Content_Types].xml", "xl/workbook.xml"]), "x") == ContentType.XLSX
    # a package whose parts do not say goes by its name to the parser, which checks it fully
    unknown = zip_bytes(["data.bin"])
    assert sniff(unknown, "deck.pptx") == ContentType.PPTX
    assert sniff(unknown, "book.xlsm") == ContentType.XLSX
    assert sniff(unknown, "novel.epub") == ContentType.EPUB


def test_mail_is_a_block_of_mail_headers_and_an_mbox_starts_with_from() -> None:
    message = b"Received: by mx\r\nFrom: a@b.org\r\nTo: c@d.org\r\nSubject: Hi\r\n\r\nBody\r\n"
    assert sniff(message, "message") == ContentType.EMAIL
    assert sniff(message, "message.eml") == ContentType.EMAIL
    folded = b"Subject: a long\n subject line\nFrom: a@b.org\nDate: Mon\n\nBody"
    assert sniff(folded, "x") == ContentType.EMAIL
    assert sniff(b"From a@b.org Mon Jan  1 00:00:00 2024\nFrom: a@b.org\n\nHi\n", "x") == (
        ContentType.MBOX
    )
    assert sniff(message, "box.mbox") == ContentType.MBOX
    # a name that says e-mail lets one known field do; without one it takes three
    assert sniff(b"Subject: Hi\n\nBody", "note.eml") == ContentType.EMAIL
    assert sniff(b"Subject: Hi\nDate: Mon\n\nBody", "note") == ContentType.TEXT
    # front matter of a post, text that starts with a colon phrase: not mail
    assert sniff(b"Title: Post\nDate: 2020\nFrom: me\n\n# Hello", "post.md") == (
        ContentType.MARKDOWN
    )
    assert sniff(b"Note: this is text\nand more of it\n", "x") == ContentType.TEXT
    assert sniff(message, "message.txt") == ContentType.TEXT


def test_csv_is_decided_by_extension_or_declared_type() -> None:
    table = b"name,city\nAda,Paris\n"
    assert sniff(table, "t.csv") == ContentType.CSV
    assert sniff(table, "t.tsv") == ContentType.CSV
    assert sniff(table, "t", "text/csv; charset=utf-8") == ContentType.CSV
    assert sniff(table, "t") == ContentType.TEXT
    assert sniff(b"\x00\x01\x02binary" * 50, "t.csv") is None


def test_ole2_files_are_refused_as_legacy_or_encrypted_office(tmp_path: Path) -> None:
    ole = head(make_ole2(tmp_path / "old.doc"))
    assert sniff(ole, "old.doc") is None
    assert sniff(ole, "secret.docx") is None
    assert describe_unsupported(ole, "secret.docx") == (
        "a legacy .doc or password-protected Office file"
    )


def test_images_are_read_by_ocr_whatever_their_name(tmp_path: Path) -> None:
    assert sniff(head(make_png(tmp_path / "x.png")), "scan.pdf") == ContentType.PNG
    jpeg = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + b"\x01" * 100
    assert sniff(jpeg, "photo.txt") == ContentType.JPEG
    assert sniff(b"II*\x00" + b"\x00" * 100, "page") == ContentType.TIFF
    assert sniff(b"MM\x00*" + b"\x00" * 100, "page") == ContentType.TIFF
    assert sniff(b"RIFF\x10\x00\x00\x00WEBPVP8 " + b"\x00" * 50, "p") == ContentType.WEBP
    bmp = b"BM" + (1000).to_bytes(4, "little") + b"\x00" * 4 + b"\x36\x00\x00\x00" + b"\x00" * 40
    assert sniff(bmp, "p") == ContentType.BMP
    assert sniff(b"BMW owners club notes\n", "notes") == ContentType.TEXT


def test_known_binary_formats_are_refused_with_a_name(tmp_path: Path) -> None:
    gif = head(make_gif(tmp_path / "x.gif"))
    assert sniff(gif, "picture.pdf") is None
    assert describe_unsupported(gif, "picture.pdf") == "a GIF image"
    gz = gzip.compress(b"hello world" * 100)
    assert sniff(gz, "notes.txt") is None
    assert describe_unsupported(gz, "notes.txt") == "a gzip archive"
    elf = b"\x7fELF\x02\x01\x01" + b"\x00" * 100
    assert sniff(elf, "tool") is None
    assert describe_unsupported(elf, "tool") == "an executable program"


def test_rtf_is_refused_rather_than_indexed_as_markup() -> None:
    rtf = b"{\\rtf1\\ansi\\deff0 {\\fonttbl {\\f0 Times;}} Hello}"
    assert sniff(rtf, "letter.rtf") is None
    assert describe_unsupported(rtf, "letter.rtf").startswith("an RTF document")


def test_random_bytes_are_binary_data(tmp_path: Path) -> None:
    data = head(make_random_bytes(tmp_path / "blob.bin"))
    assert sniff(data, "blob.bin") is None
    assert sniff(data, "report.txt") is None
    assert describe_unsupported(data, "blob.bin") == "binary data"
    assert describe_unsupported(data, "fake.pdf") == "a file named .pdf that is not a PDF"


def test_text_full_of_control_characters_is_binary() -> None:
    data = bytes(range(1, 9)) * 200
    assert sniff(data, "x.txt") is None


# --- text: HTML by content, Markdown vs text by name -----------------------------------------


def test_html_document_is_html_whatever_the_extension(tmp_path: Path) -> None:
    page = head(make_html(tmp_path / "x.html"))
    assert sniff(page, "page.html") == ContentType.HTML
    assert sniff(page, "page.txt") == ContentType.HTML
    assert sniff(page, "download") == ContentType.HTML


@pytest.mark.parametrize(
    "start",
    [
        b"<!DOCTYPE html><p>x",
        b"\xef\xbb\xbf  <!-- generated --> \n<html lang='en'>",
        b"<?xml version='1.0'?>\n<html xmlns='http://www.w3.org/1999/xhtml'>",
        b"<HEAD><title>x</title>",
        b"\n\n<body>\n",
    ],
)
def test_html_starts_are_recognised_after_bom_space_and_comments(start: bytes) -> None:
    assert sniff(start + b"<p>text</p>", "file.txt") == ContentType.HTML


def test_utf16_html_with_bom_is_html() -> None:
    data = codecs.BOM_UTF16_LE + "<!doctype html><p>héllo</p>".encode("utf-16-le")
    assert sniff(data, "page.htm") == ContentType.HTML


def test_html_extension_or_declared_type_needs_a_tag() -> None:
    fragment = b"<p>Just a fragment</p>"
    assert sniff(fragment, "frag.html") == ContentType.HTML
    assert sniff(fragment, "frag", "text/html; charset=utf-8") == ContentType.HTML
    assert sniff(fragment, "frag.txt") == ContentType.TEXT
    assert sniff(b"no markup at all", "page.html") == ContentType.TEXT


def test_markdown_is_decided_by_extension_or_declared_type() -> None:
    text = b"# Title\n\nSome *text*.\n"
    for name in ("a.md", "a.markdown", "a.mdown", "A.MKD"):
        assert sniff(text, name) == ContentType.MARKDOWN
    assert sniff(text, "a.txt", "text/markdown") == ContentType.MARKDOWN
    assert sniff(text, "a.txt") == ContentType.TEXT
    assert sniff(text, "README") == ContentType.TEXT


def test_text_in_legacy_and_utf16_encodings_is_text() -> None:
    assert sniff(LATIN1_TEXT.encode("latin-1"), "notes.txt") == ContentType.TEXT
    assert sniff(CHINESE_TEXT.encode("gb18030"), "notes.txt") == ContentType.TEXT
    utf16 = codecs.BOM_UTF16_LE + CHINESE_TEXT.encode("utf-16-le")
    assert b"\x00" in utf16
    assert sniff(utf16, "notes.txt") == ContentType.TEXT
    assert sniff(LATIN1_TEXT.encode("latin-1"), "notes.md") == ContentType.MARKDOWN


def test_utf8_cut_mid_character_at_the_sniff_limit_is_still_text() -> None:
    data = ("é" * SNIFF_BYTES).encode("utf-8")  # 2 bytes per character
    cut = data[: SNIFF_BYTES - 1]  # an odd length: ends inside the last "é"
    with pytest.raises(UnicodeDecodeError):
        cut.decode("utf-8")
    assert sniff(cut, "x.txt") == ContentType.TEXT
