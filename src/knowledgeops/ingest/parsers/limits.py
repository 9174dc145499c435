"""What one document may cost to parse: pages, inflated size, HTML size, sheet rows and cells,
e-mail nesting and attachments, text, chunks, time and memory. Set from settings
(KOPS_MAX_PDF_PAGES …); a document over a limit fails as `user_action_required` with a message
that names the limit and what to do.

Parsers read the limits in force with `current()`: a context variable, so each worker thread (and
each parser process, see isolated.py) has its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

MB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ParseLimits:
    max_pdf_pages: int = 5_000
    max_unzipped_mb: float = 1_024.0  # a DOCX package's parts, inflated, in all
    max_zip_ratio: float = 200.0  # a part inflating more than this many times is a zip bomb
    max_html_mb: float = 64.0
    max_sheet_rows: int = 1_048_576  # rows of one sheet or CSV file (Excel's own maximum)
    max_sheet_cells: int = 20_000_000  # cells of one spreadsheet or CSV file, in all
    max_mime_depth: int = 10  # e-mail parts inside parts (forwarded mail, attachments)
    max_attachments: int = 200  # attachments of one e-mail, or of all messages of an mbox
    max_text_chars: int = 50_000_000  # text of one document after cleaning
    max_chunks: int = 100_000  # chunks of one document
    parse_timeout_s: float = 600.0  # time spent waiting on the parser for one document
    parse_memory_mb: int = 4_096  # address space of the parser process
    max_image_pixels: int = 100_000_000  # one image or TIFF page (width × height)
    ocr_min_confidence: float = 0.8  # an OCR'd page below this is flagged, not indexed
    ocr_threads: int = 0  # model threads of one parser process's OCR (0: all cores)

    @property
    def max_unzipped_bytes(self) -> int:
        return int(self.max_unzipped_mb * MB)

    @property
    def max_html_bytes(self) -> int:
        return int(self.max_html_mb * MB)


DEFAULT_LIMITS = ParseLimits()
_CURRENT: ContextVar[ParseLimits] = ContextVar("kops_parse_limits", default=DEFAULT_LIMITS)


def current() -> ParseLimits:
    return _CURRENT.get()


@contextmanager
def using(limits: ParseLimits) -> Iterator[None]:
    token = _CURRENT.set(limits)
    try:
        yield
    finally:
        _CURRENT.reset(token)
