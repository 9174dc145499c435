from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from knowledgeops.errors import PermanentError, UserActionRequired
from knowledgeops.ingest.parsers import limits as parse_limits
from knowledgeops.ingest.parsers.base import Block
from knowledgeops.ingest.parsers.epub import EpubParser
from knowledgeops.ingest.parsers.limits import ParseLimits
from tests.fixtures.documents import make_docx_bomb, make_random_bytes
from tests.fixtures.office import Chapter, EpubOptions, make_epub


def parse_epub(path: Path) -> list[Block]:
    return list(EpubParser().parse(path))


EXPECTED = [
    ("The lighthouse", "The lighthouse\n\nThe keeper trimmed the wick nightly."),
    ("Storm season", "Storm season\n\nGales bent the marram grass."),
    ("Storm season › Aftermath", "Aftermath\n\nDriftwood covered the shingle beach."),
]


@pytest.mark.parametrize("nav", [True, False], ids=["epub3-nav", "epub2-ncx"])
def test_chapters_in_spine_order_titled_by_the_table_of_contents(tmp_path: Path, nav: bool) -> None:
    blocks = parse_epub(make_epub(tmp_path / "b.epub", options=EpubOptions(nav=nav)))
    assert [(b.section, b.text) for b in blocks] == EXPECTED
    assert all(b.page is None for b in blocks)


def test_the_spine_decides_the_order_and_the_toc_title_heads_the_path(tmp_path: Path) -> None:
    chapters = [
        Chapter("Epilogue", "<p>The end of the voyage.</p>", file="z-last.xhtml"),
        Chapter("Prologue", "<h1>1. Setting sail</h1><p>We left at dawn.</p>", file="a.xhtml"),
    ]
    blocks = parse_epub(make_epub(tmp_path / "b.epub", chapters))
    assert [(b.section, b.text) for b in blocks] == [
        ("Epilogue", "Epilogue\n\nThe end of the voyage."),
        ("Prologue › 1. Setting sail", "1. Setting sail\n\nWe left at dawn."),
    ]


def test_drm_protected_books_need_user_action_but_font_obfuscation_is_read(
    tmp_path: Path,
) -> None:
    locked = make_epub(
        tmp_path / "drm.epub", options=EpubOptions(encrypted=["text/chapter1.xhtml"])
    )
    with pytest.raises(UserActionRequired) as caught:
        parse_epub(locked)
    assert caught.value.code == "epub_drm"
    assert "DRM" in caught.value.message
    fonts = make_epub(tmp_path / "fonts.epub", options=EpubOptions(encrypted=["fonts/a.otf"]))
    assert len(parse_epub(fonts)) == 3


def test_broken_books_are_corrupt_with_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(PermanentError) as caught:
        parse_epub(make_random_bytes(tmp_path / "x.epub"))
    assert caught.value.code == "corrupt_file"
    good = make_epub(tmp_path / "good.epub")

    def without(name: str, drop: str) -> Path:
        path = tmp_path / name
        with zipfile.ZipFile(good) as source, zipfile.ZipFile(path, "w") as target:
            for item in source.infolist():
                if item.filename != drop:
                    target.writestr(item, source.read(item))
        return path

    with pytest.raises(PermanentError) as caught:
        parse_epub(without("a.epub", "META-INF/container.xml"))
    assert "META-INF/container.xml" in caught.value.message
    with pytest.raises(PermanentError) as caught:
        parse_epub(without("b.epub", "OEBPS/content.opf"))
    assert "OEBPS/content.opf" in caught.value.message
    with pytest.raises(PermanentError) as caught:
        parse_epub(without("c.epub", "OEBPS/text/chapter2.xhtml"))
    assert "chapter2.xhtml is missing" in caught.value.message
    # a broken table of contents costs the titles, not the text
    blocks = parse_epub(without("d.epub", "OEBPS/nav.xhtml"))
    assert [b.text for b in blocks] == [text for _, text in EXPECTED]
    assert blocks[0].section == "The lighthouse"  # from the chapter's own <h1>


def test_entities_are_not_expanded_and_bombs_and_huge_chapters_are_refused(
    tmp_path: Path,
) -> None:
    laughs = (
        '<!DOCTYPE x [<!ENTITY a "hahahahahahahahahaha"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;">'
        '<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;"><!ENTITY secret SYSTEM "file:///etc/passwd">]>'
    )
    book = make_epub(tmp_path / "e.epub")
    evil = tmp_path / "evil.epub"
    with zipfile.ZipFile(book) as source, zipfile.ZipFile(evil, "w") as target:
        for item in source.infolist():
            data = source.read(item)
            if item.filename == "OEBPS/content.opf":
                data = data.replace(b"?>", b"?>" + laughs.encode(), 1)
                data = data.replace(b"<dc:title>Coast", b"<dc:title>&c;&secret;Coast")
            target.writestr(item, data)
    assert [b.text for b in parse_epub(evil)] == [text for _, text in EXPECTED]
    bomb = make_docx_bomb(tmp_path / "bomb.epub", book)
    with pytest.raises(PermanentError) as caught:
        parse_epub(bomb)
    assert caught.value.code == "zip_bomb"
    with (
        parse_limits.using(ParseLimits(max_html_mb=0.00005)),
        pytest.raises(UserActionRequired) as too_large,
    ):
        parse_epub(book)
    assert "KOPS_MAX_HTML_MB" in too_large.value.message
