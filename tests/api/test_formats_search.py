"""Every supported format becomes searchable, in every search mode, with its metadata."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import ingest, search
from tests.fixtures.documents import (
    LATIN1_TEXT,
    Heading,
    Para,
    make_docx,
    make_html,
    make_markdown,
    make_pdf,
    make_text,
)

MODES = ("hybrid", "vector", "keyword")
FILLER = ("the", "river", "flows", "past", "the", "old", "mill", "and", "the", "green", "field")


def filler(n: int, shift: int = 0) -> str:
    """`n` words from a small vocabulary: text that shares no rare word with the queries."""
    return " ".join(FILLER[(i + shift) % len(FILLER)] for i in range(n))


def top_hit(client, dataset_id: str, word: str, mode: str) -> dict[str, Any]:
    results = search(client, dataset_id, word, mode=mode)
    assert results, f"{mode}: nothing found for {word!r}"
    hit = results[0]
    assert word.lower() in hit["text"].lower(), (mode, word, hit["text"])
    for key in ("score", "documentId", "fileName", "ordinal", "page", "pageEnd", "section"):
        assert key in hit, key
    assert isinstance(hit["score"], float)
    assert isinstance(hit["ordinal"], int)
    assert hit["ordinal"] >= 0
    scores = [r["score"] for r in results]
    assert scores == sorted(scores, reverse=True), (mode, scores)
    return hit


def _pages() -> list[str]:
    words = {1: "aardvark", 2: "bandicoot", 3: "capybara"}
    pages = []
    for number, word in words.items():
        lines = [filler(12, number + k) for k in range(8)]
        lines.insert(4, f"Page {number} mentions the {word} once.")
        pages.append("\n".join(lines))
    return pages


def test_pdf_pages_and_outline_sections(client, tmp_path: Path) -> None:
    path = make_pdf(
        tmp_path / "field-guide.pdf",
        _pages(),
        outline=[("Introduction", 1), ("Marsupials", 2), ("Rodents", 3)],
    )
    job = ingest(client, path)
    assert job["totalChunks"] >= 3
    dataset, document = job["datasetId"], job["documentId"]
    expected = {
        "aardvark": (1, "Introduction"),
        "bandicoot": (2, "Marsupials"),
        "capybara": (3, "Rodents"),
    }
    for word, (page, section) in expected.items():
        for mode in MODES:
            hit = top_hit(client, dataset, word, mode)
            assert hit["documentId"] == document
            assert hit["fileName"] == "field-guide.pdf"
            assert hit["page"] == page, (word, mode, hit)
            assert hit["pageEnd"] == page, (word, mode, hit)
            assert hit["section"] == section, (word, mode, hit)
    doc = client.get(f"/docs/documents/{document}").json()
    assert doc["pageCount"] == 3
    assert doc["contentType"] == "application/pdf"


def test_pdf_without_outline_has_page_ranges(client, tmp_path: Path) -> None:
    job = ingest(client, make_pdf(tmp_path / "plain.pdf", _pages()))
    for word, page in (("aardvark", 1), ("bandicoot", 2), ("capybara", 3)):
        for mode in MODES:
            hit = top_hit(client, job["datasetId"], word, mode)
            assert hit["page"] is not None
            assert hit["page"] <= page <= hit["pageEnd"], (word, mode, hit)
            assert hit["section"] is None


def test_docx_headings_become_sections(client, tmp_path: Path) -> None:
    parts = [
        Heading("Field Report", 0),
        Para(filler(30)),
        Heading("Wetlands", 1),
        Para(f"{filler(20, 1)} The heron waits in the reeds. {filler(20, 2)}"),
        Heading("Coastal birds", 2),
        Para(f"{filler(20, 3)} A puffin nests on the cliff. {filler(20, 4)}"),
        Heading("Forests", 1),
        Para(f"{filler(20, 5)} The woodpecker drums on bark. {filler(20, 6)}"),
    ]
    job = ingest(client, make_docx(tmp_path / "report.docx", parts))
    expected = {
        "heron": ("Wetlands",),
        "puffin": ("Wetlands", "Coastal birds"),
        "woodpecker": ("Forests",),
    }
    for word, path in expected.items():
        for mode in MODES:
            hit = top_hit(client, job["datasetId"], word, mode)
            assert hit["fileName"] == "report.docx"
            assert hit["page"] is None
            section = hit["section"]
            assert section is not None, (word, mode)
            names = section.split(" › ")
            assert names[-len(path) :] == list(path), (word, mode, section)
            assert "Forests" not in names or word == "woodpecker"


def test_html_content_is_searchable_and_chrome_is_not(client, tmp_path: Path) -> None:
    body = (
        "<h1>Handbook</h1>"
        f"<p>{filler(30)}</p>"
        "<h2>Brewing</h2>"
        f"<p>{filler(20, 2)} Steep the oolong for three minutes. {filler(20, 3)}</p>"
        "<h2>Storage</h2>"
        f"<p>{filler(20, 4)} Keep the canister away from sunlight. {filler(20, 5)}</p>"
    )
    job = ingest(client, make_html(tmp_path / "tea.html", body, title="Tea"))
    for word, heading in (("oolong", "Brewing"), ("canister", "Storage")):
        for mode in MODES:
            hit = top_hit(client, job["datasetId"], word, mode)
            assert hit["fileName"] == "tea.html"
            assert hit["section"] is not None
            assert hit["section"].split(" › ")[-1] == heading, hit["section"]
            assert "<" not in hit["text"]
    # site chrome (nav, footer, scripts) is not indexed
    for word in ("Sidebar", "trackingCode", "footer"):
        assert search(client, job["datasetId"], word, mode="keyword") == [], word


def test_markdown_headings_become_sections(client, tmp_path: Path) -> None:
    text = (
        "# Garden\n\n"
        f"{filler(30)}\n\n"
        "## Vegetables\n\n"
        f"{filler(20, 1)} Plant the **rhubarb** in early spring. {filler(20, 2)}\n\n"
        "## Flowers\n\n"
        f"{filler(20, 3)} The [foxglove](https://example.com) likes shade. {filler(20, 4)}\n"
    )
    job = ingest(client, make_markdown(tmp_path / "garden.md", text))
    for word, heading in (("rhubarb", "Vegetables"), ("foxglove", "Flowers")):
        for mode in MODES:
            hit = top_hit(client, job["datasetId"], word, mode)
            assert hit["fileName"] == "garden.md"
            assert hit["section"] == f"Garden › {heading}", hit["section"]
            assert "**" not in hit["text"]
            assert "https://example.com" not in hit["text"]


@pytest.mark.parametrize("encoding", ["latin-1", "utf-8"])
def test_text_in_latin1_is_decoded(client, tmp_path: Path, encoding: str) -> None:
    text = f"{filler(40)}\n\n{LATIN1_TEXT}\n{filler(40, 3)}\n"
    path = make_text(tmp_path / "menu.txt", text, encoding=encoding)
    job = ingest(client, path)
    for mode in MODES:
        hit = top_hit(client, job["datasetId"], "Ærøskøbing", mode)
        assert "Café crème brûlée" in hit["text"], hit["text"]
        assert "Größe über Straße" in hit["text"]
        assert hit["page"] is None
        assert hit["fileName"] == "menu.txt"


def test_search_is_scoped_to_its_dataset(client, tmp_path: Path) -> None:
    other = client.post("/datasets", json={"name": "elsewhere"}).json()["id"]
    ingest(client, make_text(tmp_path / "a.txt", "The narwhal swims north.\n"), dataset_id=other)
    default = client.get("/datasets").json()["items"][0]
    assert default["isDefault"]
    for mode in MODES:
        assert search(client, default["id"], "narwhal", mode=mode) == []
        assert search(client, other, "narwhal", mode=mode)[0]["text"].startswith("The narwhal")


def test_top_k_limits_results(client, tmp_path: Path) -> None:
    text = "\n\n".join(f"Paragraph {i} is about the walrus. {filler(50, i)}" for i in range(8))
    job = ingest(client, make_text(tmp_path / "w.txt", text))
    assert job["totalChunks"] >= 4
    for mode in MODES:
        assert len(search(client, job["datasetId"], "walrus", mode=mode, top_k=2)) == 2
        found = search(client, job["datasetId"], "walrus", mode=mode, top_k=100)
        if mode == "keyword":  # only the chunks that contain the word
            assert all("walrus" in r["text"] for r in found)
            assert len(found) >= 8
        else:  # every chunk has some similarity
            assert len(found) == job["totalChunks"]
        assert len({r["chunkId"] for r in found}) == len(found)
