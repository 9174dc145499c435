"""DOCX via python-docx: body paragraphs and tables in document order, headings as sections.

python-docx opens and validates the package; the text is then read straight from its lxml tree
(`document.element.body`), which is some 50x faster than building a `Paragraph` object per paragraph
and reading `Paragraph.text`, and yields the same text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docx
from docx.enum.style import WD_STYLE_TYPE
from docx.oxml.ns import qn
from lxml import etree  # type: ignore[import-untyped, unused-ignore]

from knowledgeops.errors import PermanentError, UserActionRequired
from knowledgeops.ingest.parsers.base import Block, ContentType
from knowledgeops.ingest.parsers.limits import MB
from knowledgeops.ingest.parsers.limits import current as current_limits
from knowledgeops.ingest.parsers.package import open_package
from knowledgeops.ingest.parsers.sections import (
    LINE,
    PARAGRAPH,
    SectionBuilder,
    table_cell,
    table_lines,
)

DOCUMENT_PART = "word/document.xml"
KIND = "Word document"

MAX_DOCUMENT_XML_BYTES = 200 * 1024 * 1024
"""Refuse a word/document.xml that inflates to more than this (or than the package limit). The
package limit (all parts inflated) and the ratio of one part are KOPS_MAX_UNZIPPED_MB and
KOPS_MAX_ZIP_RATIO, checked by package.py before anything is inflated: python-docx loads every
part."""
MAX_GRID_SPAN = 64  # columns one cell may span (Word allows 63)

_W_P = qn("w:p")
_W_TBL = qn("w:tbl")
_W_TR = qn("w:tr")
_W_TC = qn("w:tc")
_W_TCPR = qn("w:tcPr")
_W_GRID_SPAN = qn("w:gridSpan")
_W_R = qn("w:r")
_W_T = qn("w:t")
_W_TAB = qn("w:tab")
_W_BR = qn("w:br")
_W_CR = qn("w:cr")
_W_NO_BREAK_HYPHEN = qn("w:noBreakHyphen")
_W_SDT = qn("w:sdt")
_W_SDT_CONTENT = qn("w:sdtContent")
_W_SDT_PR = qn("w:sdtPr")
_W_PPR = qn("w:pPr")
_W_PSTYLE = qn("w:pStyle")
_W_NUMPR = qn("w:numPr")
_W_VAL = qn("w:val")
_W_TYPE = qn("w:type")
_W_CUSTOM_XML = qn("w:customXml")

# Runs that are part of a paragraph's text: direct, or inside links, tracked insertions, fields,
# content controls and smart tags (not inside drawings/text boxes, whose fallbacks repeat them).
_RUNS = etree.XPath(
    "./w:r | ./w:hyperlink/w:r | ./w:ins/w:r | ./w:fldSimple/w:r | ./w:smartTag/w:r"
    " | ./w:sdt/w:sdtContent/w:r | ./w:customXml/w:r | ./w:hyperlink/w:ins/w:r",
    namespaces={"w": "http://schemas.openxmlformats.org/wordprocessingml/2006/main"},
)
_TOC_GALLERY = etree.XPath(
    "./w:sdtPr/w:docPartObj/w:docPartGallery/@w:val",
    namespaces={"w": "http://schemas.openxmlformats.org/wordprocessingml/2006/main"},
)
_HEADING_NAME = re.compile(r"^heading\s*([1-9])$", re.IGNORECASE)
_TOC_HEADINGS = ("toc heading", "contents heading")
_CODE_NAME = re.compile(r"preformatted|code|source|listing|plain text|macro", re.IGNORECASE)


def _check_package(path: Path) -> None:
    """Cheap checks before python-docx inflates anything: encryption, zip, size, zip bombs."""
    with open_package(path, KIND, ".docx", required=(DOCUMENT_PART,)) as archive:
        document = archive.getinfo(DOCUMENT_PART)
        limits = current_limits()
        if document.file_size > min(MAX_DOCUMENT_XML_BYTES, limits.max_unzipped_bytes):
            raise UserActionRequired(
                f"The Word document's text part expands to {document.file_size / MB:,.0f} MB; "
                f"this server reads at most {MAX_DOCUMENT_XML_BYTES / MB:g} MB of it. Split it "
                "into smaller documents.",
                code="too_large",
            )


def _load(path: Path) -> Any:
    _check_package(path)
    try:
        return docx.Document(str(path))
    except MemoryError:
        raise
    except Exception as exc:
        reason = str(exc) or type(exc).__name__
        raise PermanentError(
            f"The file could not be read as a Word document ({reason[:200]}). It may be "
            "damaged; save it again as .docx and upload the new copy.",
            code="corrupt_file",
        ) from exc


def _heading_level(style: Any) -> int | None:
    """0 for Title, N for Heading N (also for styles based on them), else None."""
    seen = 0
    while style is not None and seen < 10:
        name = style.name or ""
        if name.lower() == "title":
            return 0
        match = _HEADING_NAME.match(name)
        if match:
            return int(match.group(1))
        style = style.base_style
        seen += 1
    return None


class _Styles:
    """What matters of each paragraph style, resolved once per document."""

    def __init__(self, document: Any) -> None:
        self.headings: dict[str, int] = {}
        self.lists: set[str] = set()
        self.skipped: set[str] = set()
        self.code: set[str] = set()
        for style in document.styles:
            style_id = style.style_id
            if style_id is None or style.type != WD_STYLE_TYPE.PARAGRAPH:
                continue
            name = (style.name or "").lower()
            level = _heading_level(style)
            if level is not None:
                self.headings[style_id] = level
            if _CODE_NAME.search(name):
                self.code.add(style_id)
            if name.startswith("list"):
                self.lists.add(style_id)
            if name.startswith(("toc ", "contents ")) or name in _TOC_HEADINGS:
                self.skipped.add(style_id)
        default = document.styles.default(WD_STYLE_TYPE.PARAGRAPH)
        self.default = default.style_id if default is not None else None


def _paragraph_text(p: Any) -> str:
    parts: list[str] = []
    for run in _RUNS(p):
        for child in run:
            tag = child.tag
            if tag == _W_T:
                if child.text:
                    parts.append(child.text)
            elif tag == _W_TAB:
                parts.append("\t")
            elif tag == _W_BR:
                kind = child.get(_W_TYPE)
                parts.append("\n" if kind in (None, "textWrapping") else " ")
            elif tag == _W_CR:
                parts.append("\n")
            elif tag == _W_NO_BREAK_HYPHEN:
                parts.append("-")
    return "".join(parts)


def _style_id(p: Any) -> str | None:
    ppr = p.find(_W_PPR)
    if ppr is None:
        return None
    pstyle = ppr.find(_W_PSTYLE)
    return None if pstyle is None else pstyle.get(_W_VAL)


def _is_numbered(p: Any) -> bool:
    ppr = p.find(_W_PPR)
    return ppr is not None and ppr.find(_W_NUMPR) is not None


def _table_rows(tbl: Any) -> list[str]:
    """The table as Markdown rows; a cell spanning columns (gridSpan) keeps the columns below it
    aligned with empty cells after it."""
    rows: list[list[str]] = []
    for tr in tbl.iterchildren(_W_TR):
        cells: list[str] = []
        for tc in tr.iterchildren(_W_TC):
            cells.append(table_cell(" ".join(_paragraph_text(p) for p in tc.iter(_W_P))))
            cells.extend([""] * (_grid_span(tc) - 1))
        rows.append(cells)
    return table_lines(rows)


def _grid_span(tc: Any) -> int:
    tcpr = tc.find(_W_TCPR)
    span = tcpr.find(_W_GRID_SPAN) if tcpr is not None else None
    try:
        return max(1, min(int(span.get(_W_VAL)), MAX_GRID_SPAN)) if span is not None else 1
    except (TypeError, ValueError):
        return 1


class _Walker:
    def __init__(self, styles: _Styles) -> None:
        self.styles = styles
        self.out = SectionBuilder()
        self.in_list = False
        self.in_code = False
        self.code_gap = False

    def walk(self, container: Any) -> Iterator[Block]:
        for element in container.iterchildren():
            tag = element.tag
            if tag == _W_P:
                yield from self._paragraph(element)
            elif tag == _W_TBL:
                self.in_list = self.in_code = False
                for index, row in enumerate(_table_rows(element)):
                    yield from self.out.add(row, LINE if index else PARAGRAPH)
            elif tag == _W_SDT:
                if "Table of Contents" in _TOC_GALLERY(element):
                    continue
                content = element.find(_W_SDT_CONTENT)
                if content is not None:
                    yield from self.walk(content)
            elif tag == _W_CUSTOM_XML:
                yield from self.walk(element)

    def _paragraph(self, p: Any) -> list[Block]:
        style = _style_id(p) or self.styles.default
        if style in self.styles.skipped:
            return []
        text = _paragraph_text(p)
        if style in self.styles.code:
            # Code keeps its indentation and blank lines; in Word each line is a paragraph.
            if not text.strip():
                self.code_gap = self.in_code
                return []
            separator = PARAGRAPH if self.code_gap or not self.in_code else LINE
            self.in_code, self.in_list, self.code_gap = True, False, False
            return self.out.add(text.rstrip(), separator)
        self.in_code = self.code_gap = False
        if not text.strip():
            return []
        level = self.styles.headings.get(style) if style is not None else None
        if level is not None:
            self.in_list = False
            return self.out.heading(level, text)
        if style in self.styles.lists or _is_numbered(p):
            separator = LINE if self.in_list else PARAGRAPH
            self.in_list = True
            return self.out.add("- " + text.strip(), separator)
        self.in_list = False
        return self.out.add(text, PARAGRAPH)


class DocxParser:
    """Word documents (.docx)."""

    content_type = ContentType.DOCX

    def parse(self, path: Path) -> Iterator[Block]:
        document = _load(path)
        walker = _Walker(_Styles(document))
        yield from walker.walk(document.element.body)
        yield from walker.out.flush()
