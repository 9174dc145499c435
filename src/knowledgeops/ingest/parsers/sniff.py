"""Content sniffing: which `ContentType` an upload really is, from its first bytes and its name.

Magic bytes win over the file name: a PDF named .txt is a PDF, a PNG named .pdf is refused. A ZIP
package is told apart by the parts it names (word/, ppt/, xl/, an EPUB's mimetype), looked for in
its first bytes and in its last (`tail`: the central directory lists every part), then by its
extension. An e-mail is text that starts with a block of mail headers (or an mbox's "From "
line). The name (or the declared type) otherwise only decides between kinds of text: Markdown,
CSV or plain text, and HTML for .html files that do not start like an HTML document.
"""

from __future__ import annotations

import codecs
import re
from pathlib import Path, PurePath

import charset_normalizer

from knowledgeops.ingest.parsers.base import ContentType
from knowledgeops.ingest.parsers.encoding import bom_encoding

SNIFF_BYTES = 8 * 1024
"""How many leading bytes `sniff` needs (it reads no more than this of `head`)."""
TAIL_BYTES = 256 * 1024
"""How many trailing bytes of a ZIP package `sniff` looks through for the names of its parts."""

PDF_MAGIC = b"%PDF-"
PDF_JUNK_ALLOWANCE = 1024
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
OLE2_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"

MARKDOWN_EXTENSIONS = frozenset({".md", ".markdown", ".mdown", ".mkd"})
HTML_EXTENSIONS = frozenset({".html", ".htm", ".xhtml"})
MARKDOWN_TYPES = frozenset({"text/markdown", "text/x-markdown"})
HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
CSV_EXTENSIONS = frozenset({".csv", ".tsv", ".tab"})
CSV_TYPES = frozenset({"text/csv", "text/tab-separated-values", "application/csv"})
MAIL_EXTENSIONS = frozenset({".eml", ".mbox", ".mbx"})
MAIL_TYPES = frozenset({"message/rfc822", "application/mbox"})
# names that say a file is text of another kind, whatever headers it starts with
NOT_MAIL_EXTENSIONS = MARKDOWN_EXTENSIONS | HTML_EXTENSIONS | CSV_EXTENSIONS | {".txt", ".text"}

# A ZIP package's kind by a part only it has, in the order they are told apart (a Word document
# may embed a workbook, whose parts sit under word/embeddings/).
_ZIP_PARTS: tuple[tuple[bytes, str], ...] = (
    (b"word/document.xml", ContentType.DOCX),
    (b"ppt/presentation.xml", ContentType.PPTX),
    (b"xl/workbook.xml", ContentType.XLSX),
    (b"META-INF/container.xml", ContentType.EPUB),
)
_ZIP_EXTENSIONS = {
    ".docx": ContentType.DOCX,
    ".docm": ContentType.DOCX,
    ".pptx": ContentType.PPTX,
    ".pptm": ContentType.PPTX,
    ".xlsx": ContentType.XLSX,
    ".xlsm": ContentType.XLSX,
    ".epub": ContentType.EPUB,
}
_EPUB_MIMETYPE = b"mimetypeapplication/epub+zip"

# RFC 5322 header fields that start e-mail messages (lower case)
_MAIL_FIELDS = frozenset(
    {
        b"from",
        b"to",
        b"cc",
        b"subject",
        b"date",
        b"message-id",
        b"mime-version",
        b"received",
        b"return-path",
        b"delivered-to",
        b"reply-to",
        b"sender",
        b"in-reply-to",
        b"references",
        b"content-type",
    }
)
_FIELD = re.compile(rb"\A([!-9;-~]{1,76}):")
_MIN_MAIL_FIELDS = 3  # without a name that says so, a header block needs this many known fields

# Images that OCR reads, by their magic at offset 0.
_IMAGE_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", ContentType.PNG),
    (b"\xff\xd8\xff", ContentType.JPEG),
    (b"II*\x00", ContentType.TIFF),
    (b"MM\x00*", ContentType.TIFF),
)
# (magic at offset 0, phrase for a person). These never start a text file, so they are checked
# before any text detection.
_BINARY_MAGIC: tuple[tuple[bytes, str], ...] = (
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


def image_kind(head: bytes) -> str | None:
    """The image type OCR reads (PNG, JPEG, TIFF, WebP, BMP) by its magic, else None."""
    for magic, kind in _IMAGE_MAGIC:
        if head.startswith(magic):
            return kind
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return ContentType.WEBP
    if head.startswith(b"BM") and len(head) >= 26 and head[6:10] == b"\x00\x00\x00\x00":
        return ContentType.BMP  # "BM", file size, two reserved zero words
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


def is_zip(head: bytes) -> bool:
    return head.startswith(ZIP_MAGICS)


def zip_kind(head: bytes, tail: bytes, extension: str) -> str | None:
    """The kind of a ZIP package from the parts it names (in its first bytes or its central
    directory at the end), else from its extension; None for any other ZIP archive."""
    if head[30 : 30 + len(_EPUB_MIMETYPE)] == _EPUB_MIMETYPE:
        return ContentType.EPUB
    for part, kind in _ZIP_PARTS:
        if part in head or part in tail:
            return kind
    return _ZIP_EXTENSIONS.get(extension)


def _mail_kind(text: bytes, extension: str, declared: str) -> str | None:
    """EMAIL or MBOX when the text starts with a block of mail headers; a name or declared type
    that says e-mail lets fewer known fields do."""
    if extension in NOT_MAIL_EXTENSIONS:
        return None
    named = extension in MAIL_EXTENSIONS or declared in MAIL_TYPES
    lines = text.lstrip(b"\r\n").split(b"\n")
    mbox = lines[0].startswith(b"From ")
    if mbox:
        lines = lines[1:]
    known = 0
    fields = 0
    for raw in lines[:-1]:  # the last line may be cut off by the sniff limit
        line = raw.rstrip(b"\r")
        if not line:
            break  # the end of the header block
        if line[:1] in (b" ", b"\t"):
            if not fields:
                return None
            continue  # a folded header line
        match = _FIELD.match(line)
        if match is None:
            return None
        fields += 1
        known += match.group(1).lower() in _MAIL_FIELDS
    if known == 0 or (not named and not mbox and known < _MIN_MAIL_FIELDS):
        return None
    if mbox or extension in (".mbox", ".mbx") or declared == "application/mbox":
        return ContentType.MBOX
    return ContentType.EMAIL


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


def read_tail(path: Path) -> bytes:
    """The last `TAIL_BYTES` of a file, for `sniff`."""
    with path.open("rb") as fh:
        fh.seek(0, 2)
        fh.seek(max(0, fh.tell() - TAIL_BYTES))
        return fh.read(TAIL_BYTES)


def sniff(
    head: bytes, file_name: str, declared_type: str | None = None, tail: bytes = b""
) -> str | None:
    """The canonical content type of an upload, or None when it cannot be parsed.

    `head` is the first bytes of the file (up to `SNIFF_BYTES` are looked at), `file_name` the
    name it was uploaded with and `declared_type` the client's Content-Type, if any; `tail` the
    last bytes (`read_tail`), which only a ZIP package needs.
    """
    head = head[:SNIFF_BYTES]
    extension = _extension(file_name)
    declared = _declared(declared_type)
    if _is_pdf(head):
        return ContentType.PDF
    if is_zip(head):
        return zip_kind(head, tail[-TAIL_BYTES:], extension)
    image = image_kind(head)
    if image is not None:
        return image
    if head.startswith(OLE2_MAGIC) or _binary_kind(head) is not None:
        return None
    if not _is_text(head):
        return None
    text = _text_head(head)
    mail = _mail_kind(text, extension, declared)
    if mail is not None:
        return mail
    if _looks_like_html(text):
        return ContentType.HTML
    if (extension in HTML_EXTENSIONS or declared in HTML_TYPES) and _ANY_TAG.search(text):
        return ContentType.HTML
    if extension in CSV_EXTENSIONS or declared in CSV_TYPES:
        return ContentType.CSV
    if extension in MARKDOWN_EXTENSIONS or declared in MARKDOWN_TYPES:
        return ContentType.MARKDOWN
    return ContentType.TEXT


def describe_unsupported(head: bytes, file_name: str) -> str:
    """A short phrase naming what an unsupported upload is, for a 415 message ("a PNG image")."""
    head = head[:SNIFF_BYTES]
    if head.startswith(OLE2_MAGIC):
        return "a legacy .doc or password-protected Office file"
    if is_zip(head):
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
