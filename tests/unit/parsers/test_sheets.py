from __future__ import annotations

import datetime as dt
import zipfile
from pathlib import Path

import pytest

from knowledgeops.errors import PermanentError, UserActionRequired
from knowledgeops.ingest.parsers import limits as parse_limits
from knowledgeops.ingest.parsers.base import Block
from knowledgeops.ingest.parsers.delimited import CsvParser
from knowledgeops.ingest.parsers.limits import ParseLimits
from knowledgeops.ingest.parsers.sheets import cell_text, column_letter
from knowledgeops.ingest.parsers.xlsx import XlsxParser
from tests.fixtures.documents import make_docx_bomb, make_random_bytes
from tests.fixtures.office import make_csv, make_xlsx


def parse_xlsx(path: Path) -> list[Block]:
    return list(XlsxParser().parse(path))


def parse_csv(path: Path) -> list[Block]:
    return list(CsvParser().parse(path))


def test_each_sheet_is_a_section_and_each_row_names_its_columns(tmp_path: Path) -> None:
    blocks = parse_xlsx(make_xlsx(tmp_path / "book.xlsx"))
    assert [b.section for b in blocks] == ["Inventory", "Staff", "Numbers only"]
    assert blocks[0].text == (
        "Inventory\n"
        "Item: Brass lantern; Count: 12; Checked: 2024-03-01\n"
        "Item: Oak barrel; Count: 3.5; Checked: 2024-03-02 14:30:00\n"
        "Item: Signal flag; Count: 40"
    )
    assert blocks[1].text == (
        "Staff\nName: Ada Quill; Role: harbour master\nName: Bo Reed; Role: net mender"
    )
    # a sheet whose first row holds numbers has no header: columns go by their letters
    assert blocks[2].text == "Numbers only\nA: 1; B: 2; C: 3\nA: 4; B: 5; C: 6"
    assert all(b.page is None for b in blocks)


def test_formulas_give_their_last_calculated_value_and_wide_dimensions_cost_nothing(
    tmp_path: Path,
) -> None:
    import openpyxl  # noqa: PLC0415 (only this test writes a formula)

    workbook = openpyxl.Workbook()
    sheet = workbook.active
    sheet.title = "Totals"
    sheet.append(["Item", "Price"])
    sheet.append(["Rope", 4])
    sheet["B3"] = "=SUM(B2:B2)"
    path = tmp_path / "f.xlsx"
    workbook.save(str(path))
    # a declared dimension of the whole sheet, as some writers leave it
    patched = tmp_path / "p.xlsx"
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(patched, "w") as target:
        for item in source.infolist():
            data = source.read(item)
            if item.filename == "xl/worksheets/sheet1.xml":
                data = data.replace(
                    b'<dimension ref="A1:B3"/>', b'<dimension ref="A1:XFD1048576"/>'
                )
            target.writestr(item, data)
    (block,) = parse_xlsx(patched)
    # openpyxl writes no cached value for a formula: the cell is empty rather than "=SUM(…)"
    assert block.text == "Totals\nItem: Rope; Price: 4"


def test_row_and_cell_limits_name_their_settings(tmp_path: Path) -> None:
    rows: list[list[object]] = [["N"]] + [[n] for n in range(50)]
    book = make_xlsx(tmp_path / "b.xlsx", {"Long": rows})
    with (
        parse_limits.using(ParseLimits(max_sheet_rows=20)),
        pytest.raises(UserActionRequired) as caught,
    ):
        parse_xlsx(book)
    assert caught.value.code == "too_many_rows"
    assert "'Long'" in caught.value.message
    assert "KOPS_MAX_SHEET_ROWS" in caught.value.message
    table = make_csv(tmp_path / "c.csv", [["a", "b", "c"]] * 40)
    with (
        parse_limits.using(ParseLimits(max_sheet_cells=100)),
        pytest.raises(UserActionRequired) as caught,
    ):
        parse_csv(table)
    assert caught.value.code == "too_many_cells"
    assert "KOPS_MAX_SHEET_CELLS" in caught.value.message


def test_damaged_and_bombed_workbooks_are_refused(tmp_path: Path) -> None:
    with pytest.raises(PermanentError) as caught:
        parse_xlsx(make_random_bytes(tmp_path / "x.xlsx"))
    assert caught.value.code == "corrupt_file"
    bomb = make_docx_bomb(tmp_path / "bomb.xlsx", make_xlsx(tmp_path / "ok.xlsx"))
    with pytest.raises(PermanentError) as caught:
        parse_xlsx(bomb)
    assert caught.value.code == "zip_bomb"


@pytest.mark.parametrize(
    ("delimiter", "encoding"), [(",", "utf-8"), (";", "cp1252"), ("\t", "utf-16"), ("|", "utf-8")]
)
def test_csv_dialect_and_encoding_are_found(tmp_path: Path, delimiter: str, encoding: str) -> None:
    rows = [["Name", "City"], ["Zoë", "Kraków, Poland"], ["Ana", 'The "Port" quarter']]
    path = make_csv(tmp_path / "t.csv", rows, delimiter=delimiter, encoding=encoding)
    if encoding == "cp1252":
        rows[1][1] = "Krakow, Poland"
        path = make_csv(tmp_path / "t.csv", rows, delimiter=delimiter, encoding=encoding)
    (block,) = parse_csv(path)
    assert block.section is None
    assert block.text.splitlines() == [
        f"Name: Zoë; City: {rows[1][1]}",
        'Name: Ana; City: The "Port" quarter',
    ]


def test_csv_quoted_newlines_stay_in_their_cell_and_a_runaway_field_is_named(
    tmp_path: Path,
) -> None:
    path = make_csv(tmp_path / "q.csv", [["Note", "Id"], ["line one\nline two", "7"]])
    (block,) = parse_csv(path)
    assert block.text == "Note: line one line two; Id: 7"
    # an opening quote never closed swallows the rest of the file into one field
    runaway = tmp_path / "r.csv"
    runaway.write_text('Note,Id\n"never closed,1\n' + "more text\n" * 200_000)
    with pytest.raises(PermanentError) as caught:
        parse_csv(runaway)
    assert caught.value.code == "corrupt_file"
    assert "near line" in caught.value.message
    assert "balanced quotes" in caught.value.message


def test_csv_rows_are_streamed_into_bounded_blocks(tmp_path: Path) -> None:
    rows = [["Id", "Text"]] + [[str(n), f"row number {n} " * 5] for n in range(3000)]
    blocks = parse_csv(make_csv(tmp_path / "big.csv", rows))
    assert len(blocks) > 5
    assert all(len(b.text) <= 16 * 1024 for b in blocks)
    assert sum(b.text.count("\n") + 1 for b in blocks) == 3000
    assert all(line.startswith("Id: ") for b in blocks for line in b.text.splitlines())


def test_cell_values_and_column_letters() -> None:
    assert [column_letter(n) for n in (0, 25, 26, 701, 702)] == ["A", "Z", "AA", "ZZ", "AAA"]
    assert cell_text(3.0) == "3"
    assert cell_text(0.1 + 0.2) == "0.3"
    assert cell_text(True) == "TRUE"
    assert cell_text(dt.datetime(2024, 1, 2)) == "2024-01-02"
    assert cell_text(dt.time(7, 5)) == "07:05:00"
    assert cell_text("  a \n b ") == "a b"
    assert cell_text(None) == ""


def test_a_file_too_short_to_sniff_splits_on_the_delimiter_its_line_has_most_of(
    tmp_path: Path,
) -> None:
    one = tmp_path / "one.csv"
    one.write_text("Port\tHigh tide\n")
    # a table of a single row keeps its text (its cells, not column names of nothing)
    assert parse_csv(one) == [Block(text="Port; High tide")]
    rows = tmp_path / "rows.csv"
    rows.write_text("Whitby\t6\n")
    assert parse_csv(rows) == [Block(text="A: Whitby; B: 6")]
