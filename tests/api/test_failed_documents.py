"""Documents that cannot be processed fail their job with a classified, actionable error."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.api.conftest import accepted, search, upload, wait_completed, wait_done
from tests.fixtures.documents import (
    make_corrupt_pdf,
    make_docx,
    make_docx_without_document,
    make_pdf,
    make_scanned_pdf,
    make_text,
    make_truncated_pdf,
)


def _encrypted(path: Path) -> Path:
    return make_pdf(path, ["Secret page."], password="hunter2")


def _truncated(path: Path) -> Path:
    source = make_pdf(path.with_name("source.pdf"), ["Some text that will be cut off."])
    return make_truncated_pdf(path, source)


@pytest.mark.parametrize(
    ("maker", "category", "code", "advice"),
    [
        (make_corrupt_pdf, "permanent", "corrupt_file", "upload the new copy"),
        (_truncated, "permanent", "corrupt_file", "upload the new copy"),
        (_encrypted, "user_action_required", "pdf_encrypted", "Remove the password"),
        (make_scanned_pdf, "permanent", "no_text_layer", "OCR"),
    ],
    ids=["corrupt", "truncated", "encrypted", "scanned"],
)
def test_unprocessable_pdf_fails_its_job_only(
    client, tmp_path: Path, maker, category: str, code: str, advice: str
) -> None:
    good_before = accepted(upload(client, make_text(tmp_path / "a.txt", "The ibex climbs.\n")))
    bad = accepted(upload(client, maker(tmp_path / "bad.pdf")))
    good_after = accepted(upload(client, make_pdf(tmp_path / "b.pdf", ["The okapi hides."])))

    job = wait_done(client, bad["jobId"])
    assert job["status"] == "failed", job
    assert job["errorCategory"] == category
    assert job["errorCode"] == code
    assert advice in job["error"], job["error"]
    assert job["retryable"] is (category == "user_action_required")
    assert job["attempt"] == 1  # not retried: retrying the same input cannot help
    assert job["finishedAt"] is not None
    assert job["stage"] != "done"

    document = client.get(f"/docs/documents/{bad['documentId']}").json()
    assert document["status"] == "failed"
    assert document["searchable"] is False
    assert document["chunkCount"] == 0

    for other, word in ((good_before, "ibex"), (good_after, "okapi")):
        done = wait_completed(client, other["jobId"])
        hits = search(client, done["datasetId"], word)
        assert hits[0]["documentId"] == other["documentId"]


def test_docx_without_body_fails_permanently(client, tmp_path: Path) -> None:
    bad = accepted(upload(client, make_docx_without_document(tmp_path / "broken.docx")))
    job = wait_done(client, bad["jobId"])
    assert job["status"] == "failed"
    assert job["errorCategory"] == "permanent"
    assert job["errorCode"]
    assert job["error"]


def test_docx_without_text_fails_with_no_text(client, tmp_path: Path) -> None:
    bad = accepted(upload(client, make_docx(tmp_path / "blank.docx", [])))
    job = wait_done(client, bad["jobId"])
    assert job["status"] == "failed"
    assert job["errorCategory"] == "permanent"
    assert job["errorCode"] == "no_text"
    assert "blank.docx" in job["error"]


def test_failed_upload_listed_as_failed(client, tmp_path: Path) -> None:
    bad = accepted(upload(client, make_corrupt_pdf(tmp_path / "bad.pdf")))
    good = accepted(upload(client, make_text(tmp_path / "ok.txt", "fine\n")))
    wait_done(client, bad["jobId"])
    wait_completed(client, good["jobId"])
    failed = client.get("/docs/jobs", params={"status": "failed"}).json()
    assert [j["id"] for j in failed["items"]] == [bad["jobId"]]
    assert failed["total"] == 1
