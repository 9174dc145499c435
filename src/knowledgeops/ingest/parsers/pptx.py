"""PowerPoint (.pptx) via python-pptx: a block per slide, its number the page, its title the
section; the text of its shapes (groups opened), its tables as Markdown rows, its speaker notes.

The package is checked by package.py (size, ZIP bomb) before python-pptx inflates anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pptx
from pptx.enum.shapes import MSO_SHAPE_TYPE, PP_PLACEHOLDER

from knowledgeops.errors import PermanentError
from knowledgeops.ingest.parsers.base import Block, ContentType
from knowledgeops.ingest.parsers.package import open_package
from knowledgeops.ingest.parsers.sections import (
    LINE,
    MAX_BLOCK_CHARS,
    PARAGRAPH,
    split_long_text,
    table_cell,
    table_lines,
)

KIND = "PowerPoint presentation"
PRESENTATION_PART = "ppt/presentation.xml"
MAX_GROUP_DEPTH = 16  # groups inside groups: deeper ones are not opened
NOTES_LABEL = "Notes:"
_TITLES = (PP_PLACEHOLDER.TITLE, PP_PLACEHOLDER.CENTER_TITLE, PP_PLACEHOLDER.VERTICAL_TITLE)


def _load(path: Path) -> Any:
    with open_package(path, KIND, ".pptx", required=(PRESENTATION_PART,)):
        pass
    try:
        return pptx.Presentation(str(path))
    except MemoryError:
        raise
    except Exception as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise PermanentError(
            f"The file could not be read as a PowerPoint presentation ({reason[:200]}). It may "
            "be damaged; save it again as .pptx and upload the new copy.",
            code="corrupt_file",
        ) from exc


def _lines(text_frame: Any) -> list[str]:
    """A text frame's paragraphs, one line each (a line break inside one stays a line)."""
    lines: list[str] = []
    for paragraph in text_frame.paragraphs:
        for line in paragraph.text.replace("\v", "\n").split("\n"):
            if line.strip():
                lines.append(" ".join(line.split()))
    return lines


def _table(table: Any) -> str:
    rows = [[table_cell(cell.text.replace("\v", " ")) for cell in row.cells] for row in table.rows]
    return LINE.join(table_lines(rows))


def _is_title(shape: Any) -> bool:
    if not shape.is_placeholder:
        return False
    try:
        return shape.placeholder_format.type in _TITLES
    except ValueError:  # a placeholder element without a type python-pptx knows
        return False


def _shape_texts(shapes: Iterable[Any], depth: int = 0) -> Iterator[str]:
    """The text of each shape that has any, in the slide's order, groups opened."""
    for shape in shapes:
        if shape.shape_type == MSO_SHAPE_TYPE.GROUP:
            if depth < MAX_GROUP_DEPTH:
                yield from _shape_texts(shape.shapes, depth + 1)
        elif shape.has_table:
            text = _table(shape.table)
            if text:
                yield text
        elif shape.has_text_frame and not _is_title(shape):
            lines = _lines(shape.text_frame)
            if lines:
                yield LINE.join(lines)


def _title(slide: Any) -> str | None:
    for shape in slide.placeholders:
        if _is_title(shape) and shape.has_text_frame:
            title = " ".join(shape.text_frame.text.split())
            if title:
                return title
    return None


def _notes(slide: Any) -> str | None:
    if not slide.has_notes_slide:
        return None
    frame = slide.notes_slide.notes_text_frame
    if frame is None:
        return None
    lines = _lines(frame)
    return NOTES_LABEL + LINE + LINE.join(lines) if lines else None


class PptxParser:
    """PowerPoint presentations (.pptx)."""

    content_type = ContentType.PPTX

    def parse(self, path: Path) -> Iterator[Block]:
        presentation = _load(path)
        for number, slide in enumerate(presentation.slides, start=1):
            title = _title(slide)
            parts = [title] if title else []
            parts.extend(_shape_texts(slide.shapes))
            notes = _notes(slide)
            if notes:
                parts.append(notes)
            text = PARAGRAPH.join(parts)
            if not text.strip():
                continue
            for piece in split_long_text(text, MAX_BLOCK_CHARS):
                yield Block(text=piece.strip("\n"), page=number, section=title)
