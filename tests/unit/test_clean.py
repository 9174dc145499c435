from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from knowledgeops.ingest.clean import (
    RepeatedLineStripper,
    clean_blocks,
    clean_text,
    strip_repeated_edges,
)
from knowledgeops.ingest.parsers.base import Block
from knowledgeops.ingest.parsers.pdf import PdfParser
from tests.fixtures.documents import make_pdf

# --- clean_text ---------------------------------------------------------------------------------


def test_nfc_not_nfkc() -> None:
    assert clean_text("Cafe\u0301") == "Café"  # combining accent composed
    assert clean_text("ﬁle ① x²") == "ﬁle ① x²"  # compatibility forms kept


def test_control_characters_are_removed_and_tabs_become_spaces() -> None:
    assert clean_text("a\x00b\x07c\x1bd\x7f") == "abcd"
    assert clean_text("col1\tcol2") == "col1 col2"
    assert clean_text("soft\u00adhyphen zero\u200bwidth \ufeffbom") == "softhyphen zerowidth bom"
    assert clean_text("page one.\x0cPage two.") == "page one.\nPage two."
    assert clean_text("windows\r\nline\rends.") == "windows line ends."


def test_lone_surrogates_become_replacement_characters() -> None:
    """A byte a decoder kept with surrogateescape is no character: the tokenizer and the
    databases refuse it, so it is shown as U+FFFD."""
    cleaned = clean_text("To: Zo\udcc3\udcab \udc80 ada")
    assert cleaned == "To: Zo\ufffd\ufffd \ufffd ada"
    cleaned.encode("utf-8")  # raises for a lone surrogate


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("an exam-\nple of text", "an example of text"),
        ("an exam-\n   ple of text", "an example of text"),
        ("übli-\nche Wörter", "übliche Wörter"),
        ("a well-known fact", "a well-known fact"),
        ("the New-\nYork times", "the New-\nYork times"),  # upper case after: a real hyphen
        ("from 2020-\n2021", "from 2020-\n2021"),  # digits are not hyphenated words
        ("bullet -\nnext", "bullet - next"),  # no letter before the hyphen: joined as prose
    ],
)
def test_hyphenation_at_line_ends(raw: str, expected: str) -> None:
    assert clean_text(raw) == expected


def test_whitespace_runs_collapse_but_indentation_stays() -> None:
    assert clean_text("too    many \t spaces   here  ") == "too many spaces here"
    assert clean_text("    indented code()  ") == "    indented code()"
    assert clean_text("a\n\n\n\n\nb") == "a\n\nb"
    assert clean_text("a   \n \t \n\n\nb") == "a\n\nb"
    assert clean_text("\n\n  \n") == ""
    assert clean_text("\n\nbody\n\n") == "body"


def test_hard_wrapped_prose_is_joined() -> None:
    raw = (
        "The quick brown fox jumps over the lazy dog and\n"
        "keeps running through the forest until it\n"
        "reaches the river.\n"
        "Next sentence starts on its own line."
    )
    assert clean_text(raw) == (
        "The quick brown fox jumps over the lazy dog and keeps running through the forest "
        "until it reaches the river.\nNext sentence starts on its own line."
    )


def test_long_line_continued_by_a_capitalised_word_is_joined() -> None:
    raw = "This book is written for programmers who already know\nRust basics and more."
    assert clean_text(raw) == (
        "This book is written for programmers who already know Rust basics and more."
    )


@pytest.mark.parametrize(
    "raw",
    [
        "Introduction\nThis chapter explains everything.",  # a short heading line
        "First sentence ends here.\nsecond starts lower.",  # sentence end
        "Shopping list:\n- eggs\n- milk\n- flour and sugar",  # list items
        "Steps\n1. open the box\n2. take it out",
        "if x {\n    return y;\n}",  # code
        "let a = b;\nlet c = d;",
        "match x {\nSome(v) => v,\nNone => 0,\n}",
        "Name | Value\nport | 8080",  # table rows
        "    indented line one\n    indented line two",
        "roses are red\n  violets are blue",  # indented continuation: layout
    ],
)
def test_structured_lines_are_not_joined(raw: str) -> None:
    assert clean_text(raw) == raw


def test_paragraphs_stay_separate() -> None:
    raw = "First paragraph wraps over\ntwo lines\n\nsecond paragraph"
    assert clean_text(raw) == "First paragraph wraps over two lines\n\nsecond paragraph"


# --- header/footer stripping ----------------------------------------------------------------------


WORDS = ["apples", "bridges", "castles", "dragons", "engines", "forests", "glaciers", "harbours"]


def body_line(page: int, line: int = 0) -> str:
    """A content line that differs from page to page (its number does not track the page)."""
    return f"Notes on {WORDS[(page + line) % len(WORDS)]}, item {page * 7 + line}."


def paged(n: int, *, header: bool = True) -> list[Block]:
    blocks = []
    for page in range(1, n + 1):
        lines = []
        if header:
            lines.append("ACME Corp — Annual Report 2025")
        lines += [body_line(page, 0), body_line(page, 1)]
        if header:
            lines.append(f"Page {page} of {n}")
        blocks.append(Block(text="\n".join(lines), page=page, section="S"))
    return blocks


def test_headers_and_footers_with_page_numbers_are_removed() -> None:
    out = list(strip_repeated_edges(paged(10)))
    assert [b.page for b in out] == list(range(1, 11))
    for page, block in enumerate(out, start=1):
        assert block.text == f"{body_line(page, 0)}\n{body_line(page, 1)}"
        assert block.section == "S"


def test_learned_edges_are_removed_far_beyond_the_first_window() -> None:
    out = list(strip_repeated_edges(paged(40), window=4))
    assert all("ACME" not in b.text and "Page " not in b.text for b in out)
    assert [b.page for b in out] == list(range(1, 41))


def test_too_few_pages_strip_nothing() -> None:
    blocks = paged(2)
    assert list(strip_repeated_edges(blocks)) == blocks


def test_lines_on_fewer_than_half_the_pages_are_kept() -> None:
    blocks = paged(8, header=False)
    # The same first line on 3 of 8 pages: not a running header.
    for i in (0, 3, 6):
        blocks[i] = Block(text="Summary\n" + blocks[i].text, page=blocks[i].page)
    out = list(strip_repeated_edges(blocks))
    assert out == blocks


def test_repeated_lines_in_the_middle_of_pages_are_kept() -> None:
    # Five lines a page: the third is on every page but is no page edge.
    blocks = [
        Block(
            text="\n".join(
                [body_line(p), body_line(p, 1), "See figure 1", body_line(p, 2), body_line(p, 3)]
            ),
            page=p,
        )
        for p in range(1, 9)
    ]
    assert list(strip_repeated_edges(blocks)) == blocks


def test_numbers_that_do_not_follow_the_page_are_content() -> None:
    # "Step N" tops every page, but N is neither constant nor the page number plus an offset.
    steps = [1, 4, 2, 9, 3, 7, 5, 8]
    blocks = [
        Block(text=f"Step {s}\n{body_line(p)}\n{body_line(p, 1)}\n{body_line(p, 2)}", page=p)
        for p, s in enumerate(steps, start=1)
    ]
    assert list(strip_repeated_edges(blocks)) == blocks


def test_code_at_page_edges_is_never_taken_for_a_header() -> None:
    # Code-heavy books start and end many pages with the same code lines.
    blocks = [
        Block(text=f"fn main() {{\n{body_line(p)}\n{body_line(p, 1)}\n}}", page=p)
        for p in range(1, 13)
    ]
    assert list(strip_repeated_edges(blocks)) == blocks


def test_alternating_headers_on_half_the_pages_are_stripped() -> None:
    blocks = [
        Block(
            text=f"{'The Book' if p % 2 else 'Chapter Two: Ideas'}\n"
            f"{body_line(p)}\n{body_line(p, 1)}\n{body_line(p, 2)}",
            page=p,
        )
        for p in range(1, 13)
    ]
    out = list(strip_repeated_edges(blocks))
    for p, block in enumerate(out, start=1):
        assert block.text == f"{body_line(p)}\n{body_line(p, 1)}\n{body_line(p, 2)}"


def test_page_numbers_with_an_offset_are_running_lines() -> None:
    # Printed numbers start at 1 on the third PDF page (front matter before it).
    blocks = [
        Block(text=f"{body_line(p)}\n{body_line(p, 1)}\n{body_line(p, 2)}\n- {p - 2} -", page=p)
        for p in range(3, 13)
    ]
    out = list(strip_repeated_edges(blocks))
    assert all(not b.text.endswith(" -") for b in out)
    assert [b.text.count("\n") for b in out] == [2] * 10


def test_unpaged_blocks_pass_untouched_and_in_order() -> None:
    pages = paged(6)
    stream = [pages[0], Block(text="Page 99 of 6"), *pages[1:]]
    out = list(strip_repeated_edges(stream))
    assert [b.page for b in out] == [1, None, 2, 3, 4, 5, 6]
    assert out[1].text == "Page 99 of 6"
    assert "Page" not in out[0].text


def test_stripping_streams_with_a_bounded_window() -> None:
    consumed = 0

    def source() -> Iterator[Block]:
        nonlocal consumed
        for block in paged(100):
            consumed += 1
            yield block

    out = strip_repeated_edges(source(), window=8)
    first = next(out)
    assert first.page == 1
    assert consumed <= 9  # the first page came out before the tenth page was read
    rest = list(out)
    assert [b.page for b in rest] == list(range(2, 101))


def test_stripper_feed_and_flush() -> None:
    stripper = RepeatedLineStripper(window=4)
    released = []
    for block in paged(5):
        released += stripper.feed(block)
    assert [b.page for b in released] == [1, 2]
    released += stripper.flush()
    assert [b.page for b in released] == [1, 2, 3, 4, 5]
    assert set(stripper.repeated) == {
        ("top", "ACME Corp — Annual Report #"),
        ("bottom", "Page # of #"),
    }
    assert stripper.repeated["bottom", "Page # of #"] == {(("offset", 0), ("const", 5))}
    assert all("Page" not in b.text for b in released)


# --- clean_blocks ---------------------------------------------------------------------------------


def test_clean_blocks_cleans_strips_and_drops_empty_blocks() -> None:
    blocks = paged(7)
    # A page with nothing but the running header and footer disappears.
    blocks[3] = Block(text="ACME Corp — Annual Report 2025\nPage 4 of 7", page=4)
    blocks.append(Block(text="  \n\x00\n", section="x"))
    out = list(clean_blocks(blocks))
    assert [b.page for b in out] == [1, 2, 3, 5, 6, 7]
    assert all("ACME" not in b.text for b in out)
    # The two content lines are sentences, so they stay two lines.
    assert out[0].text == f"{body_line(1, 0)}\n{body_line(1, 1)}"


def test_clean_blocks_on_a_real_pdf_with_running_headers(tmp_path: Path) -> None:
    pages = [
        f"{body_line(n, 0)}\n"
        f"Chapter text about {WORDS[n % 8]} is long enough to be wrapped onto the\n"
        f"next line by the layout engine, and then it ends with {WORDS[(n + 3) % 8]}.\n"
        f"{body_line(n, 1)}"
        for n in range(1, 7)
    ]
    pdf = make_pdf(
        tmp_path / "r.pdf", pages, header="Quarterly Review", footer="Page {page} of {pages}"
    )
    out = list(clean_blocks(PdfParser().parse(pdf)))
    assert [b.page for b in out] == [1, 2, 3, 4, 5, 6]
    for n, block in enumerate(out, start=1):
        assert block.text == (
            f"{body_line(n, 0)}\n"
            f"Chapter text about {WORDS[n % 8]} is long enough to be wrapped onto the next line "
            f"by the layout engine, and then it ends with {WORDS[(n + 3) % 8]}.\n"
            f"{body_line(n, 1)}"
        )
