"""A scan uploaded like any file is read by OCR in the parser process and found by search, with
its pages; the job shows the stage ocr with pages read of pages to read, and flags the pages OCR
could not read with confidence instead of indexing them."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

from knowledgeops.db.schema import job_events
from tests.api.conftest import accepted, ingest, runtime_of, search, upload, wait_done
from tests.fixtures.scans import (
    degrade,
    make_scanned_text_pdf,
    noise_image,
    page_images,
    save_images,
)

PAGES = [
    "The harbour master keeps the tide tables.\nShips wait for the evening flood.",
    "Barnacles grow on the hull of the old ferry.\nThe kelp forest shelters young cod.",
]


def stages_of(client, job_id: str) -> list[str]:
    with runtime_of(client).db.read() as conn:
        rows = conn.execute(
            select(job_events.c.stage)
            .where(job_events.c.job_id == job_id, job_events.c.kind == "stage")
            .order_by(job_events.c.id)
        )
        return [row.stage for row in rows]


def test_a_scanned_pdf_is_found_by_search_and_its_unsure_page_is_flagged(
    client, tmp_path: Path
) -> None:
    first, second = page_images(tmp_path, PAGES)
    # scan, noise (a page OCR cannot read with confidence), a typed page, scan
    images = [first, noise_image(), second]
    pdf = make_scanned_text_pdf(tmp_path / "scan.pdf", images, {3: "A typed page on lanterns."})
    job = ingest(client, pdf, timeout=120)
    assert job["ocrPagesTotal"] == 3
    assert job["ocrPagesDone"] == 3
    assert job["lowConfidencePages"] == [2]
    # two clean pages near 1, the noise page far below: the mean says the scan is not all good
    assert 0.5 < job["ocrMeanConfidence"] < 0.9
    assert "ocr" in stages_of(client, job["id"])
    dataset = job["datasetId"]
    for phrase, page in (("tide tables", 1), ("lanterns", 3), ("kelp forest", 4)):
        (hit, *_) = search(client, dataset, phrase, mode="keyword")
        assert phrase in hit["text"].lower()
        assert hit["page"] <= page <= hit["pageEnd"], (phrase, hit)
    document = client.get(f"/docs/documents/{job['documentId']}").json()
    assert document["pageCount"] == 4


def test_a_photo_of_a_page_is_a_document_and_a_text_pdf_shows_no_ocr(
    client, tmp_path: Path
) -> None:
    photo = save_images(tmp_path / "page.jpg", [degrade(page_images(tmp_path, PAGES)[1])], "JPEG")
    job = ingest(client, photo, timeout=120)
    assert (job["ocrPagesDone"], job["ocrPagesTotal"], job["lowConfidencePages"]) == (1, 1, [])
    (hit, *_) = search(client, job["datasetId"], "barnacles", mode="keyword")
    assert hit["fileName"] == "page.jpg"
    assert hit["page"] == 1
    document = client.get(f"/docs/documents/{job['documentId']}").json()
    assert document["contentType"] == "image/jpeg"
    from tests.fixtures.documents import make_pdf  # noqa: PLC0415

    plain = ingest(client, make_pdf(tmp_path / "typed.pdf", ["Typed text about gulls."]))
    assert (plain["ocrPagesDone"], plain["ocrPagesTotal"], plain["lowConfidencePages"]) == (
        None,
        None,
        [],
    )
    assert plain["ocrMeanConfidence"] is None


def test_an_image_without_text_fails_saying_what_to_do(client, tmp_path: Path) -> None:
    blank = save_images(tmp_path / "blank.png", [noise_image()], "PNG")
    job = wait_done(client, accepted(upload(client, blank))["jobId"], timeout=120)
    assert job["status"] == "failed"
    assert job["errorCode"] == "no_text_found"
    assert job["errorCategory"] == "permanent"
    assert job["lowConfidencePages"] == [1]
    assert "legible" in job["error"]
