"""POST /docs/upload and GET /docs/jobs/{id}: the original contract (DESIGN.md §9)."""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

from knowledgeops.api.deps import UUID_PATTERN
from tests.api.conftest import (
    JOB_FIELDS,
    SlowEmbedder,
    accepted,
    get_job,
    search,
    upload,
    wait_completed,
)
from tests.fixtures.documents import make_text


def _words(n: int, prefix: str = "word") -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


def test_upload_answers_202_with_job_and_location(client, tmp_path: Path) -> None:
    path = make_text(tmp_path / "notes.txt", "The marmalade recipe needs oranges.\n")
    response = upload(client, path)

    assert response.status_code == 202, response.text
    body = response.json()
    assert set(body) >= {"jobId", "documentId", "status"}
    assert body["status"] == "pending"
    assert body["duplicate"] is False
    assert re.fullmatch(UUID_PATTERN, body["jobId"])
    assert response.headers["Location"] == f"/docs/jobs/{body['jobId']}"

    job = wait_completed(client, body["jobId"])
    assert set(job) >= JOB_FIELDS, JOB_FIELDS - set(job)
    assert job["id"] == body["jobId"]
    assert job["documentId"] == body["documentId"]
    assert job["stage"] == "done"
    assert job["fileName"] == "notes.txt"
    assert job["fileSize"] == path.stat().st_size
    assert job["totalChunks"] >= 1
    assert job["processedChunks"] == job["totalChunks"]
    assert job["error"] is None
    assert job["errorCode"] is None
    assert job["errorCategory"] is None
    assert job["retries"] == 0
    assert job["attempt"] == 1
    assert job["maxAttempts"] >= 1
    assert job["kind"] == "ingest"
    times = {k: datetime.fromisoformat(job[k]) for k in ("createdAt", "startedAt", "finishedAt")}
    assert times["createdAt"] <= times["startedAt"] <= times["finishedAt"]
    assert datetime.fromisoformat(job["updatedAt"]) >= times["startedAt"]
    assert job["heartbeatAt"] is not None

    doc = client.get(f"/docs/documents/{body['documentId']}").json()
    assert doc["status"] == "ready"
    assert doc["searchable"] is True
    assert doc["chunkCount"] == job["totalChunks"]
    assert job["datasetId"] == doc["datasetId"]


def test_progress_counts_never_decrease_nor_exceed_total(make_client, tmp_path: Path) -> None:
    client = make_client(embedder=SlowEmbedder(0.05), embed_batch_size=4)
    paragraphs = [_words(40, f"p{n}x") for n in range(12)]
    path = make_text(tmp_path / "long.txt", "\n\n".join(paragraphs))
    job_id = accepted(upload(client, path))["jobId"]

    seen: list[tuple[str, str, int, int | None]] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        job = get_job(client, job_id)
        seen.append((job["status"], job["stage"], job["processedChunks"], job["totalChunks"]))
        if job["status"] in {"completed", "failed", "cancelled"}:
            break
        time.sleep(0.01)
    assert seen[-1][0] == "completed", seen[-1]
    total = seen[-1][3]
    assert total is not None
    assert total > 8  # several batches, so there is progress to watch
    assert seen[-1][2] == total
    processed = [p for _, _, p, _ in seen]
    assert processed == sorted(processed), processed
    for _status, _stage, done, of in seen:
        if of is not None:
            assert of == total
            assert 0 <= done <= of
        else:
            assert done == 0
    assert any(0 < p < total for p in processed), "no intermediate progress was ever reported"
    stages = [stage for _, stage, _, _ in seen]
    order = ["queued", "parsing", "chunking", "embedding", "indexing", "done"]
    ranks = [order.index(s) for s in stages]
    assert ranks == sorted(ranks), stages
    assert "embedding" in stages


def test_same_bytes_twice_in_one_dataset_is_one_document(client, tmp_path: Path) -> None:
    path = make_text(tmp_path / "a.txt", "Gooseberry fool is a dessert.\n")
    first = accepted(upload(client, path))
    wait_completed(client, first["jobId"])
    total_before = client.get("/docs/jobs").json()["total"]

    again = upload(client, path, name="renamed.txt")
    assert again.status_code == 200, again.text
    body = again.json()
    assert body["duplicate"] is True
    assert body["jobId"] == first["jobId"]
    assert body["documentId"] == first["documentId"]
    assert body["status"] == "completed"
    assert again.headers["Location"] == f"/docs/jobs/{first['jobId']}"
    assert client.get("/docs/jobs").json()["total"] == total_before


def test_same_bytes_in_another_dataset_is_a_new_document(client, tmp_path: Path) -> None:
    path = make_text(tmp_path / "a.txt", "Gooseberry fool is a dessert.\n")
    first = accepted(upload(client, path))
    other = client.post("/datasets", json={"name": "other"}).json()["id"]
    second = accepted(upload(client, path, dataset_id=other))
    assert second["documentId"] != first["documentId"]
    assert second["jobId"] != first["jobId"]
    job = wait_completed(client, second["jobId"])
    assert job["datasetId"] == other
    wait_completed(client, first["jobId"])
    assert [r["documentId"] for r in search(client, other, "gooseberry")] == [second["documentId"]]


def test_idempotency_key_replays_the_first_answer(client, tmp_path: Path) -> None:
    path = make_text(tmp_path / "a.txt", "Quince jelly sets slowly.\n")
    headers = {"Idempotency-Key": "upload-quince-1"}
    first = accepted(upload(client, path, headers=headers))
    total = client.get("/docs/jobs").json()["total"]

    replay = upload(client, path, headers=headers)
    assert replay.status_code == 202, replay.text
    assert replay.json()["duplicate"] is False
    assert replay.json()["jobId"] == first["jobId"]
    assert replay.json()["documentId"] == first["documentId"]
    assert client.get("/docs/jobs").json()["total"] == total == 1
    wait_completed(client, first["jobId"])


def test_idempotency_key_with_another_file_is_a_conflict(client, tmp_path: Path) -> None:
    headers = {"Idempotency-Key": "k-42"}
    accepted(upload(client, make_text(tmp_path / "a.txt", "first file\n"), headers=headers))
    response = upload(client, make_text(tmp_path / "b.txt", "second file\n"), headers=headers)
    assert response.status_code == 409, response.text
    assert response.json()["code"] == "idempotency_key_reused"
    assert "Idempotency-Key" in response.json()["error"]
    assert client.get("/docs/jobs").json()["total"] == 1


def test_invalid_idempotency_key_is_refused(client, tmp_path: Path) -> None:
    path = make_text(tmp_path / "a.txt", "text\n")
    for key in ("k" * 300, "has space", "ünïcode"):
        response = upload(client, path, headers={"Idempotency-Key": key.encode()})
        assert response.status_code == 400, (key, response.text)
        assert "Idempotency-Key" in response.json()["error"]
    assert client.get("/docs/jobs").json()["total"] == 0


def test_upload_to_a_dataset_by_query_and_by_form_field(client, tmp_path: Path) -> None:
    by_query = client.post("/datasets", json={"name": "q"}).json()["id"]
    by_field = client.post("/datasets", json={"name": "f"}).json()["id"]
    one = accepted(upload(client, make_text(tmp_path / "1.txt", "one\n"), dataset_id=by_query))
    two = accepted(upload(client, make_text(tmp_path / "2.txt", "two\n"), dataset_field=by_field))
    assert wait_completed(client, one["jobId"])["datasetId"] == by_query
    assert wait_completed(client, two["jobId"])["datasetId"] == by_field
    listed = client.get(f"/datasets/{by_field}/documents").json()
    assert [d["id"] for d in listed["items"]] == [two["documentId"]]


def test_concurrent_uploads_of_the_same_bytes_make_one_document(client, tmp_path: Path) -> None:
    path = make_text(tmp_path / "same.txt", "Uploaded by eight clients at once: the civet.\n")
    barrier = threading.Barrier(8)

    def send(_: int) -> tuple[int, dict]:
        barrier.wait()
        response = upload(client, path)
        return response.status_code, response.json()

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(send, range(8)))
    assert all(status in (200, 202) for status, _ in answers), answers
    assert len({body["documentId"] for _, body in answers}) == 1
    assert len({body["jobId"] for _, body in answers}) == 1
    assert sum(status == 202 for status, _ in answers) == 1
    assert client.get("/docs/jobs").json()["total"] == 1
    wait_completed(client, answers[0][1]["jobId"])
    assert client.get("/datasets").json()["items"][0]["documentCount"] == 1


def test_idempotency_key_for_another_dataset_is_a_conflict(client, tmp_path: Path) -> None:
    path = make_text(tmp_path / "a.txt", "Same bytes, same key.\n")
    headers = {"Idempotency-Key": "k-7"}
    first = accepted(upload(client, path, headers=headers))
    other = client.post("/datasets", json={"name": "other"}).json()["id"]
    response = upload(client, path, dataset_id=other, headers=headers)
    assert response.status_code == 409, response.text
    assert response.json()["code"] == "idempotency_key_reused"
    assert client.get("/docs/jobs", params={"datasetId": other}).json()["total"] == 0
    # the key still replays for the dataset it was first used with
    default = client.get(f"/docs/jobs/{first['jobId']}").json()["datasetId"]
    replay = upload(client, path, dataset_id=default, headers=headers)
    assert replay.json()["jobId"] == first["jobId"]
    wait_completed(client, first["jobId"])
