from __future__ import annotations

from pathlib import Path

import docx
import pytest

from knowledgeops.errors import ErrorCategory, PermanentError, UserActionRequired
from knowledgeops.ingest.parsers.base import Block
from knowledgeops.ingest.parsers.docx import DocxParser
from knowledgeops.ingest.parsers.sections import MAX_BLOCK_CHARS
from tests.fixtures.documents import (
    DocxPart,
    Heading,
    Para,
    Table,
    make_docx,
    make_docx_bomb,
    make_docx_with_broken_xml,
    make_docx_without_document,
    make_ole2,
    make_random_bytes,
)


def parse_docx(path: Path) -> list[Block]:
    return list(DocxParser().parse(path))


def test_headings_set_the_section_path(tmp_path: Path) -> None:
    blocks = parse_docx(make_docx(tmp_path / "r.docx"))
    assert [b.section for b in blocks] == [
        "Annual Report",
        "Annual Report › Results",
        "Annual Report › Results › Regional results",
        "Annual Report › Outlook",
    ]
    assert blocks[0].text == "Annual Report\n\nThis report covers the year."


def test_paragraphs_lists_and_tables_keep_document_order(tmp_path: Path) -> None:
    results = parse_docx(make_docx(tmp_path / "r.docx"))[1]
    assert results.text == (
        "Results\n\n"
        "Revenue grew strongly.\n\n"
        "- First point\n- Second point\n\n"
        "| Quarter | Revenue |\n| --- | --- |\n| Q1 | 100 |\n| Q2 | 120 |\n\n"
        "Text after the table."
    )


def test_heading_levels_form_a_stack(tmp_path: Path) -> None:
    parts: list[DocxPart] = [
        Heading("A", 1),
        Para("a"),
        Heading("B", 2),
        Para("b"),
        Heading("C", 3),
        Para("c"),
        Heading("D", 2),
        Para("d"),
        Heading("E", 1),
        Para("e"),
    ]
    blocks = parse_docx(make_docx(tmp_path / "s.docx", parts))
    assert [b.section for b in blocks] == ["A", "A › B", "A › B › C", "A › D", "E"]


def test_runs_breaks_tabs_and_code_styles(tmp_path: Path) -> None:
    document = docx.Document()
    paragraph = document.add_paragraph("Bold ")
    paragraph.add_run("and plain").bold = True
    paragraph.add_run().add_break()
    paragraph.add_run("after\tbreak")
    for line in ("fn main() {", '    println!("hi");', "", "}"):
        document.add_paragraph(line, style="macro")  # "Macro Text": a code style
    document.add_paragraph("Prose after code.")
    path = tmp_path / "runs.docx"
    document.save(str(path))
    (block,) = parse_docx(path)
    assert block.text == (
        'Bold and plain\nafter\tbreak\n\nfn main() {\n    println!("hi");\n\n}\n\nProse after code.'
    )


def test_merged_and_empty_cells(tmp_path: Path) -> None:
    document = docx.Document()
    table = document.add_table(rows=3, cols=3)
    table.cell(0, 0).merge(table.cell(0, 1)).text = "Wide"
    table.cell(0, 2).text = "C"
    table.cell(1, 0).text = "x"
    table.cell(1, 2).text = "z"
    path = tmp_path / "t.docx"
    document.save(str(path))
    (block,) = parse_docx(path)
    # A merged cell appears once and keeps the columns aligned; an empty cell stays as a gap;
    # an empty row is dropped; the table is Markdown, its first row the header.
    assert block.text == "| Wide |  | C |\n| --- | --- | --- |\n| x |  | z |"


def test_long_documents_are_split_into_bounded_blocks(tmp_path: Path) -> None:
    parts = [Heading("Long", 1)] + [Para(f"Sentence number {i} here. " * 20) for i in range(300)]
    blocks = parse_docx(make_docx(tmp_path / "l.docx", parts))
    assert len(blocks) > 5
    assert all(b.section == "Long" for b in blocks)
    assert all(len(b.text) <= MAX_BLOCK_CHARS for b in blocks)
    assert sum(b.text.count("Sentence number 299 here.") for b in blocks) == 20


def test_table_only_document(tmp_path: Path) -> None:
    blocks = parse_docx(make_docx(tmp_path / "t.docx", [Table([["a", "b"], ["c", "d"]])]))
    assert blocks == [Block(text="| a | b |\n| --- | --- |\n| c | d |")]


def test_a_single_column_table_is_plain_lines_and_pipes_in_cells_are_escaped(
    tmp_path: Path,
) -> None:
    blocks = parse_docx(make_docx(tmp_path / "t.docx", [Table([["Note"], ["Boxed text"]])]))
    assert blocks == [Block(text="Note\nBoxed text")]
    blocks = parse_docx(make_docx(tmp_path / "p.docx", [Table([["a|b", "c"], ["1", "2"]])]))
    assert blocks == [Block(text="| a\\|b | c |\n| --- | --- |\n| 1 | 2 |")]


def test_random_bytes_are_corrupt(tmp_path: Path) -> None:
    with pytest.raises(PermanentError) as caught:
        parse_docx(make_random_bytes(tmp_path / "x.docx"))
    assert caught.value.code == "corrupt_file"


def test_zip_without_document_xml_is_corrupt(tmp_path: Path) -> None:
    with pytest.raises(PermanentError) as caught:
        parse_docx(make_docx_without_document(tmp_path / "x.docx"))
    assert caught.value.code == "corrupt_file"
    assert "word/document.xml" in caught.value.message


def test_broken_xml_is_corrupt(tmp_path: Path) -> None:
    source = make_docx(tmp_path / "good.docx")
    with pytest.raises(PermanentError) as caught:
        parse_docx(make_docx_with_broken_xml(tmp_path / "bad.docx", source))
    assert caught.value.code == "corrupt_file"


def test_encrypted_office_file_needs_user_action(tmp_path: Path) -> None:
    with pytest.raises(UserActionRequired) as caught:
        parse_docx(make_ole2(tmp_path / "secret.docx"))
    assert caught.value.code == "docx_encrypted"
    assert caught.value.category is ErrorCategory.USER_ACTION_REQUIRED
    assert "password" in caught.value.message


def test_zip_bombs_are_refused_before_inflating(tmp_path: Path) -> None:
    source = make_docx(tmp_path / "good.docx")
    bomb = make_docx_bomb(tmp_path / "bomb.docx", source, inflated_mb=4)
    assert bomb.stat().st_size < 200_000
    with pytest.raises(PermanentError) as caught:
        parse_docx(bomb)
    assert caught.value.code == "zip_bomb"
