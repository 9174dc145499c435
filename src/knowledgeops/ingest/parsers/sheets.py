"""Rows of a table (a spreadsheet's sheet, a CSV file) as text a chunk can answer from: each row
one line of `header: value` pairs, so every chunk carries its column names.

The first row with any value is the header when all its values are text (not numbers or
dates); otherwise the columns are named by their letters (A, B, …, AA). Rows and cells are
counted against KOPS_MAX_SHEET_ROWS (one sheet) and KOPS_MAX_SHEET_CELLS (the document).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator
from decimal import Decimal

from knowledgeops.errors import UserActionRequired
from knowledgeops.ingest.parsers.base import Block
from knowledgeops.ingest.parsers.limits import current as current_limits
from knowledgeops.ingest.parsers.sections import LINE, SectionBuilder

PAIR_SEPARATOR = "; "
MAX_CELL_CHARS = 4_000  # a cell's text beyond this is cut (with "…"): a row stays readable


def column_letter(index: int) -> str:
    """The spreadsheet name of the 0-based column `index` (0 → A, 26 → AA)."""
    name = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        name = chr(65 + rest) + name
    return name


def cell_text(value: object) -> str:
    """A cell's value as text: numbers without a needless ".0", dates in ISO form."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.15g}"
    if isinstance(value, dt.datetime):
        if value.time() == dt.time(0):
            return value.date().isoformat()
        return value.isoformat(sep=" ")
    if isinstance(value, dt.date | dt.time | int | Decimal):
        return str(value) if not isinstance(value, dt.date | dt.time) else value.isoformat()
    text = " ".join(str(value).split())
    if len(text) > MAX_CELL_CHARS:
        text = text[: MAX_CELL_CHARS - 1] + "…"
    return text


def _is_number(text: str) -> bool:
    try:
        float(text.replace(",", ""))
    except ValueError:
        return False
    return True


def _is_header(row: list[object]) -> bool:
    values = [v for v in row if v is not None and cell_text(v)]
    return bool(values) and all(isinstance(v, str) and not _is_number(cell_text(v)) for v in values)


class RowCounter:
    """The rows and cells of one document read so far, refused past the limits."""

    def __init__(self) -> None:
        self.cells = 0

    def sheet(self, name: str | None) -> Iterator[None]:
        """Counts the rows of one sheet: advance it once per row."""
        limits = current_limits()
        rows = 0
        while True:
            rows += 1
            if rows > limits.max_sheet_rows:
                where = f"The sheet {name!r}" if name else "The table"
                raise UserActionRequired(
                    f"{where} has more than {limits.max_sheet_rows:,} rows; this server reads "
                    "at most that many of one sheet (KOPS_MAX_SHEET_ROWS). Split it into "
                    "smaller files.",
                    code="too_many_rows",
                )
            yield None

    def add_cells(self, count: int) -> None:
        self.cells += count
        most = current_limits().max_sheet_cells
        if self.cells > most:
            raise UserActionRequired(
                f"The file has more than {most:,} cells; this server reads at most that many "
                "of one document (KOPS_MAX_SHEET_CELLS). Split it into smaller files.",
                code="too_many_cells",
            )


def sheet_blocks(
    rows: Iterable[Iterable[object]],
    name: str | None,
    counter: RowCounter,
) -> Iterator[Block]:
    """The blocks of one sheet named `name` (its section; None for a CSV file): the sheet's name
    first, then a line per row that has a value (the header row itself is not repeated: its
    names are in every row's line)."""
    out = SectionBuilder()
    if name:
        out.heading(1, name)
    headers: list[str] | None = None
    data_rows = False
    rows_seen = counter.sheet(name)
    for raw in rows:
        next(rows_seen)
        row = list(raw)
        counter.add_cells(len(row))
        if headers is None:
            if not any(cell_text(v) for v in row):
                continue
            if _is_header(row):
                headers = [cell_text(v) for v in row]
                continue
            headers = []
        pairs = []
        for index, value in enumerate(row):
            text = cell_text(value)
            if not text:
                continue
            header = headers[index] if index < len(headers) and headers[index] else None
            pairs.append(f"{header or column_letter(index)}: {text}")
        if pairs:
            data_rows = True
            yield from out.add(PAIR_SEPARATOR.join(pairs), LINE)
    if headers and not data_rows:  # a table of one row: its text is all there is
        out.add(PAIR_SEPARATOR.join(h for h in headers if h), LINE)
    yield from out.flush()
