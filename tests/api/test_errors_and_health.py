"""The error shape everywhere, request validation, health checks and the OpenAPI document."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.api.conftest import assert_error, default_dataset_id, ingest, runtime_of
from tests.fixtures.documents import make_text


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/nope"),
        ("GET", "/docs"),
        ("GET", "/docs/"),
        ("POST", "/docs/jobs/x/y/z"),
        ("GET", "/api/docs/missing"),
    ],
)
def test_unknown_route_is_404_json(client, method: str, path: str) -> None:
    body = assert_error(client.request(method, path), 404, "not_found")
    assert set(body) == {"error", "code"}


def test_wrong_method_is_405_json(client) -> None:
    body = assert_error(client.delete("/docs/upload"), 405, "method_not_allowed")
    assert set(body) == {"error", "code"}


def test_docs_is_not_the_swagger_page(client) -> None:
    response = client.get("/docs")
    assert response.status_code == 404
    assert "swagger" not in response.text.lower()
    assert not response.headers["content-type"].startswith("text/html")


def test_openapi_is_served_under_api(client) -> None:
    response = client.get("/api/openapi.json")
    assert response.status_code == 200
    spec = response.json()
    assert spec["info"]["title"] == "KnowledgeOps"
    paths = spec["paths"]
    for path in (
        "/docs/upload",
        "/docs/jobs/{job_id}",
        "/datasets",
        "/datasets/{dataset_id}/search",
    ):
        assert path in paths, path
    upload = paths["/docs/upload"]["post"]
    assert "202" in upload["responses"]
    assert "file" in upload["requestBody"]["content"]["multipart/form-data"]["schema"]["properties"]
    job_schema = spec["components"]["schemas"]["JobPublic"]["properties"]
    assert {"processedChunks", "totalChunks", "errorCategory", "datasetId"} <= set(job_schema)
    page = client.get("/api/docs")
    assert page.status_code == 200
    assert "swagger" in page.text.lower()


def test_healthz_and_readyz(client) -> None:
    health = client.get("/healthz")
    assert health.status_code == 200
    assert health.json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.text
    body = ready.json()
    assert body["status"] == "ready"
    assert body["ready"] is True
    assert body["database"] == "ok"
    workers = runtime_of(client).settings.workers
    assert body["workers"] == f"{workers}/{workers} running"
    assert body["relay"] == "running"
    assert body["heartbeat"] == "running"


def test_readyz_is_503_when_workers_stop(make_client) -> None:
    client = make_client()
    runtime = runtime_of(client)
    runtime.workers.stop(timeout=5)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["ready"] is False
    assert response.json()["workers"].startswith("0/")
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    "body",
    [b"{", b'{"query": "x",}', b"not json", b'{"query": "unterminated}'],
)
def test_malformed_json_is_400(client, body: bytes) -> None:
    dataset = default_dataset_id(client)
    headers = {"Content-Type": "application/json"}
    for method, path in (
        ("POST", f"/datasets/{dataset}/search"),
        ("POST", "/datasets"),
        ("PATCH", f"/datasets/{dataset}"),
    ):
        response = client.request(method, path, content=body, headers=headers)
        error = assert_error(response, 400, "invalid_json")
        assert "JSON" in error["error"], (method, path)
    assert client.get("/datasets").json()["total"] == 1


@pytest.mark.parametrize("top_k", [0, -1, 101, 10_000, "many", None])
def test_top_k_out_of_range_is_422_naming_top_k(client, top_k) -> None:
    dataset = default_dataset_id(client)
    response = client.post(f"/datasets/{dataset}/search", json={"query": "x", "topK": top_k})
    error = assert_error(response, 422, "validation_error")
    assert "topK" in error["error"]
    assert [f["field"] for f in error["fields"]] == ["topK"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "query"),
        ({"query": ""}, "query"),
        ({"query": "x" * 2001}, "query"),
        ({"query": "x", "mode": "fuzzy"}, "mode"),
        ({"query": "x", "extra": 1}, "extra"),
    ],
)
def test_search_body_validation(client, body: dict, field: str) -> None:
    dataset = default_dataset_id(client)
    error = assert_error(client.post(f"/datasets/{dataset}/search", json=body), 422)
    assert field in error["error"]


def test_search_with_only_punctuation_is_empty_not_an_error(client, tmp_path: Path) -> None:
    job = ingest(client, make_text(tmp_path / "a.txt", "The kinkajou.\n"))
    for mode in ("hybrid", "vector", "keyword"):
        response = client.post(
            f"/datasets/{job['datasetId']}/search", json={"query": '"*) OR (', "mode": mode}
        )
        assert response.status_code == 200, (mode, response.text)
        assert isinstance(response.json()["results"], list)
    keyword = client.post(
        f"/datasets/{job['datasetId']}/search", json={"query": "NEAR(", "mode": "keyword"}
    )
    assert keyword.status_code == 200, keyword.text


def test_search_response_echoes_query_and_mode(client, tmp_path: Path) -> None:
    job = ingest(client, make_text(tmp_path / "a.txt", "The binturong smells of popcorn.\n"))
    response = client.post(
        f"/datasets/{job['datasetId']}/search", json={"query": "binturong", "mode": "keyword"}
    )
    body = response.json()
    assert body["query"] == "binturong"
    assert body["mode"] == "keyword"
    default_mode = client.post(f"/datasets/{job['datasetId']}/search", json={"query": "x"})
    assert default_mode.json()["mode"] == "hybrid"


def test_unexpected_error_is_500_with_a_reference(make_client, caplog) -> None:
    client = make_client(raise_server_exceptions=False)
    runtime = runtime_of(client)

    def broken(*args, **kwargs):
        raise RuntimeError("secret internals")

    runtime.service.search.search = broken  # type: ignore[method-assign]
    response = client.post(f"/datasets/{default_dataset_id(client)}/search", json={"query": "x"})
    body = assert_error(response, 500, "internal_error")
    assert "secret internals" not in body["error"]
    reference = body["error"].split("reference ")[1].rstrip(")")
    assert any(reference in record.getMessage() for record in caplog.records)


def test_unknown_query_parameters_are_refused_not_ignored(client) -> None:
    response = client.get("/docs/jobs", params={"limt": "5"})
    body = assert_error(response, 422, "validation_error")
    assert body["fields"][0]["field"] == "limt"
    assert "limit" in body["error"]  # the parameters it does take are named
    assert client.get("/docs/jobs", params={"limit": "5"}).status_code == 200


def test_405_names_every_method_the_path_allows(client) -> None:
    response = client.put("/datasets/00000000-0000-0000-0000-000000000000")
    assert_error(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "DELETE, GET, PATCH"
