"""A dataset's model changed over HTTP: PATCH embeddingModel answers with the re-embed job to
follow, 422 for a model that is not there, 409 while the dataset's jobs run; the job reads like
any other, counting documents."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient

from knowledgeops.lab.embedders import HashingEmbedder
from tests.api.conftest import GatedEmbedder, accepted, ingest, search, upload, wait_completed
from tests.fixtures.documents import make_text

B = "test/model-b"


def _two_models(make_client: Callable[..., TestClient]) -> tuple[TestClient, GatedEmbedder]:
    a = GatedEmbedder(closed=False)  # the default model; its gate can hold an ingest
    return make_client(embedder=[a, HashingEmbedder(model_id=B, salt="b:")]), a


def test_patching_the_model_reembeds_the_dataset_and_its_job_counts_documents(
    make_client: Callable[..., TestClient], tmp_path: Path
) -> None:
    client, _ = _two_models(make_client)
    created = client.post("/datasets", json={"name": "notes"}).json()
    assert created["documentModels"] == {}
    assert created["reembedJobId"] is None
    for n in range(3):
        ingest(
            client,
            make_text(tmp_path / f"n{n}.txt", f"note {n} on heartbeats and leases"),
            dataset_id=created["id"],
        )
    before = client.get(f"/datasets/{created['id']}").json()
    assert before["documentModels"] == {"test/hashing-embedder": 3}

    response = client.patch(f"/datasets/{created['id']}", json={"embeddingModel": B})
    assert response.status_code == 200, response.text
    patched = response.json()
    assert patched["embeddingModel"] == B
    job = wait_completed(client, patched["reembedJobId"])
    assert (job["kind"], job["unit"], job["documentId"], job["fileName"]) == (
        "reembed",
        "documents",
        None,
        None,
    )
    assert (job["processedChunks"], job["totalChunks"]) == (3, 3)
    after = client.get(f"/datasets/{created['id']}").json()
    assert after["documentModels"] == {B: 3}
    assert after["chunkCount"] == before["chunkCount"]
    listed = client.get("/docs/jobs", params={"datasetId": created["id"]}).json()["items"]
    assert next(j["kind"] for j in listed) == "reembed"
    hits = search(client, created["id"], "note 2 heartbeats", mode="vector", top_k=3)
    assert hits
    assert hits[0]["fileName"] == "n2.txt"


def test_an_unknown_model_is_422_naming_the_models_and_a_busy_dataset_409(
    make_client: Callable[..., TestClient], tmp_path: Path
) -> None:
    client, a = _two_models(make_client)
    dataset = client.post("/datasets", json={"name": "busy"}).json()
    ingest(client, make_text(tmp_path / "a.txt", "first document"), dataset_id=dataset["id"])
    unknown = client.patch(f"/datasets/{dataset['id']}", json={"embeddingModel": "nope/x"})
    assert unknown.status_code == 422
    assert unknown.json()["code"] == "unknown_model"
    assert B in unknown.json()["error"]
    assert "test/hashing-embedder" in unknown.json()["error"]

    a.close_gate()  # the next upload's job holds at its first batch
    job = accepted(
        upload(client, make_text(tmp_path / "b.txt", "second"), dataset_id=dataset["id"])
    )
    assert a.entered.wait(20)
    busy = client.patch(f"/datasets/{dataset['id']}", json={"embeddingModel": B})
    assert busy.status_code == 409
    body = busy.json()
    assert body["code"] == "jobs_in_progress"
    assert job["jobId"] in body["error"]
    assert "wait for them" in body["error"]
    unchanged = client.get(f"/datasets/{dataset['id']}").json()
    assert unchanged["embeddingModel"] == "test/hashing-embedder"
    assert unchanged["reembedJobId"] is None
    a.release()
    wait_completed(client, job["jobId"])
    assert client.patch(f"/datasets/{dataset['id']}", json={"embeddingModel": B}).status_code == 200
