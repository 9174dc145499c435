"""Metadata given at upload, and search filters on it, on file types and on document ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.api.conftest import (
    accepted,
    assert_error,
    default_dataset_id,
    files_under,
    runtime_of,
    wait_completed,
)
from tests.fixtures.documents import make_markdown, make_text


def upload_with(client: Any, path: Path, metadata: Any) -> Any:
    data = {"metadata": metadata if isinstance(metadata, str) else json.dumps(metadata)}
    files = {"file": (path.name, path.read_bytes(), "application/octet-stream")}
    return client.post("/docs/upload", data=data, files=files)


def find(client: Any, query: str, where: dict[str, Any], top_k: int = 3) -> Any:
    dataset = default_dataset_id(client)
    return client.post(
        f"/datasets/{dataset}/search",
        json={"query": query, "mode": "hybrid", "topK": top_k, "filter": where},
    )


def test_metadata_is_kept_and_search_filters_on_it(client, tmp_path: Path) -> None:
    infra = make_text(tmp_path / "infra.txt", "Rotating the etcd certificates every year.")
    web = make_markdown(tmp_path / "web.md", "# Certificates\n\nRotating TLS certificates.")
    jobs = [
        accepted(upload_with(client, infra, {"team": "infra", "year": 2025, "public": False})),
        accepted(upload_with(client, web, {"team": "web", "year": 2024})),
    ]
    for job in jobs:
        wait_completed(client, job["jobId"])
    document = client.get(f"/docs/documents/{jobs[0]['documentId']}").json()
    assert document["metadata"] == {"team": "infra", "year": 2025, "public": False}
    assert document["fileType"] == "txt"

    def files(where: dict[str, Any]) -> list[str]:
        response = find(client, "rotating certificates", where)
        assert response.status_code == 200, response.text
        return [hit["fileName"] for hit in response.json()["results"]]

    assert files({}) != []
    assert files({"metadata": {"team": "infra"}}) == ["infra.txt"]
    assert files({"metadata": {"year": {"in": [2024, 2023]}}}) == ["web.md"]
    assert files({"metadata": {"public": False}}) == ["infra.txt"]
    assert files({"fileTypes": ["md"]}) == ["web.md"]
    assert files({"documentIds": [jobs[1]["documentId"]]}) == ["web.md"]
    assert files({"metadata": {"team": "infra"}, "fileTypes": ["md"]}) == []


def test_bad_metadata_is_422_and_stores_nothing(client, tmp_path: Path) -> None:
    path = make_text(tmp_path / "a.txt", "some text")
    for metadata, said in (
        ("{not json", "not valid JSON"),
        ('["a", "b"]', "must be a JSON object"),
        ({"nested": {"a": 1}}, "must be a string, a number"),
        ({"bad key!": 1}, "the key 'bad key!'"),
        ({"long": "x" * 1001}, "longer than 1000"),
        ({f"k{n}": n for n in range(33)}, "at most 32 keys"),
    ):
        error = assert_error(upload_with(client, path, metadata), 422, "invalid_metadata")
        assert said in error["error"], error
    assert client.get("/docs/jobs").json()["total"] == 0
    assert files_under(runtime_of(client).settings.data_dir / "incoming") == []


def test_a_filter_on_an_unknown_field_is_422(client) -> None:
    for where, field in (
        ({"colour": "red"}, "colour"),
        ({"fileTypes": ["exe"]}, "fileTypes"),
        ({"documentIds": ["not-a-uuid"]}, "documentIds"),
        ({"metadata": {"team": {"like": "inf%"}}}, "metadata"),
    ):
        error = assert_error(find(client, "anything", where), 422, "validation_error")
        assert field in error["error"], error
