"""Backpressure: while too many jobs wait for a worker, uploads get 429 with Retry-After before
any byte is stored; jobs being worked on do not count, and accepting resumes as the queue drains."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import func, select

from knowledgeops.db.schema import documents
from tests.api.conftest import (
    GatedEmbedder,
    accepted,
    assert_error,
    get_job,
    runtime_of,
    upload,
    wait_completed,
)
from tests.conftest import wait_for
from tests.fixtures.documents import make_text


def test_uploads_wait_while_the_queue_is_full(
    make_client: Callable[..., TestClient], tmp_path: Path
) -> None:
    embedder = GatedEmbedder()
    client = make_client(embedder=embedder, workers=1, max_waiting_jobs=2)
    runtime = runtime_of(client)
    texts = [f"Document {n} about kettles number {n}.\n" for n in range(4)]
    paths = [make_text(tmp_path / f"d{n}.txt", text) for n, text in enumerate(texts)]

    first = accepted(upload(client, paths[0]))
    assert embedder.entered.wait(10)  # the only worker is busy with it: it does not count
    waiting = [accepted(upload(client, path)) for path in paths[1:3]]
    assert [get_job(client, w["jobId"])["status"] for w in waiting] == ["pending", "pending"]

    refused = upload(client, paths[3])
    body = assert_error(refused, 429, "backlog_full")
    assert "too many jobs are waiting" in body["error"]
    assert "2" not in body["error"]  # no count: it would tell one tenant how busy others are
    assert "KOPS_MAX_WAITING_JOBS" in body["error"]
    assert refused.headers["retry-after"] == "30"
    with runtime.db.read() as conn:  # nothing of the refused upload was kept
        assert conn.scalar(select(func.count()).select_from(documents)) == 3
    assert runtime.blobs.incoming.is_dir()
    assert list(runtime.blobs.incoming.iterdir()) == []  # not even a partial file
    stored = sorted(p.name for p in runtime.blobs.root.rglob("*") if p.is_file())
    assert len(stored) == 3

    embedder.release()
    for job in (first, *waiting):
        wait_completed(client, job["jobId"])
    wait_for(lambda: upload(client, paths[3]).status_code == 202, what="accepting again")
