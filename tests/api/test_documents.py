"""/docs/documents and /datasets/{id}/documents: list, read, delete, reindex."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.api.conftest import (
    GatedEmbedder,
    accepted,
    assert_error,
    create_dataset,
    files_under,
    get_job,
    ingest,
    runtime_of,
    search,
    upload,
    wait_completed,
    wait_done,
    wait_status,
)
from tests.fixtures.documents import make_corrupt_pdf, make_text

MISSING = "00000000-0000-4000-8000-000000000000"


def test_get_document(client, tmp_path: Path) -> None:
    path = make_text(tmp_path / "notes.txt", "The tapir sleeps.\n")
    job = ingest(client, path)
    response = client.get(f"/docs/documents/{job['documentId']}")
    assert response.status_code == 200
    doc = response.json()
    assert doc["id"] == job["documentId"]
    assert doc["datasetId"] == job["datasetId"]
    assert doc["fileName"] == "notes.txt"
    assert doc["fileSize"] == path.stat().st_size
    assert doc["contentType"] == "text/plain"
    assert len(doc["sha256"]) == 64
    assert doc["status"] == "ready"
    assert doc["searchable"] is True
    assert doc["chunkCount"] == job["totalChunks"]
    assert doc["latestJobId"] == job["id"]
    assert doc["activeGeneration"] == 1


def test_list_documents_paginated_newest_first(client, tmp_path: Path) -> None:
    dataset = create_dataset(client, "many")["id"]
    ids = []
    for i in range(5):
        path = make_text(tmp_path / f"d{i}.txt", f"Document number {i}.\n")
        ids.append(ingest(client, path, dataset_id=dataset)["documentId"])
    first = client.get(f"/datasets/{dataset}/documents", params={"limit": 2}).json()
    assert first["total"] == 5
    assert first["hasMore"] is True
    assert [d["id"] for d in first["items"]] == ids[::-1][:2]
    last = client.get(f"/datasets/{dataset}/documents", params={"limit": 2, "page": 3}).json()
    assert [d["id"] for d in last["items"]] == [ids[0]]
    assert last["hasMore"] is False
    # documents of other datasets are not listed
    ingest(client, make_text(tmp_path / "else.txt", "Elsewhere.\n"))
    assert client.get(f"/datasets/{dataset}/documents").json()["total"] == 5


def test_list_documents_filtered_by_status(client, tmp_path: Path) -> None:
    dataset = create_dataset(client, "mixed")["id"]
    good = ingest(client, make_text(tmp_path / "a.txt", "good\n"), dataset_id=dataset)
    bad = accepted(upload(client, make_corrupt_pdf(tmp_path / "b.pdf"), dataset_id=dataset))
    assert wait_done(client, bad["jobId"])["status"] == "failed"

    ready = client.get(f"/datasets/{dataset}/documents", params={"status": "ready"}).json()
    assert [d["id"] for d in ready["items"]] == [good["documentId"]]
    assert ready["total"] == 1
    failed = client.get(f"/datasets/{dataset}/documents", params={"status": "failed"}).json()
    assert [d["id"] for d in failed["items"]] == [bad["documentId"]]
    assert failed["items"][0]["searchable"] is False
    none = client.get(f"/datasets/{dataset}/documents", params={"status": "pending"}).json()
    assert none == {"items": [], "total": 0, "page": 1, "limit": 20, "hasMore": False}
    error = assert_error(
        client.get(f"/datasets/{dataset}/documents", params={"status": "bogus"}), 422
    )
    assert "status" in error["error"]


def test_delete_document(client, tmp_path: Path) -> None:
    job = ingest(client, make_text(tmp_path / "a.txt", "The quetzal has green feathers.\n"))
    kept = ingest(client, make_text(tmp_path / "b.txt", "The quetzal is also here.\n"))
    document = job["documentId"]
    assert {h["documentId"] for h in search(client, job["datasetId"], "quetzal")} == {
        document,
        kept["documentId"],
    }

    response = client.delete(f"/docs/documents/{document}")
    assert response.status_code == 204
    assert response.content == b""
    for mode in ("hybrid", "vector", "keyword"):
        hits = search(client, job["datasetId"], "quetzal", mode=mode, top_k=20)
        assert document not in {h["documentId"] for h in hits}, mode
        assert kept["documentId"] in {h["documentId"] for h in hits}, mode
    assert_error(client.get(f"/docs/documents/{document}"), 404, "document_not_found")
    assert_error(client.get(f"/docs/jobs/{job['id']}"), 404)
    assert_error(client.delete(f"/docs/documents/{document}"), 404, "document_not_found")
    assert len(files_under(runtime_of(client).settings.data_dir / "blobs")) == 1

    # the same bytes can be uploaded again afterwards, as a new document
    again = ingest(client, make_text(tmp_path / "a.txt", "The quetzal has green feathers.\n"))
    assert again["documentId"] != document


def test_delete_while_processing(make_client, tmp_path: Path) -> None:
    client = make_client(embedder=GatedEmbedder())
    created = accepted(upload(client, make_text(tmp_path / "a.txt", "The jerboa hops.\n")))
    assert client.runtime.embedder.entered.wait(10)
    assert client.delete(f"/docs/documents/{created['documentId']}").status_code == 204
    client.runtime.embedder.release()
    assert_error(client.get(f"/docs/jobs/{created['jobId']}"), 404)
    dataset = client.get("/datasets").json()["items"][0]["id"]
    follow = ingest(client, make_text(tmp_path / "b.txt", "Another jerboa.\n"))
    assert [h["documentId"] for h in search(client, dataset, "jerboa", top_k=10)] == [
        follow["documentId"]
    ]


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_unknown_and_malformed_document_ids(client, method: str) -> None:
    assert_error(client.request(method, f"/docs/documents/{MISSING}"), 404, "document_not_found")
    error = assert_error(client.request(method, "/docs/documents/12345"), 422, "validation_error")
    assert "document_id" in error["error"]


def test_reindex(make_client, tmp_path: Path) -> None:
    embedder = GatedEmbedder(closed=False)
    client = make_client(embedder=embedder)
    first = ingest(client, make_text(tmp_path / "a.txt", "The manatee grazes on seagrass.\n"))
    document, dataset = first["documentId"], first["datasetId"]

    embedder.close_gate()
    response = client.post(f"/docs/documents/{document}/reindex")
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["documentId"] == document
    assert body["status"] == "pending"
    assert body["jobId"] != first["id"]
    assert response.headers["Location"] == f"/docs/jobs/{body['jobId']}"
    assert embedder.entered.wait(10)

    running = get_job(client, body["jobId"])
    assert running["kind"] == "reindex"
    assert running["status"] == "running"
    assert running["documentId"] == document
    # during the reindex the current generation stays searchable, exactly once
    for mode in ("hybrid", "vector", "keyword"):
        hits = search(client, dataset, "manatee", mode=mode, top_k=10)
        assert [h["documentId"] for h in hits] == [document], mode
    doc = client.get(f"/docs/documents/{document}").json()
    assert doc["searchable"] is True
    assert doc["latestJobId"] == body["jobId"]
    # a second reindex while one is open is a conflict
    conflict = assert_error(client.post(f"/docs/documents/{document}/reindex"), 409)
    assert conflict["code"] == "job_in_progress"
    assert body["jobId"] in conflict["error"]

    embedder.release()
    done = wait_completed(client, body["jobId"])
    assert done["kind"] == "reindex"
    assert done["processedChunks"] == done["totalChunks"] == first["totalChunks"]
    for mode in ("hybrid", "vector", "keyword"):
        hits = search(client, dataset, "manatee", mode=mode, top_k=10)
        assert [h["documentId"] for h in hits] == [document], mode
    doc = client.get(f"/docs/documents/{document}").json()
    assert doc["activeGeneration"] == 2
    assert doc["status"] == "ready"
    assert doc["chunkCount"] == first["totalChunks"]
    jobs = client.get("/docs/jobs", params={"documentId": document}).json()
    assert {j["kind"] for j in jobs["items"]} == {"ingest", "reindex"}
    assert get_job(client, first["id"])["status"] == "completed"


def test_reindex_while_first_ingest_is_open_is_409(make_client, tmp_path: Path) -> None:
    client = make_client(embedder=GatedEmbedder())
    created = accepted(upload(client, make_text(tmp_path / "a.txt", "The dugong.\n")))
    wait_status(client, created["jobId"], {"running"})
    assert_error(client.post(f"/docs/documents/{created['documentId']}/reindex"), 409)
    client.runtime.embedder.release()
    wait_completed(client, created["jobId"])
    response = client.post(f"/docs/documents/{created['documentId']}/reindex")
    assert response.status_code == 202
    wait_completed(client, response.json()["jobId"])


def test_reindex_applies_new_chunk_settings(client, tmp_path: Path) -> None:
    dataset = create_dataset(client, "rechunk", chunkSize=200, chunkOverlap=10)["id"]
    text_ = "\n\n".join(f"Line {i} describes the harbour seal." for i in range(60))
    first = ingest(client, make_text(tmp_path / "a.txt", text_), dataset_id=dataset)
    client.patch(f"/datasets/{dataset}", json={"chunkSize": 32, "chunkOverlap": 4})
    job_id = client.post(f"/docs/documents/{first['documentId']}/reindex").json()["jobId"]
    second = wait_completed(client, job_id)
    assert second["totalChunks"] > first["totalChunks"]
    assert client.get(f"/datasets/{dataset}").json()["chunkCount"] == second["totalChunks"]
    hits = search(client, dataset, "seal", mode="keyword", top_k=100)
    assert len(hits) == second["totalChunks"]  # the old generation is gone from the index


def test_reindex_unknown_document_is_404(client) -> None:
    assert_error(client.post(f"/docs/documents/{MISSING}/reindex"), 404, "document_not_found")


def test_delete_keeps_a_file_another_document_shares(client, tmp_path: Path) -> None:
    other = create_dataset(client, "other")["id"]
    path = make_text(tmp_path / "a.txt", "The shared okapi text.\n")
    mine = ingest(client, path)
    theirs = ingest(client, path, dataset_id=other)
    assert client.delete(f"/docs/documents/{mine['documentId']}").status_code == 204
    assert len(files_under(runtime_of(client).settings.data_dir / "blobs")) == 1
    # the other document still has its file: it can be processed again
    job_id = client.post(f"/docs/documents/{theirs['documentId']}/reindex").json()["jobId"]
    wait_completed(client, job_id)
    assert search(client, other, "okapi")[0]["documentId"] == theirs["documentId"]


def test_delete_dataset_while_a_job_runs(make_client, tmp_path: Path) -> None:
    client = make_client(embedder=GatedEmbedder())
    dataset = create_dataset(client, "short-lived")["id"]
    created = accepted(
        upload(client, make_text(tmp_path / "a.txt", "The gerenuk.\n"), dataset_id=dataset)
    )
    assert client.runtime.embedder.entered.wait(10)
    assert client.delete(f"/datasets/{dataset}").status_code == 204
    client.runtime.embedder.release()
    assert_error(client.get(f"/docs/jobs/{created['jobId']}"), 404)
    # the worker gave the job up; it is free for new work, and nothing of the dataset came back
    follow = ingest(client, make_text(tmp_path / "b.txt", "Next.\n"))
    assert follow["status"] == "completed"
    assert client.get("/docs/jobs").json()["total"] == 1
    assert files_under(runtime_of(client).settings.data_dir / "blobs") == [
        runtime_of(client).blobs.path(
            client.get(f"/docs/documents/{follow['documentId']}").json()["sha256"]
        )
    ]


def test_cancelled_reindex_keeps_the_previous_generation(make_client, tmp_path: Path) -> None:
    embedder = GatedEmbedder(closed=False)
    client = make_client(embedder=embedder)
    first = ingest(client, make_text(tmp_path / "a.txt", "The pika gathers hay.\n"))
    document = first["documentId"]
    embedder.close_gate()
    job_id = client.post(f"/docs/documents/{document}/reindex").json()["jobId"]
    assert embedder.entered.wait(10)
    assert client.post(f"/docs/jobs/{job_id}/cancel").json()["status"] == "cancelled"
    embedder.release()
    time.sleep(0.3)  # let the worker reach its next (rejected) write
    assert get_job(client, job_id)["status"] == "cancelled"
    doc = client.get(f"/docs/documents/{document}").json()
    assert doc["searchable"] is True
    assert doc["activeGeneration"] == 1
    for mode in ("hybrid", "vector", "keyword"):
        hits = search(client, first["datasetId"], "pika", mode=mode, top_k=10)
        assert [h["documentId"] for h in hits] == [document], mode


def test_a_documents_chunks_are_listed_in_order_as_search_reads_them(
    client, tmp_path: Path
) -> None:
    words = " ".join(f"okapi{i}" for i in range(300))
    job = ingest(client, make_text(tmp_path / "okapi.txt", words))
    doc_id = job["documentId"]
    first = client.get(f"/docs/documents/{doc_id}/chunks", params={"limit": 3})
    assert first.status_code == 200
    body = first.json()
    assert body["total"] == job["totalChunks"] > 3
    assert body["hasMore"] is True
    assert [c["ordinal"] for c in body["items"]] == [0, 1, 2]
    assert body["items"][0]["text"].startswith("okapi0 okapi1")
    assert all(c["tokenCount"] > 0 for c in body["items"])
    everything: list[dict] = []
    page = 1
    while True:
        got = client.get(
            f"/docs/documents/{doc_id}/chunks", params={"page": page, "limit": 200}
        ).json()
        everything += got["items"]
        if not got["hasMore"]:
            break
        page += 1
    assert [c["ordinal"] for c in everything] == list(range(job["totalChunks"]))
    assert "okapi299" in everything[-1]["text"]
    hit = search(client, job["datasetId"], "okapi150", mode="keyword")[0]
    assert hit["chunkId"] in {c["id"] for c in everything}
    assert_error(client.get(f"/docs/documents/{MISSING}/chunks"), 404, "document_not_found")


def test_a_document_not_yet_searchable_lists_no_chunks(make_client, tmp_path: Path) -> None:
    gate = GatedEmbedder()
    client = make_client(embedder=gate)
    job_id = accepted(upload(client, make_text(tmp_path / "later.txt", "lemur " * 200)))["jobId"]
    doc_id = get_job(client, job_id)["documentId"]
    body = client.get(f"/docs/documents/{doc_id}/chunks").json()
    assert (body["items"], body["total"]) == ([], 0)
    gate.release()
    wait_completed(client, job_id)
    assert client.get(f"/docs/documents/{doc_id}/chunks").json()["total"] > 0
