"""Slides, sheets, CSV, e-books and e-mail are accepted, parsed in the parser process and found
by search: a phrase from every slide, sheet, chapter and attachment, with its page and section."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import accepted, ingest, search, upload, wait_done
from tests.fixtures.office import (
    Slide,
    make_csv,
    make_eml,
    make_epub,
    make_mbox,
    make_pptx,
    make_xlsx,
    simple_message,
)


def hit_for(client: Any, dataset: str, phrase: str) -> dict[str, Any]:
    results = search(client, dataset, phrase, mode="keyword", top_k=3)
    assert results, f"nothing found for {phrase!r}"
    assert phrase.lower() in results[0]["text"].lower(), (phrase, results[0]["text"])
    return results[0]


def test_every_slide_is_found_with_its_number_and_title(client, tmp_path: Path) -> None:
    slides = [
        Slide("Opening", ["The walrus colony grew"], notes="Speaker says: narwhal tusks"),
        Slide("Figures", table=[["Bay", "Boats"], ["Kelp bay", "14"]]),
        Slide(None, ["Untitled slide about periwinkles"]),
    ]
    job = ingest(client, make_pptx(tmp_path / "deck.pptx", slides))
    dataset = job["datasetId"]
    for phrase, page, section in (
        ("walrus colony", 1, "Opening"),
        ("narwhal tusks", 1, "Opening"),  # speaker notes
        ("Kelp bay", 2, "Figures"),  # a table cell
        ("periwinkles", 3, None),
    ):
        hit = hit_for(client, dataset, phrase)
        assert (hit["page"], hit["section"], hit["fileName"]) == (page, section, "deck.pptx")
    document = client.get(f"/docs/documents/{job['documentId']}").json()
    assert document["contentType"].endswith("presentationml.presentation")
    assert document["pageCount"] == 3


def test_every_sheet_and_row_is_found_with_its_column_names(client, tmp_path: Path) -> None:
    book = make_xlsx(
        tmp_path / "harbour.xlsx",
        {
            "Moorings": [["Berth", "Vessel"], ["B7", "Saltwind"], ["B9", "Gannet"]],
            "Crew": [["Name", "Duty"], ["Ada Quill", "lamp trimming"]],
        },
    )
    job = ingest(client, book)
    dataset = job["datasetId"]
    hit = hit_for(client, dataset, "Saltwind")
    assert hit["section"] == "Moorings"
    assert "Berth: B7; Vessel: Saltwind" in hit["text"]
    assert hit_for(client, dataset, "lamp trimming")["section"] == "Crew"
    table = make_csv(tmp_path / "tides.csv", [["Port", "High tide"], ["Whitby", "06:12"]])
    job = ingest(client, table)
    hit = hit_for(client, job["datasetId"], "Whitby")
    assert "Port: Whitby; High tide: 06:12" in hit["text"]
    files = client.post(
        f"/datasets/{dataset}/search",
        json={"query": "Gannet", "mode": "keyword", "filter": {"fileTypes": ["xlsx"]}},
    ).json()["results"]
    assert [r["fileName"] for r in files] == ["harbour.xlsx"]


def test_every_chapter_of_an_ebook_is_found_under_its_title(client, tmp_path: Path) -> None:
    job = ingest(client, make_epub(tmp_path / "coast.epub"))
    dataset = job["datasetId"]
    assert hit_for(client, dataset, "trimmed the wick")["section"] == "The lighthouse"
    assert hit_for(client, dataset, "marram grass")["section"] == "Storm season"
    assert hit_for(client, dataset, "shingle beach")["section"] == "Storm season › Aftermath"


def test_every_attachment_of_an_email_is_found_and_a_zip_is_not_opened(
    client, tmp_path: Path
) -> None:
    job = ingest(client, make_eml(tmp_path / "inspection.eml"))
    dataset = job["datasetId"]
    subject = "Harbour inspection report"
    assert hit_for(client, dataset, "pilings need tarring")["section"] == subject
    assert hit_for(client, dataset, "barnacles on the hull")["section"] == f"{subject} › survey.pdf"
    minutes = hit_for(client, dataset, "Europe led the growth")["section"]
    assert minutes.startswith(f"{subject} › minutes.docx › ")
    assert hit_for(client, dataset, "Caulking iron")["section"] == f"{subject} › tools.csv"
    assert "photos.zip (not read: a ZIP archive" in hit_for(client, dataset, "photos.zip")["text"]
    assert search(client, dataset, "never indexed", mode="keyword") == []


def test_an_mbox_is_one_document_of_many_messages(client, tmp_path: Path) -> None:
    box = make_mbox(
        tmp_path / "inbox.mbox",
        [
            simple_message("Buoys", "Buoy seven is adrift near the breakwater."),
            simple_message("Gulls", "<p>A gull colony on the mole.</p>", html=True),
        ],
    )
    job = ingest(client, box)
    assert hit_for(client, job["datasetId"], "breakwater")["section"] == "Buoys"
    assert hit_for(client, job["datasetId"], "gull colony")["section"] == "Gulls"


@pytest.mark.parametrize("name", ["deck.pptx", "book.xlsx", "novel.epub"])
def test_a_damaged_package_fails_with_a_reason_and_keeps_nothing(
    client, tmp_path: Path, name: str
) -> None:
    path = tmp_path / name
    path.write_bytes(b"PK\x03\x04" + b"\x00" * 200)
    job = wait_done(client, accepted(upload(client, path))["jobId"])
    assert job["status"] == "failed"
    assert job["errorCode"] == "corrupt_file"
    assert job["retryable"] is False
    assert "save it again" in job["error"].lower()
