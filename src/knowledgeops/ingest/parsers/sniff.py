"""Content sniffing: which `ContentType` an upload really is, from its first bytes and its name.

Magic bytes win over the file name: a PDF named .txt is a PDF, a PNG named .pdf is refused. The
name (or the declared type) only decides between kinds of text: Markdown vs plain text, and HTML for
.html files that do not start like an HTML document.
"""

from __future__ import annotations

import codecs
import re
from pathlib import PurePath

import charset_normalizer

from knowledgeops.ingest.parsers.base import ContentType
from knowledgeops.ingest.parsers.encoding import bom_encoding

SNIFF_BYTES = 8 * 1024
"""How many leading bytes `sniff` needs (it reads no more than this of `head`)."""

PDF_MAGIC = b"%PDF-"
PDF_JUNK_ALLOWANCE = 1024
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
OLE2_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"

MARKDOWN_EXTENSIONS = frozenset({".md", ".markdown", ".mdown", ".mkd"})
HTML_EXTENSIONS = frozenset({".html", ".htm", ".xhtml"})
MARKDOWN_TYPES = frozenset({"text/markdown", "text/x-markdown"})
HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})

# (magic at offset 0, phrase for a person). These never start a text file, so they are checked
# before any text detection.
_BINARY_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"II*\x00", "a TIFF image"),
    (b"MM\x00*", "a TIFF image"),
    (b"\x00\x00\x01\x00", "an icon file"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
    (b"Rar!\x1a\x07", "a RAR archive"),
    (b"\xfd7zXZ\x00", "an xz archive"),
    (b"\x28\xb5\x2f\xfd", "a Zstandard archive"),
    (b"\x7fELF", "an executable program"),
    (b"\xca\xfe\xba\xbe", "an executable program"),
    (b"\xcf\xfa\xed\xfe", "an executable program"),
    (b"\xce\xfa\xed\xfe", "an executable program"),
    (b"\x00asm", "a WebAssembly module"),
    (b"SQLite format 3\x00", "an SQLite database"),
    (b"\x1aE\xdf\xa3", "a video file"),
    # Text formats KnowledgeOps does not parse; reading them as plain text would index markup.
    (b"{\\rtf", "an RTF document (save it as .docx or PDF)"),
    (b"%!PS", "a PostScript file (convert it to PDF)"),
)
# ASCII magics that a text file could start with: they only name a file that is not text anyway.
_WEAK_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"GIF87a", "a GIF image"),
    (b"GIF89a", "a GIF image"),
    (b"OggS", "an audio or video file"),
    (b"fLaC", "an audio file"),
    (b"ID3", "an audio file"),
    (b"wOFF", "a font file"),
    (b"wOF2", "a font file"),
    (b"MZ", "an executable program"),
)
_BZIP2 = re.compile(rb"\ABZh[1-9]1AY&SY")
_RIFF_KINDS = {b"WEBP": "a WebP image", b"WAVE": "an audio file", b"AVI ": "a video file"}
_MP4 = re.compile(rb"\A....ftyp", re.DOTALL)

_LEADING_NOISE = re.compile(rb"\A(?:\s+|<!--.*?-->|<\?xml[^>]*\?>)*", re.DOTALL)
_HTML_START = re.compile(rb"\A<(?:!doctype\s+html|html|head|body)[\s>/]", re.IGNORECASE)
_ANY_TAG = re.compile(rb"<(?:[A-Za-z][A-Za-z0-9-]*|!--|!doctype|/[A-Za-z])", re.IGNORECASE)

# C0 controls that do not occur in text (all but \t \n \v \f \r and ESC).
_BINARY_CONTROLS = bytes(set(range(32)) - {9, 10, 11, 12, 13, 27})
_MAX_CONTROL_RATIO = 0.02


def _extension(file_name: str) -> str:
    return PurePath(file_name).suffix.lower()


def _declared(declared_type: str | None) -> str:
    return (declared_type or "").split(";")[0].strip().lower()


def _binary_kind(head: bytes) -> str | None:
    """A phrase for well-known non-text formats (never for PDF/ZIP/OLE2), else None."""
    for magic, phrase in _BINARY_MAGIC:
        if head.startswith(magic):
            return phrase
    if _BZIP2.match(head):
        return "a bzip2 archive"
    return None


def _weak_binary_kind(head: bytes) -> str | None:
    """A phrase for formats recognised by magic that plain text could also start with."""
    for magic, phrase in _WEAK_MAGIC:
        if head.startswith(magic):
            return phrase
    if head.startswith(b"RIFF") and head[8:12] in _RIFF_KINDS:
        return _RIFF_KINDS[head[8:12]]
    if _MP4.match(head):
        return "an audio or video file"
    return None


def _is_pdf(head: bytes) -> bool:
    return PDF_MAGIC in head[: PDF_JUNK_ALLOWANCE + len(PDF_MAGIC)]


def _is_zip(head: bytes) -> bool:
    return head.startswith(ZIP_MAGICS)


def _zip_is_docx(head: bytes, extension: str) -> bool:
    if extension == ".docx" or b"word/" in head:
        return True
    if b"xl/" in head or b"ppt/" in head:
        return False  # a spreadsheet or a presentation
    return b"[Content_Types].xml" in head


def _is_text(head: bytes) -> bool:
    if not head:
        return True
    if bom_encoding(head) is not None:
        return True
    if b"\x00" in head:
        return False
    controls = len(head) - len(head.translate(None, _BINARY_CONTROLS))
    if controls > _MAX_CONTROL_RATIO * len(head):
        return False
    try:
        codecs.getincrementaldecoder("utf-8")("strict").decode(head, final=False)
    except UnicodeDecodeError:
        return charset_normalizer.from_bytes(head).best() is not None
    return True


def _text_head(head: bytes) -> bytes:
    """The start of a text head as ASCII-compatible bytes, for tag matching."""
    bom = bom_encoding(head)
    if bom is None:
        return head
    text = codecs.getincrementaldecoder(bom)("replace").decode(head, final=False)
    return text.encode("utf-8", "replace")


def _looks_like_html(head: bytes) -> bool:
    start = _LEADING_NOISE.sub(b"", head, count=1)
    return _HTML_START.match(start) is not None


def sniff(head: bytes, file_name: str, declared_type: str | None = None) -> str | None:
    """The canonical content type of an upload, or None when it cannot be parsed.

    `head` is the first bytes of the file (up to `SNIFF_BYTES` are looked at), `file_name` the
    name it was uploaded with and `declared_type` the client's Content-Type, if any.
    """
    head = head[:SNIFF_BYTES]
    extension = _extension(file_name)
    declared = _declared(declared_type)
    if _is_pdf(head):
        return ContentType.PDF
    if _is_zip(head):
        return ContentType.DOCX if _zip_is_docx(head, extension) else None
    if head.startswith(OLE2_MAGIC) or _binary_kind(head) is not None:
        return None
    if not _is_text(head):
        return None
    text = _text_head(head)
    if _looks_like_html(text):
        return ContentType.HTML
    if (extension in HTML_EXTENSIONS or declared in HTML_TYPES) and _ANY_TAG.search(text):
        return ContentType.HTML
    if extension in MARKDOWN_EXTENSIONS or declared in MARKDOWN_TYPES:
        return ContentType.MARKDOWN
    return ContentType.TEXT


def describe_unsupported(head: bytes, file_name: str) -> str:
    """A short phrase naming what an unsupported upload is, for a 415 message ("a PNG image")."""
    head = head[:SNIFF_BYTES]
    if head.startswith(OLE2_MAGIC):
        return "a legacy .doc or password-protected Office file"
    if _is_zip(head):
        if b"xl/" in head:
            return "an Excel spreadsheet"
        if b"ppt/" in head:
            return "a PowerPoint presentation"
        return "a ZIP archive"
    kind = _binary_kind(head) or _weak_binary_kind(head)
    if kind is not None:
        return kind
    extension = _extension(file_name)
    if extension == ".pdf":
        return "a file named .pdf that is not a PDF"
    if extension == ".docx":
        return "a file named .docx that is not a Word document"
    return "binary data"
