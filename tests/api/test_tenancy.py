"""Tenants see only their own data: every endpoint tried with a second tenant's key answers as
if the first tenant's data did not exist, and nothing of it leaks into any answer (search hits,
job errors, paginated totals). Runs on SQLite and on PostgreSQL (the `client` fixture)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import (
    accepted,
    create_dataset,
    files_under,
    ingest,
    runtime_of,
    upload,
    wait_completed,
    wait_done,
)
from tests.fixtures.documents import make_text

SECRET_WORDS = "quokka zanzibar marmalade"


@pytest.fixture
def two_tenants(client: TestClient, tmp_path: Path) -> dict[str, Any]:
    """Tenant "acme" (the client's own key, made for it here) owns a dataset with a completed
    document, a failed job and the default dataset; tenant "globex" owns nothing yet."""
    runtime = runtime_of(client)
    _, acme = runtime.service.keys.create("acme", "acme tests")
    _, globex = runtime.service.keys.create("globex", "globex tests")
    client.headers["Authorization"] = f"Bearer {acme}"
    dataset = create_dataset(client, "acme-private")
    text = make_text(tmp_path / "acme.txt", f"The {SECRET_WORDS} plan is confidential.\n" * 20)
    done = ingest(client, text, dataset_id=dataset["id"])
    broken = tmp_path / "acme-broken.pdf"
    broken.write_bytes(b"%PDF-1.7\n" + b"acme secret garbage " * 50)
    failed = wait_done(client, accepted(upload(client, broken))["jobId"])
    assert failed["status"] == "failed"
    return {
        "acme": {"Authorization": f"Bearer {acme}"},
        "globex": {"Authorization": f"Bearer {globex}"},
        "dataset": dataset["id"],
        "default": failed["datasetId"],
        "document": done["documentId"],
        "job": done["id"],
        "failed_job": failed["id"],
        "text": text,
    }


def _not_found_like_missing(response: Any, missing: Any) -> None:
    """404 with exactly the body an id that does not exist gets."""
    assert response.status_code == 404, response.text
    assert response.json() == missing.json()


def test_every_endpoint_answers_404_for_another_tenants_ids(
    client: TestClient, two_tenants: dict[str, Any]
) -> None:
    t, other = two_tenants, two_tenants["globex"]
    nobody = str(uuid.uuid4())
    cases = [
        ("GET", "/datasets/{}", t["dataset"], None),
        ("PATCH", "/datasets/{}", t["dataset"], {"name": "stolen"}),
        ("DELETE", "/datasets/{}", t["dataset"], None),
        ("GET", "/datasets/{}/documents", t["dataset"], None),
        ("POST", "/datasets/{}/search", t["dataset"], {"query": "quokka", "mode": "keyword"}),
        ("GET", "/docs/documents/{}", t["document"], None),
        ("GET", "/docs/documents/{}/chunks", t["document"], None),
        ("POST", "/docs/documents/{}/reindex", t["document"], None),
        ("DELETE", "/docs/documents/{}", t["document"], None),
        ("GET", "/docs/jobs/{}", t["job"], None),
        ("GET", "/docs/jobs/{}", t["failed_job"], None),
        ("POST", "/docs/jobs/{}/retry", t["failed_job"], None),
        ("POST", "/docs/jobs/{}/cancel", t["job"], None),
    ]
    for method, path, owned, body in cases:
        missing = client.request(method, path.format(nobody), json=body, headers=other)
        response = client.request(method, path.format(owned), json=body, headers=other)
        _not_found_like_missing(response, missing)
    # and the owner still has all of it, unchanged
    owner = t["acme"]
    assert client.get(f"/datasets/{t['dataset']}", headers=owner).json()["name"] == "acme-private"
    document = client.get(f"/docs/documents/{t['document']}", headers=owner).json()
    assert document["status"] == "ready"
    assert client.get(f"/docs/jobs/{t['failed_job']}", headers=owner).json()["status"] == "failed"


def test_listings_and_totals_show_nothing_of_another_tenant(
    client: TestClient, two_tenants: dict[str, Any]
) -> None:
    t, other = two_tenants, two_tenants["globex"]
    datasets = client.get("/datasets", headers=other).json()
    assert datasets["items"] == []
    assert datasets["total"] == 0
    for params in (
        {},
        {"status": "failed"},
        {"datasetId": t["dataset"]},
        {"documentId": t["document"]},
    ):
        jobs = client.get("/docs/jobs", params=params, headers=other).json()
        assert jobs["items"] == [], params
        assert jobs["total"] == 0, params
    # the owner sees its own: 2 datasets (its named one and its default), 2 jobs
    owner = t["acme"]
    assert client.get("/datasets", headers=owner).json()["total"] == 2
    assert client.get("/docs/jobs", headers=owner).json()["total"] == 2


def test_uploads_into_another_tenants_dataset_are_refused_and_store_nothing(
    client: TestClient, two_tenants: dict[str, Any], tmp_path: Path
) -> None:
    t, other = two_tenants, two_tenants["globex"]
    blobs = runtime_of(client).settings.data_dir / "blobs"
    before = files_under(blobs)
    path = make_text(tmp_path / "intruder.txt", "globex words")
    by_query = upload(client, path, dataset_id=t["dataset"], headers=other)
    assert by_query.status_code == 404
    assert by_query.json()["code"] == "dataset_not_found"
    by_form = upload(client, path, dataset_field=t["dataset"], headers=other)
    assert by_form.status_code == 404
    assert files_under(blobs) == before
    owner_docs = client.get(f"/datasets/{t['dataset']}/documents", headers=t["acme"]).json()
    assert owner_docs["total"] == 1


def test_the_same_bytes_and_idempotency_key_stay_apart_per_tenant(
    client: TestClient, two_tenants: dict[str, Any]
) -> None:
    t, other = two_tenants, two_tenants["globex"]
    key = {"Idempotency-Key": "shared-key-1"}
    first = accepted(upload(client, t["text"], headers={**t["acme"], **key}))
    replay = upload(client, t["text"], headers={**t["acme"], **key})
    assert replay.json()["jobId"] == first["jobId"]
    # globex uploads the very same bytes with the very same key: its own new document and job
    theirs = accepted(upload(client, t["text"], headers={**other, **key}))
    assert theirs["jobId"] != first["jobId"]
    assert theirs["documentId"] != first["documentId"]
    assert theirs.get("duplicate") is not True
    done = client.get(f"/docs/jobs/{theirs['jobId']}", headers=other).json()
    assert done["datasetId"] not in (t["dataset"], t["default"])
    # and acme's replay is still acme's first answer
    assert upload(client, t["text"], headers={**t["acme"], **key}).json()["jobId"] == first["jobId"]


def test_search_returns_only_the_callers_chunks(
    client: TestClient, two_tenants: dict[str, Any], tmp_path: Path
) -> None:
    other = two_tenants["globex"]
    own = make_text(tmp_path / "globex.txt", "Globex notes about a quokka colony.\n" * 10)
    mine = accepted(upload(client, own, headers=other))
    as_globex = TestClient(client.app, headers=other)  # same app, no second lifespan
    dataset = wait_completed(as_globex, mine["jobId"])["datasetId"]
    for mode in ("keyword", "vector", "hybrid"):
        response = client.post(
            f"/datasets/{dataset}/search",
            json={"query": SECRET_WORDS, "mode": mode, "topK": 50},
            headers=other,
        )
        assert response.status_code == 200, response.text
        hits = response.json()["results"]
        assert hits, mode
        assert {h["documentId"] for h in hits} == {mine["documentId"]}
        assert "confidential" not in response.text


def test_no_answer_to_the_other_tenant_contains_the_owners_data(
    client: TestClient, two_tenants: dict[str, Any]
) -> None:
    """Every GET a second tenant can make, collected: no id, name, text or error of the first
    tenant appears anywhere in them."""
    t, other = two_tenants, two_tenants["globex"]
    answers = [
        client.get(path, headers=other).text
        for path in (
            "/datasets",
            "/docs/jobs",
            "/docs/jobs?status=failed",
            f"/docs/jobs/{t['failed_job']}",
            f"/datasets/{t['dataset']}",
            f"/docs/documents/{t['document']}",
        )
    ]
    owner_error = client.get(f"/docs/jobs/{t['failed_job']}", headers=t["acme"]).json()["error"]
    assert owner_error  # the owner does see its job's error
    leaked = [t["dataset"], t["default"], t["document"], t["job"], t["failed_job"]]
    leaked += ["acme-private", "acme.txt", "acme-broken.pdf", "quokka", owner_error]
    blob = json.dumps(answers)
    for needle in leaked:
        assert needle not in blob, needle
