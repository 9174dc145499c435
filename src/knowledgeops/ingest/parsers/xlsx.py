"""Excel workbooks (.xlsx, .xlsm) via openpyxl in read-only mode: each sheet a section, streamed
row by row (a sheet is never held whole), each row a line of `header: value` pairs (sheets.py).

The package is checked by package.py (size, ZIP bomb) before openpyxl inflates anything. The
values are those Excel last calculated (`data_only`): a formula's result, not its text. The
dimensions a file declares are ignored (`reset_dimensions`), so a sheet claiming a million
empty columns costs nothing.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import openpyxl

from knowledgeops.errors import PermanentError
from knowledgeops.ingest.parsers.base import Block, ContentType
from knowledgeops.ingest.parsers.package import open_package
from knowledgeops.ingest.parsers.sheets import RowCounter, sheet_blocks

KIND = "Excel workbook"
WORKBOOK_PART = "xl/workbook.xml"


def _load(path: Path, fh: BinaryIO) -> Any:
    """The workbook, read from `fh` (openpyxl refuses a path without an Excel extension, and
    stored files are named by their hash)."""
    with open_package(path, KIND, ".xlsx", required=(WORKBOOK_PART,)):
        pass
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # openpyxl warns of every extension it skips
            return openpyxl.load_workbook(fh, read_only=True, data_only=True)
    except MemoryError:
        raise
    except Exception as exc:
        raise _unreadable(exc) from exc


def _unreadable(exc: BaseException) -> PermanentError:
    reason = " ".join(str(exc).split()) or type(exc).__name__
    return PermanentError(
        f"The file could not be read as an Excel workbook ({reason[:200]}). It may be damaged; "
        "save it again as .xlsx and upload the new copy.",
        code="corrupt_file",
    )


class XlsxParser:
    """Excel workbooks (.xlsx)."""

    content_type = ContentType.XLSX

    def parse(self, path: Path) -> Iterator[Block]:
        with path.open("rb") as fh:
            workbook = _load(path, fh)
            try:
                counter = RowCounter()
                for sheet in workbook.worksheets:
                    if not hasattr(sheet, "iter_rows"):
                        continue  # a chart sheet
                    sheet.reset_dimensions()
                    rows = sheet.iter_rows(values_only=True)
                    yield from sheet_blocks(rows, sheet.title, counter)
            finally:
                workbook.close()
