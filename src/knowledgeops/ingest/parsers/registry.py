"""The one place that picks a parser for a content type and classifies what parsing raised.

Parsers raise `PermanentError`/`UserActionRequired` for the failures they understand; any other
exception a parsing library raises on a bad file is translated here into
`PermanentError(code="corrupt_file")`, so the runner never sees a library's exception types.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from knowledgeops.errors import JobError, PermanentError
from knowledgeops.ingest.parsers.base import Block, ContentType, Parser
from knowledgeops.ingest.parsers.delimited import CsvParser
from knowledgeops.ingest.parsers.docx import DocxParser
from knowledgeops.ingest.parsers.epub import EpubParser
from knowledgeops.ingest.parsers.html import HtmlParser
from knowledgeops.ingest.parsers.image import IMAGE_TYPES, ImageParser
from knowledgeops.ingest.parsers.mail import EmailParser, MboxParser
from knowledgeops.ingest.parsers.markdown import MarkdownParser
from knowledgeops.ingest.parsers.pdf import PdfParser
from knowledgeops.ingest.parsers.pptx import PptxParser
from knowledgeops.ingest.parsers.text import TextParser
from knowledgeops.ingest.parsers.xlsx import XlsxParser

_ALL_PARSERS: tuple[Parser, ...] = (
    PdfParser(),
    DocxParser(),
    HtmlParser(),
    MarkdownParser(),
    TextParser(),
    PptxParser(),
    XlsxParser(),
    CsvParser(),
    EpubParser(),
    EmailParser(),
    MboxParser(),
    *(ImageParser(content_type) for content_type in IMAGE_TYPES),
)
_PARSERS: dict[str, Parser] = {parser.content_type: parser for parser in _ALL_PARSERS}

KIND_NAMES = {
    ContentType.PDF: "a PDF",
    ContentType.DOCX: "a Word document",
    ContentType.HTML: "HTML",
    ContentType.MARKDOWN: "Markdown",
    ContentType.TEXT: "text",
    ContentType.PPTX: "a PowerPoint presentation",
    ContentType.XLSX: "an Excel workbook",
    ContentType.CSV: "CSV",
    ContentType.EPUB: "an EPUB e-book",
    ContentType.EMAIL: "an e-mail message",
    ContentType.MBOX: "a mailbox",
    ContentType.PNG: "a PNG image",
    ContentType.JPEG: "a JPEG image",
    ContentType.TIFF: "a TIFF image",
    ContentType.WEBP: "a WebP image",
    ContentType.BMP: "a BMP image",
}

_MAX_REASON_CHARS = 200


def parser_for(content_type: str) -> Parser:
    """The parser for a canonical content type; `PermanentError(unsupported_type)` if none."""
    parser = _PARSERS.get(content_type)
    if parser is None:
        raise PermanentError(
            f"Documents of type {content_type!r} cannot be parsed.", code="unsupported_type"
        )
    return parser


def _reason(exc: BaseException) -> str:
    reason = " ".join(str(exc).split()) or type(exc).__name__
    if len(reason) > _MAX_REASON_CHARS:
        reason = reason[: _MAX_REASON_CHARS - 1] + "…"
    return reason


def _unreadable(exc: BaseException, kind: str) -> PermanentError:
    return PermanentError(
        f"The file could not be read as {kind}: {_reason(exc)}", code="corrupt_file"
    )


def parse(path: Path, content_type: str, pages: tuple[int, int] | None = None) -> Iterator[Block]:
    """Parse a stored file lazily into blocks, with every failure classified as a `JobError`;
    `pages` (first, last) reads a page range of a PDF only.

    Raises `PermanentError(unsupported_type)` at once for an unknown content type. While iterating,
    failures are classified by `translate_errors`.
    """
    parser = parser_for(content_type)
    kind = KIND_NAMES.get(content_type, content_type)
    if pages is None:
        return translate_errors(parser.parse(path), kind)
    if not isinstance(parser, PdfParser):
        raise PermanentError(f"{kind} cannot be read by page range", code="unsupported_type")
    return translate_errors(parser.parse(path, pages), kind)


def page_count(path: Path, content_type: str) -> int | None:
    """How many pages a PDF has (None for other types, whose pages are not known before they
    are parsed), with failures classified as in `parse`."""
    parser = parser_for(content_type)
    if not isinstance(parser, PdfParser):
        return None
    try:
        return parser.page_count(path)
    except (JobError, OSError, MemoryError):
        raise
    except Exception as exc:
        raise _unreadable(exc, KIND_NAMES[ContentType.PDF]) from exc


def translate_errors(blocks: Iterator[Block], kind: str) -> Iterator[Block]:
    """Pass `blocks` through, translating what a parsing library raises into `JobError`s.

    `JobError`s pass through unchanged; `OSError` (the stored file cannot be read: a storage
    problem, not a property of the document) and `MemoryError` propagate for the runner to
    classify, as do `KeyboardInterrupt` and other non-`Exception`s; anything else becomes
    `PermanentError(corrupt_file)` "The file could not be read as <kind>: <reason>".
    The wrapped iterator is closed when this one is closed or fails.
    """
    try:
        while True:
            try:
                block = next(blocks)
            except StopIteration:
                return
            except (JobError, OSError, MemoryError):
                raise
            except Exception as exc:
                raise _unreadable(exc, kind) from exc
            yield block
    finally:
        close = getattr(blocks, "close", None)
        if close is not None:
            close()
