"""PDF via pypdfium2: one block per page, sections from the document outline (bookmarks).

A page without a text layer (no text objects, but an image: a scan) is rendered by PDFium at
`OCR_DPI` and read by OCR (ocr.py); the other pages keep their own text, so a mixed PDF runs OCR
on its scanned pages only. Which pages those are is known before the first one is read (a pass
over the pages' objects, about a millisecond a page), so progress can say "ocr 12/200 pages".
One page image is in memory at a time. A page OCR reads with a confidence below
KOPS_OCR_MIN_CONFIDENCE is reported (progress.py) and left out of the index rather than indexed
as garbage.

PDFium is not thread-safe, not even across different documents, and the embedded topology runs
several worker threads in one process. Every PDFium call here therefore runs under `PDFIUM_LOCK`,
which is held for one short step at a time (open, one page, close) and never across a `yield`;
OCR runs outside it.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_raw

from knowledgeops.errors import PermanentError, UserActionRequired
from knowledgeops.ingest.parsers import progress
from knowledgeops.ingest.parsers.base import Block, ContentType
from knowledgeops.ingest.parsers.limits import current as current_limits
from knowledgeops.ingest.parsers.progress import OcrProgress
from knowledgeops.ingest.parsers.sections import SECTION_SEPARATOR

log = logging.getLogger(__name__)

PDFIUM_LOCK = threading.Lock()
"""Serialises all PDFium calls in this process; take it for any other use of pypdfium2."""

MAX_OUTLINE_DEPTH = 8
OCR_DPI = 200  # a scanned page is rendered at this resolution for OCR (docs/formats.md)

ENCRYPTED_MESSAGE = (
    "The PDF is password-protected. Remove the password (e.g. print to a new PDF) "
    "and upload it again."
)
NO_TEXT_MESSAGE = (
    "The PDF has no text layer, and OCR found no text on its pages that it was sure of. "
    "Check that the scan is legible (at least 200 dpi, upright) and upload it again."
)

# PDFium reports a hyphen that ended a layout line as U+FFFE (get_text_range) or U+0002
# (get_text_bounded), with the line break already removed. It is kept as a hyphen: in the
# PDFs seen so far these are real hyphens ("build-essential"), not hyphenation.
_PDFIUM_TEXT_FIXES = str.maketrans({"\ufffe": "-", "\x02": "-", "\r": None})


class _Outline:
    """Bookmark paths by first page, to find the section a page belongs to."""

    def __init__(self, entries: list[tuple[int, str]]) -> None:
        entries.sort(key=lambda entry: entry[0])  # stable: keeps outline order within a page
        self._pages = [page for page, _ in entries]
        self._paths = [path for _, path in entries]

    def section_for(self, page_index: int) -> str | None:
        """The path of the last bookmark that points at or before `page_index`."""
        at = bisect.bisect_right(self._pages, page_index) - 1
        return self._paths[at] if at >= 0 else None


def _join_path(titles: list[str]) -> str:
    path: list[str] = []
    for title in titles:
        if title and (not path or path[-1] != title):
            path.append(title)
    return SECTION_SEPARATOR.join(path)


def _read_outline(pdf: Any) -> _Outline:
    entries: list[tuple[int, str]] = []
    stack: list[str] = []
    try:
        for bookmark in pdf.get_toc(max_depth=MAX_OUTLINE_DEPTH):
            title = " ".join(bookmark.get_title().split())
            level = min(bookmark.level, len(stack))
            del stack[level:]
            stack.append(title)
            dest = bookmark.get_dest()
            index = dest.get_index() if dest is not None else None
            if title and index is not None and index >= 0:
                entries.append((index, _join_path(stack)))
    except (pdfium.PdfiumError, ValueError, OSError) as exc:
        # A broken outline must not cost the text: carry on without sections.
        log.warning("ignoring an unreadable PDF outline: %s", exc)
    return _Outline(entries)


def _open(path: Path) -> Any:
    try:
        return pdfium.PdfDocument(str(path))
    except pdfium.PdfiumError as exc:
        code = getattr(exc, "err_code", None)
        if code in (pdfium_raw.FPDF_ERR_PASSWORD, pdfium_raw.FPDF_ERR_SECURITY):
            raise UserActionRequired(ENCRYPTED_MESSAGE, code="pdf_encrypted") from exc
        raise PermanentError(
            f"The file could not be read as a PDF ({exc}). It may be damaged or incomplete; "
            "export or download it again and upload the new copy.",
            code="corrupt_file",
        ) from exc


def _page_text(pdf: Any, index: int) -> str:
    page = pdf[index]
    try:
        textpage = page.get_textpage()
        try:
            text: str = textpage.get_text_range()
        finally:
            textpage.close()
    finally:
        page.close()
    return text.translate(_PDFIUM_TEXT_FIXES)


def _kind_of_page(pdf: Any, index: int) -> str:
    """ "text" (it has text objects), "scan" (images and no text: OCR reads it) or "blank"."""
    page = pdf[index]
    try:
        raw_page = page.raw
        kinds = {
            pdfium_raw.FPDFPageObj_GetType(pdfium_raw.FPDFPage_GetObject(raw_page, n))
            for n in range(pdfium_raw.FPDFPage_CountObjects(raw_page))
        }
    finally:
        page.close()
    if pdfium_raw.FPDF_PAGEOBJ_TEXT in kinds:
        return "text"
    if kinds & {pdfium_raw.FPDF_PAGEOBJ_IMAGE, pdfium_raw.FPDF_PAGEOBJ_FORM}:
        return "scan"
    return "blank"


def _page_image(pdf: Any, index: int) -> Any:
    page = pdf[index]
    try:
        bitmap = page.render(scale=OCR_DPI / 72, grayscale=True)
        try:
            image = bitmap.to_numpy()
            return image[:, :, 0].copy() if image.ndim == 3 else image.copy()
        finally:
            bitmap.close()
    finally:
        page.close()


def ocr_page(image: Any, page: int, done: int, total: int) -> str:
    """OCR one page image and report it; its text, or "" when it holds none or is below the
    confidence threshold (reported as low)."""
    from knowledgeops.ingest.parsers.ocr import OcrUnavailable, read_page  # noqa: PLC0415 (the OCR engine loads with the first scanned page)

    limits = current_limits()
    try:
        result = read_page(image, limits.ocr_threads)
    except OcrUnavailable as exc:
        raise UserActionRequired(
            f"Page {page} needs OCR, which cannot run here: {exc}. Ask the operator to install "
            "it, or set the dataset's ocrLanguages to ones this server reads.",
            code="ocr_unavailable",
        ) from exc
    low = result.confidence is not None and result.confidence < limits.ocr_min_confidence
    progress.report(OcrProgress(done, total, page, result.confidence, low))
    return "" if low else result.text


def _checked_count(pdf: Any) -> int:
    page_count = len(pdf)
    if page_count == 0:
        raise PermanentError("The PDF has no pages.", code="corrupt_file")
    most = current_limits().max_pdf_pages
    if page_count > most:
        raise UserActionRequired(
            f"The PDF has {page_count:,} pages; this server accepts at most {most:,} "
            "(KOPS_MAX_PDF_PAGES). Split it into parts and upload them one by one.",
            code="too_many_pages",
        )
    return page_count


class PdfParser:
    """PDF documents with a text layer."""

    content_type = ContentType.PDF

    def page_count(self, path: Path) -> int:
        """The PDF's pages, after the same checks as `parse` (password, damage, page limit)."""
        with PDFIUM_LOCK:
            pdf = _open(path)
            try:
                return _checked_count(pdf)
            finally:
                pdf.close()

    def parse(self, path: Path, pages: tuple[int, int] | None = None) -> Iterator[Block]:
        """The pages' text, a block per page; `pages` (first, last; from 1) reads only those,
        for one part of a document split by page range: such a range may have no text (the
        document as a whole is checked when its parts are put together)."""
        with PDFIUM_LOCK:
            pdf = _open(path)
        try:
            with PDFIUM_LOCK:
                page_count = _checked_count(pdf)
                outline = _read_outline(pdf)
            first, last = pages if pages is not None else (1, page_count)
            if not 1 <= first <= last <= page_count:
                raise PermanentError(
                    f"pages {first}-{last} are not in this {page_count}-page PDF; the file "
                    "changed after it was split",
                    code="corrupt_file",
                )
            with PDFIUM_LOCK:
                kinds = [_kind_of_page(pdf, index) for index in range(first - 1, last)]
            scans = kinds.count("scan")
            if scans:
                progress.report(OcrProgress(0, scans))
            found_text = False
            done = 0
            for index, kind in zip(range(first - 1, last), kinds, strict=True):
                if kind == "blank":
                    continue
                if kind == "text":
                    with PDFIUM_LOCK:
                        text = _page_text(pdf, index)
                else:
                    with PDFIUM_LOCK:
                        image = _page_image(pdf, index)
                    done += 1
                    text = ocr_page(image, index + 1, done, scans)
                    del image
                if not text.strip():
                    continue
                found_text = True
                yield Block(text=text, page=index + 1, section=outline.section_for(index))
            if not found_text and pages is None:
                raise PermanentError(NO_TEXT_MESSAGE, code="no_text_layer")
        finally:
            with PDFIUM_LOCK:
                pdf.close()
