from __future__ import annotations

from pathlib import Path

from knowledgeops.ingest.parsers.base import Block
from knowledgeops.ingest.parsers.markdown import MarkdownParser, strip_front_matter
from knowledgeops.ingest.parsers.sections import MAX_BLOCK_CHARS
from tests.fixtures.documents import make_markdown, make_text


def parse_md(path: Path) -> list[Block]:
    return list(MarkdownParser().parse(path))


def by_section(blocks: list[Block]) -> dict[str | None, str]:
    out: dict[str | None, str] = {}
    for block in blocks:
        out[block.section] = out.get(block.section, "") + block.text
    return out


def test_headings_become_section_paths(tmp_path: Path) -> None:
    blocks = parse_md(make_markdown(tmp_path / "a.md"))
    assert [b.section for b in blocks] == [
        "Install",
        "Install › Linux",
        "Install › Windows",
        "Usage",
    ]
    # Each section's text starts with its own heading.
    assert [b.text.split("\n")[0] for b in blocks] == ["Install", "Linux", "Windows", "Usage"]


def test_markup_is_removed_and_text_kept(tmp_path: Path) -> None:
    sections = by_section(parse_md(make_markdown(tmp_path / "a.md")))
    install = sections["Install"]
    assert "Download the installer from the site and run it." in install
    for markup in ("**", "[the site]", "](", "https://example.com", "# "):
        assert markup not in install
    assert "Run setup.exe as administrator." in sections["Install › Windows"]


def test_front_matter_is_dropped(tmp_path: Path) -> None:
    text = "\n".join(b.text for b in parse_md(make_markdown(tmp_path / "a.md")))
    assert "title: Sample" not in text
    assert strip_front_matter("---\na: 1\n---\nBody") == "Body"
    assert strip_front_matter("Body\n---\n") == "Body\n---\n"


def test_lists_tables_and_code_are_kept(tmp_path: Path) -> None:
    linux = by_section(parse_md(make_markdown(tmp_path / "a.md")))["Install › Linux"]
    assert "- apt on Debian\n- dnf on Fedora" in linux
    # Code is verbatim (inner spacing and the comment kept), without the fence.
    assert "sudo apt install kops   # verbatim code" in linux
    assert "```" not in linux
    assert "Distro | Command\nDebian | apt\nFedora | dnf" in linux


def test_heading_levels_form_a_stack(tmp_path: Path) -> None:
    source = (
        "# A\n\ntext a\n\n## B\n\ntext b\n\n### C\n\ntext c\n\n## D\n\ntext d\n\n# E\n\ntext e\n"
    )
    blocks = parse_md(make_markdown(tmp_path / "s.md", source))
    assert [b.section for b in blocks] == ["A", "A › B", "A › B › C", "A › D", "E"]


def test_text_before_the_first_heading_has_no_section(tmp_path: Path) -> None:
    blocks = parse_md(make_markdown(tmp_path / "s.md", "Preamble text.\n\n# Later\n\nBody.\n"))
    assert blocks[0] == Block(text="Preamble text.", section=None)
    assert blocks[1].section == "Later"


def test_ordered_nested_lists_and_inline_code(tmp_path: Path) -> None:
    source = "1. first `x = 1`\n2. second\n   - nested item\n3. third\n"
    text = parse_md(make_markdown(tmp_path / "l.md", source))[0].text
    assert text == "1. first x = 1\n2. second\n  - nested item\n3. third"


def test_soft_breaks_join_and_html_is_stripped(tmp_path: Path) -> None:
    source = (
        "A paragraph\nwrapped over\nthree lines.\n\n<div class='note'><b>Note:</b> html</div>\n"
    )
    text = parse_md(make_markdown(tmp_path / "h.md", source))[0].text
    assert text == "A paragraph wrapped over three lines.\n\nNote: html"


def test_long_sections_are_split_into_bounded_blocks(tmp_path: Path) -> None:
    paragraph = "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 10
    source = "# Big\n\n" + "\n\n".join([paragraph] * 200)
    blocks = parse_md(make_markdown(tmp_path / "big.md", source))
    assert len(blocks) > 5
    assert all(b.section == "Big" for b in blocks)
    assert all(len(b.text) <= MAX_BLOCK_CHARS for b in blocks)
    assert sum(b.text.count("Lorem ipsum") for b in blocks) == 2000


def test_legacy_encoded_markdown_is_decoded(tmp_path: Path) -> None:
    source = "# Résumé\n\nCafé crème, naïve façade, Größe über Straße.\n"
    blocks = parse_md(make_text(tmp_path / "l.md", source, encoding="latin-1"))
    assert blocks[0].section == "Résumé"
    assert "Café crème, naïve façade, Größe über Straße." in blocks[0].text
