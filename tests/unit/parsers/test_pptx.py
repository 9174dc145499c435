from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from knowledgeops.errors import PermanentError, UserActionRequired
from knowledgeops.ingest.parsers import limits as parse_limits
from knowledgeops.ingest.parsers.base import Block
from knowledgeops.ingest.parsers.limits import ParseLimits
from knowledgeops.ingest.parsers.pptx import PptxParser
from tests.fixtures.documents import make_docx_bomb, make_ole2, make_random_bytes
from tests.fixtures.office import Slide, make_pptx


def parse_pptx(path: Path) -> list[Block]:
    return list(PptxParser().parse(path))


def test_a_block_per_slide_numbered_as_pages_titled_as_sections(tmp_path: Path) -> None:
    blocks = parse_pptx(make_pptx(tmp_path / "deck.pptx"))
    assert [(b.page, b.section) for b in blocks] == [
        (1, "Quarterly review"),
        (2, "Regional figures"),
        (3, None),
    ]
    assert blocks[0].text == (
        "Quarterly review\n\nRevenue rose in the lighthouse district\n\nNotes:\nMention tides"
    )
    # the table as Markdown rows, and the text of a box inside a group shape
    assert blocks[1].text == (
        "Regional figures\n\n| Region | Sales |\n| --- | --- |\n| North | 120 |\n| South | 95 |"
        "\n\nGrouped caption about harbour cranes"
    )
    assert blocks[2].text == "A slide without a title about copper kettles"


def test_empty_slides_are_skipped_and_numbers_stay_the_slides(tmp_path: Path) -> None:
    deck = make_pptx(
        tmp_path / "d.pptx", [Slide(None), Slide("Second slide", ["Only text here"]), Slide(None)]
    )
    assert [(b.page, b.section) for b in parse_pptx(deck)] == [(2, "Second slide")]


def test_a_damaged_presentation_is_corrupt(tmp_path: Path) -> None:
    with pytest.raises(PermanentError) as caught:
        parse_pptx(make_random_bytes(tmp_path / "x.pptx"))
    assert caught.value.code == "corrupt_file"
    assert "PowerPoint" in caught.value.message
    broken = tmp_path / "broken.pptx"
    with (
        zipfile.ZipFile(make_pptx(tmp_path / "ok.pptx")) as source,
        zipfile.ZipFile(broken, "w") as target,
    ):
        for item in source.infolist():
            data = source.read(item)
            if item.filename == "ppt/presentation.xml":
                data = data[: len(data) // 2]
            target.writestr(item, data)
    with pytest.raises(PermanentError) as caught:
        parse_pptx(broken)
    assert caught.value.code == "corrupt_file"


def test_a_package_without_a_presentation_part_names_it(tmp_path: Path) -> None:
    path = tmp_path / "x.pptx"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
    with pytest.raises(PermanentError) as caught:
        parse_pptx(path)
    assert "ppt/presentation.xml" in caught.value.message


def test_encrypted_and_bombed_presentations_are_refused_unopened(tmp_path: Path) -> None:
    with pytest.raises(UserActionRequired) as caught:
        parse_pptx(make_ole2(tmp_path / "secret.pptx"))
    assert caught.value.code == "pptx_encrypted"
    bomb = make_docx_bomb(tmp_path / "bomb.pptx", make_pptx(tmp_path / "ok.pptx"))
    with pytest.raises(PermanentError) as caught:
        parse_pptx(bomb)
    assert caught.value.code == "zip_bomb"
    with (
        parse_limits.using(ParseLimits(max_unzipped_mb=0.01)),
        pytest.raises(UserActionRequired) as too_large,
    ):
        parse_pptx(make_pptx(tmp_path / "big.pptx"))
    assert too_large.value.code == "too_large"
    assert "KOPS_MAX_UNZIPPED_MB" in too_large.value.message
