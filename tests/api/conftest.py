"""Fixtures for the API tests: the real FastAPI app on a real embedded runtime (SQLite in a temp
folder, worker, relay and heartbeat threads running), driven through `TestClient`.

    def test_x(client, tmp_path):
        job = wait_done(client, upload(client, make_text(tmp_path / "a.txt", "hi")).json()["jobId"])

`make_client(**settings)` builds another app when a test needs other settings or a special
embedder (see `GatedEmbedder`, `FlakyEmbedder`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from knowledgeops.db.engine import Database
from knowledgeops.errors import JobError
from knowledgeops.lab.embedders import HashingEmbedder
from knowledgeops.roles.embedded import EmbeddedRole
from tests.conftest import wait_for

TERMINAL = frozenset({"completed", "failed", "cancelled"})
JOB_FIELDS = frozenset(
    {
        "id",
        "status",
        "stage",
        "fileName",
        "fileSize",
        "totalChunks",
        "processedChunks",
        "error",
        "errorCode",
        "errorCategory",
        "retryable",
        "retries",
        "attempt",
        "maxAttempts",
        "heartbeatAt",
        "startedAt",
        "finishedAt",
        "createdAt",
        "updatedAt",
        "documentId",
        "datasetId",
    }
)
"""Every field DESIGN.md §9 promises on GET /docs/jobs/{id}."""


# --- embedders that misbehave on purpose -------------------------------------------------------


def _in_worker() -> bool:
    """True on a worker thread (the pipeline embeds chunks there); false for search queries."""
    return threading.current_thread().name.startswith("kops-worker")


class GatedEmbedder(HashingEmbedder):
    """Blocks the pipeline's embedding calls while the gate is closed (search queries pass).

    `entered` is set when a worker is waiting at the gate, so a test knows the job is running.
    The gate opens by itself after `max_wait_s`, so a forgotten gate cannot hang a test.
    """

    def __init__(self, *, closed: bool = True, max_wait_s: float = 20.0) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.max_wait_s = max_wait_s
        if not closed:
            self.gate.set()

    def close_gate(self) -> None:
        self.entered.clear()
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    def embed(self, texts: Sequence[str]) -> Any:
        if _in_worker() and not self.gate.is_set():
            self.entered.set()
            self.gate.wait(self.max_wait_s)
        return super().embed(texts)


class SlowEmbedder(HashingEmbedder):
    """Sleeps `delay_s` before each of the pipeline's batches, so progress can be watched."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    def embed(self, texts: Sequence[str]) -> Any:
        if _in_worker():
            threading.Event().wait(self.delay_s)
        return super().embed(texts)


class FlakyEmbedder(HashingEmbedder):
    """Raises `make_error()` on the pipeline's next `failures` embedding calls, then works."""

    def __init__(self, make_error: Callable[[], JobError], failures: int = 1) -> None:
        super().__init__()
        self.make_error = make_error
        self.failures = failures
        self.raised = 0
        self._guard = threading.Lock()

    def embed(self, texts: Sequence[str]) -> np.ndarray[Any, Any]:
        if _in_worker():
            with self._guard:
                fail = self.failures > 0
                if fail:
                    self.failures -= 1
                    self.raised += 1
            if fail:
                raise self.make_error()
        return super().embed(texts)  # type: ignore[no-any-return]


# --- clients -------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest) -> str | None:
    """Every API test runs on the embedded SQLite file and on PostgreSQL with pgvector: the
    same behaviour on both engines."""
    if request.param == "sqlite":
        return None
    db: Database = request.getfixturevalue("pgvector_db")
    return db.url


@pytest.fixture
def make_client(
    make_runtime: Callable[..., EmbeddedRole], database_url: str | None
) -> Iterator[Callable[..., TestClient]]:
    """Build a started app (its lifespan starts the runtime) with settings overrides (and
    `embedder=`); the client carries its runtime as `client.runtime`. Gated embedders are opened
    before shutdown. `raise_server_exceptions=False` lets a test see the 500 answer."""
    clients: list[TestClient] = []
    with ExitStack() as stack:

        def make(
            *, raise_server_exceptions: bool = True, tenant: str = "default", **overrides: Any
        ) -> TestClient:
            if database_url is not None and not clients:  # a second client: its own SQLite
                overrides.setdefault("database_url", database_url)
            runtime = make_runtime(start=False, **overrides)
            app = runtime.app()
            client = stack.enter_context(
                TestClient(app, raise_server_exceptions=raise_server_exceptions)
            )
            if runtime.settings.auth == "on":  # every request carries a key of `tenant`
                _, secret = runtime.service.keys.create(tenant, "tests")
                client.headers["Authorization"] = f"Bearer {secret}"
            client.runtime = runtime  # type: ignore[attr-defined]
            clients.append(client)
            return client

        yield make
        for client in clients:
            runtime = runtime_of(client)
            release = getattr(runtime.embedder, "release", None)
            if callable(release):
                release()


@pytest.fixture
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()


def runtime_of(client: TestClient) -> EmbeddedRole:
    runtime: EmbeddedRole = client.runtime  # type: ignore[attr-defined]
    return runtime


# --- helpers -------------------------------------------------------------------------------


def upload(
    client: TestClient,
    path: Path,
    *,
    dataset_id: str | None = None,
    dataset_field: str | None = None,
    name: str | None = None,
    content_type: str = "application/octet-stream",
    headers: dict[str, Any] | None = None,
) -> Any:
    """POST the file at `path` to /docs/upload; `dataset_id` goes in the query string,
    `dataset_field` in the multipart form."""
    params = {"datasetId": dataset_id} if dataset_id is not None else None
    data = {"datasetId": dataset_field} if dataset_field is not None else None
    files = {"file": (name or path.name, path.read_bytes(), content_type)}
    return client.post("/docs/upload", params=params, data=data, files=files, headers=headers)


def accepted(response: Any) -> dict[str, Any]:
    """The body of a 202 upload answer (fails the test with the body otherwise)."""
    assert response.status_code == 202, response.text
    body: dict[str, Any] = response.json()
    return body


def get_job(client: TestClient, job_id: str) -> dict[str, Any]:
    response = client.get(f"/docs/jobs/{job_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def wait_status(
    client: TestClient, job_id: str, statuses: Sequence[str] | frozenset[str], timeout: float = 30
) -> dict[str, Any]:
    """Poll the job until its status is one of `statuses`; returns the job."""

    def reached() -> dict[str, Any] | None:
        job = get_job(client, job_id)
        return job if job["status"] in statuses else None

    job: dict[str, Any] = wait_for(reached, timeout=timeout)
    return job


def wait_done(client: TestClient, job_id: str, timeout: float = 30) -> dict[str, Any]:
    """Poll until the job is completed, failed or cancelled; returns the job."""
    return wait_status(client, job_id, TERMINAL, timeout)


def wait_completed(client: TestClient, job_id: str, timeout: float = 30) -> dict[str, Any]:
    job = wait_done(client, job_id, timeout)
    assert job["status"] == "completed", (job.get("errorCode"), job.get("error"))
    return job


def ingest(client: TestClient, path: Path, *, timeout: float = 30, **kw: Any) -> dict[str, Any]:
    """Upload and wait until the job completed; returns the finished job."""
    return wait_completed(client, accepted(upload(client, path, **kw))["jobId"], timeout)


def search(
    client: TestClient, dataset_id: str, query: str, *, mode: str = "hybrid", top_k: int = 5
) -> list[dict[str, Any]]:
    response = client.post(
        f"/datasets/{dataset_id}/search", json={"query": query, "mode": mode, "topK": top_k}
    )
    assert response.status_code == 200, response.text
    results: list[dict[str, Any]] = response.json()["results"]
    return results


def default_dataset_id(client: TestClient) -> str:
    items = client.get("/datasets", params={"limit": 200}).json()["items"]
    return str(next(d["id"] for d in items if d["isDefault"]))


def create_dataset(client: TestClient, name: str, **fields: Any) -> dict[str, Any]:
    response = client.post("/datasets", json={"name": name, **fields})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def assert_error(response: Any, status: int, code: str | None = None) -> dict[str, Any]:
    """The response has `status` and the error shape `{"error": str, "code": str}`."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body: dict[str, Any] = response.json()
    assert isinstance(body.get("error"), str), body
    assert body["error"]
    assert isinstance(body.get("code"), str), body
    if code is not None:
        assert body["code"] == code, body
    return body


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())
