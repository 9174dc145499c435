from __future__ import annotations

import time
from pathlib import Path

import pytest

from knowledgeops.ingest.parsers.base import Block
from knowledgeops.ingest.parsers.html import HtmlParser, html_encoding
from knowledgeops.ingest.parsers.sections import MAX_BLOCK_CHARS
from tests.fixtures.documents import make_html

CHROME_TEXTS = (
    "ACME Docs",
    "Sidebar Chapter",
    "Sponsored",
    "hidden teaser",
    "decorative icon",
    "Search the site",
    "footer text",
    "do not index me",
    "head script",
    "css text",
    "Sample page",
)


def parse_html(path: Path) -> list[Block]:
    return list(HtmlParser().parse(path))


def all_text(blocks: list[Block]) -> str:
    return "\n\n".join(b.text for b in blocks)


@pytest.mark.parametrize("main", [True, False])
def test_scripts_styles_and_site_chrome_are_stripped(tmp_path: Path, main: bool) -> None:
    text = all_text(parse_html(make_html(tmp_path / "p.html", main=main)))
    for chrome in CHROME_TEXTS:
        assert chrome not in text
    assert "Welcome to the guide." in text


def test_headings_become_a_section_stack(tmp_path: Path) -> None:
    blocks = parse_html(make_html(tmp_path / "p.html"))
    assert [b.section for b in blocks] == [
        "Guide",
        "Guide › Setup",
        "Guide › Setup › Details",
        "Guide › Usage",  # the h2 replaced the earlier h2 and h3
    ]
    assert blocks[0].text == "Guide\n\nWelcome to the guide. It explains everything."


def test_blocks_lists_pre_and_tables_are_laid_out(tmp_path: Path) -> None:
    blocks = {b.section: b.text for b in parse_html(make_html(tmp_path / "p.html"))}
    setup = blocks["Guide › Setup"]
    assert "First paragraph of setup.\n\n- Step one\n- Step two" in setup
    # <pre> keeps its line breaks and indentation.
    assert 'fn main() {\n    println!("hi");\n}' in setup
    assert blocks["Guide › Setup › Details"] == (
        "Details\n\n| Key | Value |\n| --- | --- |\n| port | 8080 |"
    )


def test_inline_elements_join_and_whitespace_collapses(tmp_path: Path) -> None:
    body = (
        "<p>One <em>two</em>\n   <a href='#'>three</a><span>four</span><br>five</p><div>six</div>"
    )
    text = all_text(parse_html(make_html(tmp_path / "p.html", body, chrome=False)))
    assert text == "One two threefour\nfive\n\nsix"


def test_main_is_preferred_over_the_rest_of_the_page(tmp_path: Path) -> None:
    body = "<div>outside main</div><main><p>inside main</p></main><div>also outside</div>"
    text = all_text(parse_html(make_html(tmp_path / "p.html", body, main=False)))
    assert text == "inside main"


def test_a_single_article_is_preferred_and_its_header_kept(tmp_path: Path) -> None:
    body = (
        "<div class='promo'>Promo banner text</div>"
        "<article><header><h1>Post title</h1><p>By Ann</p></header><p>Post body.</p>"
        "<footer>Tags: news</footer></article>"
        "<div class='related'>Related links</div>"
    )
    blocks = parse_html(make_html(tmp_path / "p.html", body, main=False, chrome=False))
    text = all_text(blocks)
    assert "Promo" not in text
    assert "Related" not in text
    assert blocks[0].section == "Post title"
    assert "By Ann" in text
    assert "Post body." in text
    assert "Tags: news" in text


def test_several_articles_fall_back_to_the_body(tmp_path: Path) -> None:
    body = "<article><p>first post</p></article><article><p>second post</p></article>"
    text = all_text(parse_html(make_html(tmp_path / "p.html", body, main=False)))
    assert "first post" in text
    assert "second post" in text


def test_role_attributes_mark_chrome(tmp_path: Path) -> None:
    body = (
        "<div role='navigation'>Nav links</div><div role='banner'>Banner</div>"
        "<p>Content</p><div role='contentinfo'>Legal</div>"
        "<div style='display: none'>Invisible</div>"
    )
    text = all_text(parse_html(make_html(tmp_path / "p.html", body, chrome=False)))
    assert text == "Content"


@pytest.mark.parametrize("declared", ["windows-1252", "iso-8859-1", "latin1"])
def test_meta_charset_decides_the_encoding(tmp_path: Path, declared: str) -> None:
    body = "<p>Café “quoted” – naïve</p>"
    path = make_html(tmp_path / "p.html", body, encoding="cp1252", chrome=False)
    path.write_bytes(
        path.read_bytes().replace(b'charset="cp1252"', f'charset="{declared}"'.encode())
    )
    assert all_text(parse_html(path)) == "Café “quoted” – naïve"


def test_undeclared_encoding_is_detected(tmp_path: Path) -> None:
    body = "<p>Crème brûlée, Größe über Straße, señor.</p>"
    path = make_html(tmp_path / "p.html", body, encoding="latin-1", meta_charset=False)
    assert all_text(parse_html(path)) == "Crème brûlée, Größe über Straße, señor."


def test_utf16_with_bom(tmp_path: Path) -> None:
    page = "\ufeff<!doctype html><html><body><h1>标题</h1><p>中文内容。</p></body></html>"
    path = tmp_path / "p.html"
    path.write_bytes(page.encode("utf-16-le"))
    assert html_encoding(path.read_bytes()) == "utf-16"
    blocks = parse_html(path)
    assert blocks == [Block(text="标题\n\n中文内容。", section="标题")]


def test_long_sections_are_split_into_bounded_blocks(tmp_path: Path) -> None:
    body = (
        "<h1>Long</h1>"
        + "<p>"
        + "word " * 100
        + "</p>" * 1
        + ("<p>" + "filler text " * 80 + "</p>") * 300
    )
    blocks = parse_html(make_html(tmp_path / "p.html", body))
    assert len(blocks) > 5
    assert all(b.section == "Long" for b in blocks)
    assert all(len(b.text) <= MAX_BLOCK_CHARS for b in blocks)


def test_big_page_with_sidebar_parses_fast_and_skips_the_toc(tmp_path: Path) -> None:
    toc = "".join(f"<li><a href='#c{i}'>TOC entry {i}</a></li>" for i in range(2000))
    chapters = "".join(
        f"<h1 id='c{i}'>Chapter {i}</h1>"
        + f"<p>Body of chapter {i}. "
        + "Some prose text here. " * 30
        + "</p>"
        + "<pre><code>let x = 1;\nlet y = 2;</code></pre>"
        + "<script>highlight();</script>"
        for i in range(2000)
    )
    page = (
        "<!doctype html><html><head><title>Book</title></head><body>"
        f"<nav class='sidebar'><ol>{toc}</ol></nav><main>{chapters}</main></body></html>"
    )
    path = tmp_path / "book.html"
    path.write_text(page, encoding="utf-8")
    assert path.stat().st_size > 1_500_000
    started = time.perf_counter()
    blocks = parse_html(path)
    elapsed = time.perf_counter() - started
    assert elapsed < 3.0  # about 0.1 s on the dev machine; generous for slow CI
    assert blocks[0].section == "Chapter 0"
    assert blocks[0].text.startswith("Chapter 0\n\nBody of chapter 0.")
    assert "TOC entry" not in all_text(blocks)
    assert len({b.section for b in blocks}) == 2000


def test_navigation_tables_and_tables_of_contents_are_dropped(tmp_path: Path) -> None:
    # the shape of a DocBook page (the Debian FAQ): a navigation table above and below, a
    # table of contents under the chapter's title, then the sections
    body = (
        "<div class='navheader'><table summary='Navigation header'><tr><th colspan='3'>"
        "Chapter 3. Choosing a distribution</th></tr><tr><td><a href='a.html'><img src='p.png' "
        "alt='Prev'></a></td><th></th><td><a href='c.html'>Next</a></td></tr></table></div>"
        "<div class='chapter'><h1>Chapter 3. Choosing a distribution</h1>"
        "<div class='toc'><p><strong>Table of Contents</strong></p><dl><dt><a href='#s1'>3.1. "
        "Which distribution?</a></dt><dt><a href='#s2'>3.2. Why testing?</a></dt></dl></div>"
        "<h2>3.1. Which distribution?</h2><p>Stable is for servers.</p>"
        "<ul><li><a href='x'>Home</a></li><li><a href='y'>Download</a></li>"
        "<li><a href='z'>Support</a></li></ul>"
        "<table><tr><td></td><td> </td></tr><tr><td>suite</td><td>stable</td></tr></table>"
        "<h2>3.2. Why testing?</h2><p>Testing gets newer packages.</p></div>"
        "<table summary='Navigation footer'><tr><td><a href='a.html'>Prev</a></td>"
        "<td><a href='index.html'>Home</a></td><td><a href='c.html'>Next</a></td></tr></table>"
    )
    blocks = parse_html(make_html(tmp_path / "p.html", body, chrome=False))
    assert [b.text for b in blocks] == [
        "3.1. Which distribution?\n\nStable is for servers.\n\n| suite | stable |\n| --- | --- |",
        "3.2. Why testing?\n\nTesting gets newer packages.",
    ]
    assert blocks[0].section == "Chapter 3. Choosing a distribution › 3.1. Which distribution?"


def test_lists_of_links_inside_prose_are_kept(tmp_path: Path) -> None:
    body = (
        "<h1>Tools</h1><ul><li>Use <a href='a'>dpkg</a> for single package files and "
        "low-level work</li><li>Use <a href='b'>apt</a> to fetch packages with dependencies</li>"
        "<li>Use <a href='c'>aptitude</a> for a text interface</li></ul>"
    )
    text = all_text(parse_html(make_html(tmp_path / "p.html", body, chrome=False)))
    assert "- Use dpkg for single package files" in text


def test_a_page_that_is_only_a_heading_keeps_it(tmp_path: Path) -> None:
    blocks = parse_html(make_html(tmp_path / "p.html", "<h1>Just a title</h1>", chrome=False))
    assert [b.text for b in blocks] == ["Just a title"]


def test_tables_are_markdown_rows_with_spans_nested_tables_and_pipes(tmp_path: Path) -> None:
    body = (
        "<h1>Prices</h1><table><caption>Tea</caption>"
        "<tr><th>Item</th><th>Price | EUR</th></tr>"
        "<tr><td>Green<br>tea</td><td>3</td></tr>"
        "<tr><td colspan='2'>Total <b>3</b></td></tr>"
        "<tr><td><table><tr><td>in</td><td>ner</td></tr></table></td><td>x</td></tr>"
        "</table><p>After the table.</p>"
    )
    (block,) = parse_html(make_html(tmp_path / "t.html", body, chrome=False))
    assert block.text == (
        "Prices\n\nTea\n\n"
        "| Item | Price \\| EUR |\n| --- | --- |\n| Green tea | 3 |\n| Total 3 |  |\n"
        "| in ner | x |\n\nAfter the table."
    )
