"""/datasets: create, read, update, delete, list, and the default dataset."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from tests.api.conftest import (
    accepted,
    assert_error,
    create_dataset,
    default_dataset_id,
    files_under,
    get_job,
    ingest,
    runtime_of,
    search,
    upload,
    wait_completed,
)
from tests.fixtures.documents import make_text

MISSING = "00000000-0000-4000-8000-000000000000"


def test_create_get_and_location(client) -> None:
    response = client.post(
        "/datasets", json={"name": "manuals", "description": "Product manuals", "chunkSize": 128}
    )
    assert response.status_code == 201, response.text
    created = response.json()
    assert response.headers["Location"] == f"/datasets/{created['id']}"
    assert created["name"] == "manuals"
    assert created["description"] == "Product manuals"
    assert created["chunkSize"] == 128
    assert 0 <= created["chunkOverlap"] < 64
    assert created["isDefault"] is False
    assert created["documentCount"] == 0
    assert created["chunkCount"] == 0
    assert created["embeddingModel"] == runtime_of(client).embedder.model_id

    fetched = client.get(response.headers["Location"])
    assert fetched.status_code == 200
    assert fetched.json() == created


def test_default_dataset_exists(client) -> None:
    listed = client.get("/datasets").json()
    assert listed["total"] == 1
    default = listed["items"][0]
    assert default["isDefault"] is True
    settings = runtime_of(client).settings
    assert default["chunkSize"] == settings.chunk_size


def test_duplicate_name_is_409(client) -> None:
    create_dataset(client, "same")
    error = assert_error(client.post("/datasets", json={"name": "same"}), 409, "dataset_exists")
    assert "same" in error["error"]
    assert client.get("/datasets").json()["total"] == 2


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "name"),
        ({"name": ""}, "name"),
        ({"name": "x" * 201}, "name"),
        ({"name": "ok", "chunkSize": 8}, "chunkSize"),
        ({"name": "ok", "chunkSize": 9000}, "chunkSize"),
        ({"name": "ok", "chunkOverlap": -1}, "chunkOverlap"),
        ({"name": "ok", "colour": "red"}, "colour"),
    ],
)
def test_create_validation_names_the_field(client, body: dict, field: str) -> None:
    error = assert_error(client.post("/datasets", json=body), 422, "validation_error")
    assert field in error["error"], error
    assert any(f["field"] == field for f in error["fields"]), error


def test_a_chunk_size_the_model_cannot_read_is_422_naming_its_limit(client) -> None:
    error = assert_error(
        client.post("/datasets", json={"name": "x", "chunkSize": 300}), 422, "invalid_field"
    )
    assert "between 16 and 254 tokens" in error["error"]
    assert client.get("/datasets").json()["total"] == 1


def test_create_with_overlap_not_below_half_the_size_is_refused(client) -> None:
    response = client.post("/datasets", json={"name": "x", "chunkSize": 64, "chunkOverlap": 32})
    assert response.status_code in (400, 422), response.text
    assert "chunkOverlap" in response.json()["error"]
    assert "half" in response.json()["error"]
    assert client.get("/datasets").json()["total"] == 1


def test_patch_changes_only_what_is_sent(client) -> None:
    created = create_dataset(client, "before", description="old", chunkSize=100)
    response = client.patch(f"/datasets/{created['id']}", json={"name": "after"})
    assert response.status_code == 200, response.text
    patched = response.json()
    assert patched["name"] == "after"
    assert patched["description"] == "old"
    assert patched["chunkSize"] == 100
    assert patched["updatedAt"] >= created["updatedAt"]

    patched = client.patch(
        f"/datasets/{created['id']}", json={"description": "new", "chunkSize": 120}
    ).json()
    assert (patched["name"], patched["description"], patched["chunkSize"]) == (
        "after",
        "new",
        120,
    )
    assert client.get(f"/datasets/{created['id']}").json() == patched


def test_patch_invalid_overlap_is_refused_and_changes_nothing(client) -> None:
    created = create_dataset(client, "d", chunkSize=64, chunkOverlap=8)
    response = client.patch(f"/datasets/{created['id']}", json={"chunkOverlap": 40})
    assert response.status_code in (400, 422), response.text
    message = response.json()["error"]
    assert "chunkOverlap" in message
    assert "chunkSize" in message
    # shrinking the size below twice the overlap is refused just the same
    response = client.patch(f"/datasets/{created['id']}", json={"chunkSize": 16})
    assert response.status_code in (400, 422), response.text
    assert client.get(f"/datasets/{created['id']}").json() == created


def test_patch_to_a_taken_name_is_409(client) -> None:
    create_dataset(client, "taken")
    other = create_dataset(client, "free")
    assert_error(client.patch(f"/datasets/{other['id']}", json={"name": "taken"}), 409)
    assert client.get(f"/datasets/{other['id']}").json()["name"] == "free"


def test_new_chunk_size_applies_to_new_documents(client, tmp_path: Path) -> None:
    dataset = create_dataset(client, "sized", chunkSize=200, chunkOverlap=10)
    text_ = "\n\n".join(f"Sentence number {i} talks about rivers and mills." for i in range(60))
    big = ingest(client, make_text(tmp_path / "a.txt", text_), dataset_id=dataset["id"])
    client.patch(f"/datasets/{dataset['id']}", json={"chunkSize": 32, "chunkOverlap": 4})
    small = ingest(
        client, make_text(tmp_path / "b.txt", text_ + "\nmore"), dataset_id=dataset["id"]
    )
    assert small["totalChunks"] > big["totalChunks"]


def test_unknown_and_malformed_dataset_ids(client) -> None:
    for method, suffix, body in (
        ("GET", "", None),
        ("PATCH", "", {"name": "x"}),
        ("DELETE", "", None),
        ("GET", "/documents", None),
        ("POST", "/search", {"query": "x"}),
    ):
        response = client.request(method, f"/datasets/{MISSING}{suffix}", json=body)
        assert_error(response, 404, "dataset_not_found")
        response = client.request(method, f"/datasets/not-a-uuid{suffix}", json=body)
        error = assert_error(response, 422, "validation_error")
        assert "dataset_id" in error["error"], (method, suffix, error)


def test_delete_removes_documents_jobs_chunks_and_files(client, tmp_path: Path) -> None:
    doomed = create_dataset(client, "doomed")
    kept = create_dataset(client, "kept")
    shared = make_text(tmp_path / "shared.txt", "The pangolin is shared by both datasets.\n")
    only = make_text(tmp_path / "only.txt", "The axolotl lives only in the doomed one.\n")
    jobs = [ingest(client, p, dataset_id=doomed["id"]) for p in (shared, only)]
    kept_job = ingest(client, shared, dataset_id=kept["id"])
    runtime = runtime_of(client)
    blobs = runtime.settings.data_dir / "blobs"
    assert len(files_under(blobs)) == 2

    response = client.delete(f"/datasets/{doomed['id']}")
    assert response.status_code == 204
    assert response.content == b""

    assert_error(client.get(f"/datasets/{doomed['id']}"), 404, "dataset_not_found")
    assert_error(client.post(f"/datasets/{doomed['id']}/search", json={"query": "x"}), 404)
    for job in jobs:
        assert_error(client.get(f"/docs/jobs/{job['id']}"), 404)
        assert_error(client.get(f"/docs/documents/{job['documentId']}"), 404)
    listed = client.get("/docs/jobs", params={"datasetId": doomed["id"]}).json()
    assert listed["total"] == 0
    with runtime.db.read() as conn:
        left = conn.execute(
            text("SELECT count(*) FROM chunks WHERE dataset_id = :d"), {"d": doomed["id"]}
        ).scalar()
    assert left == 0
    # the other dataset keeps its copy of the shared file; the file only the doomed one had is gone
    assert get_job(client, kept_job["id"])["status"] == "completed"
    assert search(client, kept["id"], "pangolin")[0]["documentId"] == kept_job["documentId"]
    assert len(files_under(blobs)) == 1
    assert client.get("/datasets").json()["total"] == 2


def test_default_dataset_cannot_be_deleted(client) -> None:
    default = default_dataset_id(client)
    error = assert_error(client.delete(f"/datasets/{default}"), 409, "default_dataset")
    assert "default" in error["error"]
    assert client.get(f"/datasets/{default}").status_code == 200


def test_list_pagination(client) -> None:
    names = [f"set-{i:02d}" for i in range(25)]
    for name in names:
        create_dataset(client, name)
    total = 26  # with the default dataset
    seen: list[str] = []
    for page, size, more in ((1, 10, True), (2, 10, True), (3, 10, False)):
        listed = client.get("/datasets", params={"page": page, "limit": 10}).json()
        assert listed["total"] == total
        assert listed["page"] == page
        assert listed["limit"] == 10
        assert listed["hasMore"] is more
        assert len(listed["items"]) == (size if more else total - 20)
        seen += [d["name"] for d in listed["items"]]
    assert len(set(seen)) == total
    assert [n for n in seen if n.startswith("set-")] == names  # oldest first
    beyond = client.get("/datasets", params={"page": 9, "limit": 10}).json()
    assert beyond["items"] == []
    assert beyond["hasMore"] is False
    assert beyond["total"] == total
    exact = client.get("/datasets", params={"page": 2, "limit": 13}).json()
    assert len(exact["items"]) == 13
    assert exact["hasMore"] is False


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"page": 0}, "page"),
        ({"limit": 0}, "limit"),
        ({"limit": 201}, "limit"),
        ({"page": "x"}, "page"),
    ],
)
def test_list_pagination_validation(client, params: dict, field: str) -> None:
    error = assert_error(client.get("/datasets", params=params), 422, "validation_error")
    assert field in error["error"]


def test_counts_follow_documents(client, tmp_path: Path) -> None:
    dataset = create_dataset(client, "counted")
    job = ingest(client, make_text(tmp_path / "a.txt", "counted words\n"), dataset_id=dataset["id"])
    fetched = client.get(f"/datasets/{dataset['id']}").json()
    assert fetched["documentCount"] == 1
    assert fetched["chunkCount"] == job["totalChunks"]
    pending = accepted(
        upload(client, make_text(tmp_path / "b.txt", "more words\n"), dataset_id=dataset["id"])
    )
    wait_completed(client, pending["jobId"])
    assert client.get(f"/datasets/{dataset['id']}").json()["documentCount"] == 2


def test_models_lists_what_a_dataset_may_use(client) -> None:
    response = client.get("/models")
    assert response.status_code == 200, response.text
    (model,) = response.json()  # the API tests run one model: the test embedder
    assert model["id"] == runtime_of(client).embedder.model_id
    assert model["isDefault"] is True
    assert model["dimension"] == runtime_of(client).embedder.dimension
    assert model["maxTokens"] == 256


def test_a_dataset_names_its_model_and_an_unknown_one_is_422(client) -> None:
    model = runtime_of(client).embedder.model_id
    created = client.post("/datasets", json={"name": "chosen", "embeddingModel": model})
    assert created.status_code == 201, created.text
    assert created.json()["embeddingModel"] == model
    error = assert_error(
        client.post("/datasets", json={"name": "other", "embeddingModel": "no-such-model"}),
        422,
        "unknown_model",
    )
    assert "no-such-model" in error["error"]
    assert model in error["error"]  # the available models are named
    assert client.get("/datasets").json()["total"] == 2
