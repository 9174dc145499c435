"""/docs/jobs: read, list with filters, cancel, retry; transient and permanent failures."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from knowledgeops.errors import PermanentError, TransientError, UserActionRequired
from tests.api.conftest import (
    FlakyEmbedder,
    GatedEmbedder,
    accepted,
    assert_error,
    create_dataset,
    get_job,
    ingest,
    search,
    upload,
    wait_completed,
    wait_done,
    wait_status,
)
from tests.fixtures.documents import make_corrupt_pdf, make_text

MISSING = "00000000-0000-4000-8000-000000000000"


def test_unknown_job_is_404_job_not_found(client) -> None:
    response = client.get(f"/docs/jobs/{MISSING}")
    body = assert_error(response, 404, "job_not_found")
    assert body["error"] == "job not found"  # the original contract's message
    for action in ("cancel", "retry"):
        assert_error(client.post(f"/docs/jobs/{MISSING}/{action}"), 404, "job_not_found")


@pytest.mark.parametrize(
    "path", ["/docs/jobs/abc", "/docs/jobs/abc/cancel", "/docs/jobs/abc/retry"]
)
def test_malformed_job_id_is_422(client, path: str) -> None:
    method = "GET" if path.count("/") == 3 else "POST"
    error = assert_error(client.request(method, path), 422, "validation_error")
    assert "job_id" in error["error"]
    assert error["fields"][0]["field"] == "job_id"


def test_list_jobs_with_filters(client, tmp_path: Path) -> None:
    first = create_dataset(client, "first")["id"]
    second = create_dataset(client, "second")["id"]
    in_first = [
        ingest(client, make_text(tmp_path / f"a{i}.txt", f"first {i}\n"), dataset_id=first)
        for i in range(3)
    ]
    in_second = ingest(client, make_text(tmp_path / "b.txt", "second\n"), dataset_id=second)
    bad = accepted(upload(client, make_corrupt_pdf(tmp_path / "c.pdf"), dataset_id=second))
    wait_done(client, bad["jobId"])

    everything = client.get("/docs/jobs").json()
    assert everything["total"] == 5
    assert everything["items"][0]["id"] == bad["jobId"]  # newest first
    by_first = client.get("/docs/jobs", params={"datasetId": first}).json()
    assert by_first["total"] == 3
    assert {j["id"] for j in by_first["items"]} == {j["id"] for j in in_first}
    completed_second = client.get(
        "/docs/jobs", params={"datasetId": second, "status": "completed"}
    ).json()
    assert [j["id"] for j in completed_second["items"]] == [in_second["id"]]
    assert completed_second["total"] == 1
    failed = client.get("/docs/jobs", params={"status": "failed"}).json()
    assert [j["id"] for j in failed["items"]] == [bad["jobId"]]
    paged = client.get("/docs/jobs", params={"limit": 2, "page": 2}).json()
    assert (paged["total"], paged["page"], paged["limit"], paged["hasMore"]) == (5, 2, 2, True)
    assert len(paged["items"]) == 2
    assert client.get("/docs/jobs", params={"datasetId": MISSING}).json()["total"] == 0
    by_document = client.get("/docs/jobs", params={"documentId": in_second["documentId"]}).json()
    assert [j["id"] for j in by_document["items"]] == [in_second["id"]]

    for params, field in (({"status": "done"}, "status"), ({"datasetId": "x"}, "datasetId")):
        error = assert_error(client.get("/docs/jobs", params=params), 422)
        assert field in error["error"]


def test_cancel_running_job(make_client, tmp_path: Path) -> None:
    client = make_client(embedder=GatedEmbedder())
    created = accepted(upload(client, make_text(tmp_path / "a.txt", "The caracal stalks.\n")))
    assert client.runtime.embedder.entered.wait(10)
    assert get_job(client, created["jobId"])["status"] == "running"

    response = client.post(f"/docs/jobs/{created['jobId']}/cancel")
    assert response.status_code == 200, response.text
    cancelled = response.json()
    assert cancelled["status"] == "cancelled"
    assert cancelled["finishedAt"] is not None
    client.runtime.embedder.release()

    # the worker's late writes are rejected: the job stays cancelled, nothing becomes searchable
    time.sleep(0.5)
    job = get_job(client, created["jobId"])
    assert job["status"] == "cancelled"
    doc = client.get(f"/docs/documents/{created['documentId']}").json()
    assert doc["status"] == "cancelled"
    assert doc["searchable"] is False
    assert search(client, job["datasetId"], "caracal", mode="keyword") == []

    again = assert_error(client.post(f"/docs/jobs/{created['jobId']}/cancel"), 409)
    assert "cancelled" in again["error"]


def test_cancel_pending_job(make_client, tmp_path: Path) -> None:
    client = make_client(embedder=GatedEmbedder(), workers=1)
    busy = accepted(upload(client, make_text(tmp_path / "a.txt", "Keeps the worker busy.\n")))
    assert client.runtime.embedder.entered.wait(10)
    waiting = accepted(upload(client, make_text(tmp_path / "b.txt", "Waits in the queue.\n")))
    assert get_job(client, waiting["jobId"])["status"] == "pending"

    cancelled = client.post(f"/docs/jobs/{waiting['jobId']}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["startedAt"] is None
    client.runtime.embedder.release()
    wait_completed(client, busy["jobId"])
    time.sleep(0.3)  # the queue still holds the cancelled job's id: it must be skipped
    assert get_job(client, waiting["jobId"])["status"] == "cancelled"


def test_cancel_completed_job_is_409(client, tmp_path: Path) -> None:
    job = ingest(client, make_text(tmp_path / "a.txt", "Done already.\n"))
    error = assert_error(client.post(f"/docs/jobs/{job['id']}/cancel"), 409, "invalid_transition")
    assert "completed" in error["error"]
    assert get_job(client, job["id"])["status"] == "completed"


def test_retry_cancelled_job_completes(make_client, tmp_path: Path) -> None:
    client = make_client(embedder=GatedEmbedder())
    created = accepted(upload(client, make_text(tmp_path / "a.txt", "The serval leaps.\n")))
    assert client.runtime.embedder.entered.wait(10)
    client.post(f"/docs/jobs/{created['jobId']}/cancel")
    client.runtime.embedder.release()

    response = client.post(f"/docs/jobs/{created['jobId']}/retry")
    assert response.status_code == 202, response.text
    assert response.json()["status"] == "pending"
    assert response.json()["error"] is None
    job = wait_completed(client, created["jobId"])
    assert job["attempt"] == 2
    assert job["retries"] == 1
    assert search(client, job["datasetId"], "serval")[0]["documentId"] == created["documentId"]


def test_retry_completed_or_pending_job_is_409(make_client, tmp_path: Path) -> None:
    client = make_client(embedder=GatedEmbedder())
    created = accepted(upload(client, make_text(tmp_path / "a.txt", "The genet.\n")))
    wait_status(client, created["jobId"], {"running"})
    assert_error(client.post(f"/docs/jobs/{created['jobId']}/retry"), 409, "invalid_transition")
    client.runtime.embedder.release()
    wait_completed(client, created["jobId"])
    assert_error(client.post(f"/docs/jobs/{created['jobId']}/retry"), 409, "invalid_transition")


def test_transient_error_is_retried_automatically(make_client, tmp_path: Path) -> None:
    embedder = FlakyEmbedder(
        lambda: TransientError("provider timed out", code="provider_timeout", retry_after_s=1.0)
    )
    client = make_client(embedder=embedder, backoff_max_s=2.0)
    created = accepted(upload(client, make_text(tmp_path / "a.txt", "The margay climbs.\n")))

    retrying = wait_status(client, created["jobId"], {"retrying", "completed", "failed"})
    assert retrying["status"] == "retrying", retrying
    assert retrying["attempt"] == 1
    assert retrying["errorCategory"] == "transient"
    assert retrying["errorCode"] == "provider_timeout"
    assert retrying["error"] == "provider timed out"
    assert retrying["retryable"] is True
    assert retrying["runAfter"] is not None
    assert retrying["finishedAt"] is None

    job = wait_completed(client, created["jobId"])
    assert job["attempt"] == 2
    assert job["retries"] == 1
    assert job["error"] is None
    assert job["errorCategory"] is None
    assert job["processedChunks"] == job["totalChunks"]
    assert embedder.raised == 1
    assert search(client, job["datasetId"], "margay")[0]["documentId"] == created["documentId"]


def test_transient_errors_exhaust_attempts(make_client, tmp_path: Path) -> None:
    embedder = FlakyEmbedder(lambda: TransientError("still down"), failures=100)
    client = make_client(embedder=embedder, max_attempts=3)
    created = accepted(upload(client, make_text(tmp_path / "a.txt", "Never embedded.\n")))
    job = wait_done(client, created["jobId"])
    assert job["status"] == "failed"
    assert job["attempt"] == 3
    assert job["retries"] == 2
    assert job["maxAttempts"] == 3
    assert job["errorCategory"] == "transient"
    assert embedder.raised == 3


@pytest.mark.parametrize(
    ("error", "category"),
    [
        (
            lambda: PermanentError("the model rejected the input", code="model_rejected"),
            "permanent",
        ),
        (
            lambda: UserActionRequired("the API key was refused", code="bad_credentials"),
            "user_action_required",
        ),
    ],
)
def test_failed_job_retried_after_fix_completes(
    make_client, tmp_path: Path, error, category: str
) -> None:
    embedder = FlakyEmbedder(error, failures=1)
    client = make_client(embedder=embedder)
    created = accepted(upload(client, make_text(tmp_path / "a.txt", "The ocelot hunts.\n")))
    failed = wait_done(client, created["jobId"])
    assert failed["status"] == "failed"
    assert failed["attempt"] == 1  # not retried automatically
    assert failed["errorCategory"] == category
    assert failed["error"] in ("the model rejected the input", "the API key was refused")
    assert client.get(f"/docs/documents/{created['documentId']}").json()["status"] == "failed"
    assert search(client, failed["datasetId"], "ocelot", mode="keyword") == []

    # the embedder raised once only: it is "fixed" now
    response = client.post(f"/docs/jobs/{created['jobId']}/retry")
    assert response.status_code == 202, response.text
    assert response.json()["status"] == "pending"
    assert response.json()["errorCode"] is None
    job = wait_completed(client, created["jobId"])
    assert job["attempt"] == 2
    assert job["maxAttempts"] > job["attempt"] - 1
    assert job["processedChunks"] == job["totalChunks"]
    assert client.get(f"/docs/documents/{created['documentId']}").json()["status"] == "ready"
    assert search(client, job["datasetId"], "ocelot")[0]["documentId"] == created["documentId"]


def test_reupload_of_failed_document_requeues_it(make_client, tmp_path: Path) -> None:
    client = make_client(embedder=FlakyEmbedder(lambda: PermanentError("broken"), failures=1))
    path = make_text(tmp_path / "a.txt", "The fossa.\n")
    created = accepted(upload(client, path))
    assert wait_done(client, created["jobId"])["status"] == "failed"
    again = upload(client, path)
    assert again.status_code == 202, again.text
    assert again.json()["jobId"] == created["jobId"]
    assert again.json()["status"] == "pending"
    wait_completed(client, created["jobId"])
