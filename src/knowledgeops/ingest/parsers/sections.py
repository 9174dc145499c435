"""Turns a stream of headings and paragraphs into section-tagged blocks of bounded size.

Shared by the parsers of formats with headings (Markdown, HTML, DOCX). A heading closes the
current section's block, replaces the headings at its level and below in the section path
("Install › Linux"), and becomes the first line of the new section's text.
"""

from __future__ import annotations

from knowledgeops.ingest.parsers.base import Block

SECTION_SEPARATOR = " › "
MAX_BLOCK_CHARS = 16 * 1024
PARAGRAPH = "\n\n"
LINE = "\n"


def table_cell(text: str) -> str:
    """A cell's text on one line, its pipes escaped, for a Markdown table row."""
    return " ".join(text.split()).replace("|", "\\|")


def table_lines(rows: list[list[str]]) -> list[str]:
    """Rows of cells (already `table_cell`ed) as Markdown table lines: the first row a header,
    then its rule, then the others, every row padded to the widest one. Rows with no text are
    dropped; a table of a single column (a layout table, a boxed note) is plain lines."""
    rows = [row for row in rows if any(row)]
    if not rows:
        return []
    width = max(len(row) for row in rows)
    if width == 1:
        return [row[0] for row in rows]
    lines = [table_row(row + [""] * (width - len(row))) for row in rows]
    lines.insert(1, table_rule(width))
    return lines


def table_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def table_rule(columns: int) -> str:
    return "|" + " --- |" * columns


def split_long_text(text: str, limit: int) -> list[str]:
    """Cut `text` into pieces of at most `limit` chars, at a line end or space where possible."""
    pieces: list[str] = []
    while len(text) > limit:
        cut = text.rfind("\n", limit // 2, limit)
        if cut == -1:
            cut = text.rfind(" ", limit // 2, limit)
        cut = limit if cut == -1 else cut + 1
        pieces.append(text[:cut])
        text = text[cut:]
    if text:
        pieces.append(text)
    return pieces


class SectionBuilder:
    """Collects text under the current heading path and hands out finished blocks."""

    def __init__(self, max_chars: int = MAX_BLOCK_CHARS) -> None:
        self.max_chars = max_chars
        self._headings: list[tuple[int, str]] = []
        self._parts: list[str] = []
        self._size = 0
        self._body = False  # text besides the heading went into the current block
        self._handed_out = False  # a block has been handed out

    @property
    def section(self) -> str | None:
        """The current heading path, or None before the first heading."""
        if not self._headings:
            return None
        path: list[str] = []
        for _, title in self._headings:
            if not path or path[-1] != title:  # "Setup › Setup" says nothing more than "Setup"
                path.append(title)
        return SECTION_SEPARATOR.join(path)

    def heading(self, level: int, title: str) -> list[Block]:
        """Start a section at `level` (smaller is higher; 0 = document title) titled `title`."""
        title = " ".join(title.split())
        if not title:
            return []
        blocks = self._take(last=False)
        while self._headings and self._headings[-1][0] >= level:
            self._headings.pop()
        self._headings.append((level, title))
        self._append(title, PARAGRAPH)
        return blocks

    def add(self, text: str, separator: str = PARAGRAPH) -> list[Block]:
        """Add a paragraph (separator "\\n\\n") or a line (separator "\\n") of text."""
        if not text.strip():
            return []
        blocks: list[Block] = []
        for piece in split_long_text(text, self.max_chars):
            if self._parts and self._size + len(separator) + len(piece) > self.max_chars:
                blocks.extend(self._take(last=False))
            self._append(piece, separator)
            self._body = True
        return blocks

    def _append(self, text: str, separator: str) -> None:
        if self._parts:
            self._parts.append(separator)
            self._size += len(separator)
        self._parts.append(text)
        self._size += len(text)

    def flush(self) -> list[Block]:
        """Hand out the text collected so far as a block, at the end of the document (none if it
        is blank, or only a heading after other blocks)."""
        return self._take(last=True)

    def _take(self, *, last: bool) -> list[Block]:
        """The block collected so far: none if it is blank, or only a heading (a heading followed
        at once by another says nothing a chunk could answer, and stays in the section path of
        the blocks below it), unless it is the whole document."""
        text = "".join(self._parts).strip("\n")
        body = self._body
        self._parts = []
        self._size = 0
        self._body = False
        if not text.strip() or not (body or (last and not self._handed_out)):
            return []
        self._handed_out = True
        return [Block(text=text, section=self.section)]
