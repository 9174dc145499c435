"""`kill -9` of `kops serve` loses no accepted upload and leaves no duplicate or stray chunk."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlean
import sqlite_vec

from tests.conftest import wait_for
from tests.e2e.conftest import Server
from tests.e2e.corpus import long_text
from tests.fixtures.documents import make_text

pytestmark = pytest.mark.e2e

DOCUMENTS = 8
# small batches: a job reports progress every 8 chunks, so there is a "mid-embedding" to kill in
SETTINGS = {"embed_batch_size": 8}


def write_documents(folder: Path) -> dict[str, tuple[Path, str]]:
    """~20–40 chunks each, distinct text; every sentence carries the document's own tag word."""
    folder.mkdir()
    made = {}
    for n in range(DOCUMENTS):
        tag = f"crashtag{n}q"
        path = make_text(folder / f"log-{n}.txt", long_text(tag, 22 + 2 * n, seed=n))
        made[path.name] = (path, tag)
    return made


def all_jobs(server: Server) -> list[dict[str, Any]]:
    body = server.http.get("/docs/jobs", params={"limit": 200}).json()
    items: list[dict[str, Any]] = body["items"]
    assert body["total"] == len(items)
    return items


def test_sigkill_loses_no_accepted_upload(
    kops_server: Callable[..., Server], tmp_path: Path
) -> None:
    docs = write_documents(tmp_path / "docs")
    data_dir = tmp_path / "data"

    # 1. kill right after the uploads were accepted, before the model has even loaded
    first = kops_server(data_dir=data_dir, **SETTINGS)
    accepted: dict[str, dict[str, Any]] = {}
    latencies = []
    for name, (path, _tag) in docs.items():
        body, seconds = first.upload(path)
        accepted[name] = body
        latencies.append(seconds * 1000)
    first.kill()
    print(
        f"\n[e2e figures] killed -9 right after {len(accepted)} uploads were accepted "
        f"(accept latency {min(latencies):.0f}–{max(latencies):.0f} ms, "
        f"{sum(p.stat().st_size for p, _ in docs.values()) // len(docs)} bytes each on average)"
    )

    # 2. restart, kill again while a job is half-way through embedding
    second = kops_server(data_dir=data_dir, **SETTINGS)
    print(f"[e2e figures] restart after kill -9: /readyz 200 after {second.ready_s:.2f} s")

    def mid_embedding() -> list[dict[str, Any]]:
        jobs = all_jobs(second)
        running = [
            j
            for j in jobs
            if j["status"] == "running"
            and j["stage"] == "embedding"
            and 0 < j["processedChunks"] < j["totalChunks"]
        ]
        return running

    interrupted = wait_for(mid_embedding, timeout=60, what="a job mid-embedding", interval=0.05)
    second.kill()
    seen = {j["id"]: (j["processedChunks"], j["totalChunks"]) for j in interrupted}
    print(f"[e2e figures] killed -9 mid-embedding: {seen} (processed, total)")
    with closing(open_db(data_dir / "kops.db")) as conn:  # what the crash left behind
        for job in interrupted:
            partial, visible = conn.execute(
                "SELECT count(*), coalesce(sum(v.active), 0) FROM chunks c "
                "JOIN chunk_vectors_384_v2 v ON v.rowid = c.rowid WHERE c.document_id = ?",
                (job["documentId"],),
            ).fetchone()
            assert partial >= job["processedChunks"], "the batches reported were not written"
            assert partial <= job["totalChunks"], "more chunks than the job has"
            assert visible == 0, "a half-written generation is searchable"

    # 3. restart: every accepted job completes, none lost, none stuck
    third_launched = datetime.now(UTC)
    third = kops_server(data_dir=data_dir, **SETTINGS)
    model_loaded = third_launched + timedelta(seconds=third.wait_model())
    expected = {body["jobId"]: name for name, body in accepted.items()}

    def all_done() -> list[dict[str, Any]] | None:
        jobs = all_jobs(third)
        assert {j["id"] for j in jobs} == set(expected), "a job was lost or invented"
        for job in jobs:
            assert job["status"] not in ("failed", "cancelled"), job
        return jobs if all(j["status"] == "completed" for j in jobs) else None

    jobs = wait_for(all_done, timeout=150, what="every accepted job completed", interval=0.25)
    after = time.perf_counter() - third.launched_at
    print(
        f"[e2e figures] all {len(jobs)} jobs completed {after:.1f} s "
        f"after the second restart; attempts: {sorted(j['attempt'] for j in jobs)}"
    )

    print_throughput(jobs, third_launched, model_loaded)
    by_id = {j["id"]: j for j in jobs}
    for job_id in seen:  # what was killed mid-way ran again
        assert by_id[job_id]["attempt"] >= 2, by_id[job_id]
    for job in jobs:
        assert 1 <= job["attempt"] <= job["maxAttempts"], job
        assert job["processedChunks"] == job["totalChunks"] > 0, job
        assert job["error"] is None, job
    chunk_counts = check_documents(third, jobs, {j: docs[n][1] for j, n in expected.items()})

    # SIGTERM: a graceful stop (uvicorn re-raises the signal once it has shut down)
    assert third.stop() in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in third.log(), "no graceful shutdown on SIGTERM"
    check_database(data_dir / "kops.db", chunk_counts)


def print_throughput(
    jobs: list[dict[str, Any]], launched: datetime, model_loaded: datetime
) -> None:
    ran = [j for j in jobs if datetime.fromisoformat(j["startedAt"]) >= launched]
    chunks = sum(j["totalChunks"] for j in ran)
    first = min(datetime.fromisoformat(j["startedAt"]) for j in ran)
    last = max(datetime.fromisoformat(j["finishedAt"]) for j in ran)
    busy = (last - first).total_seconds()
    embedding = (last - max(first, model_loaded)).total_seconds()
    print(
        f"[e2e figures] last run: {len(ran)} jobs, {chunks} chunks; {busy:.1f} s from the first "
        f"start to the last finish ({chunks / busy:.1f} chunks/s, model load included); "
        f"{embedding:.1f} s after the model loaded ({chunks / embedding:.1f} chunks/s, "
        "batches of 8)"
    )


def check_documents(
    server: Server, jobs: list[dict[str, Any]], tags: dict[str, str]
) -> dict[str, int]:
    """Every document: ready, its chunk count == its job's total, and a keyword search for its
    tag finds each ordinal exactly once. Returns the chunk count by document id."""
    dataset = server.default_dataset()
    chunk_counts: dict[str, int] = {}
    for job in jobs:
        document = server.http.get(f"/docs/documents/{job['documentId']}").json()
        assert document["status"] == "ready", document
        assert document["chunkCount"] == job["totalChunks"], (document, job)
        assert document["activeGeneration"] == 1, document
        hits = server.search(dataset, tags[job["id"]], mode="keyword", top_k=100)
        assert {h["documentId"] for h in hits} == {job["documentId"]}, document
        ordinals = sorted(h["ordinal"] for h in hits)
        assert ordinals == list(range(job["totalChunks"])), (document, ordinals)
        chunk_counts[job["documentId"]] = job["totalChunks"]
    return chunk_counts


def open_db(path: Path) -> Any:
    """The service's SQLite file, read-only, with sqlite-vec loaded (for the vector table)."""
    conn = sqlean.connect(f"file:{path}?mode=ro", uri=True)
    conn.enable_load_extension(True)
    sqlite_vec.load(conn)
    return conn


def check_database(path: Path, chunk_counts: dict[str, int]) -> None:
    """Read the SQLite file itself: no duplicate chunk, one generation per document, every index
    row belongs to a live chunk and every live chunk is in both indexes."""
    conn = open_db(path)
    try:
        dupes = conn.execute(
            "SELECT document_id, generation, ordinal, count(*) FROM chunks "
            "GROUP BY 1, 2, 3 HAVING count(*) > 1"
        ).fetchall()
        assert dupes == [], dupes
        rows = conn.execute(
            "SELECT c.document_id, count(DISTINCT c.generation), min(c.generation), count(*), "
            "d.chunk_count FROM chunks c JOIN documents d ON d.id = c.document_id GROUP BY 1"
        ).fetchall()
        found = {}
        for document_id, generations, generation, count, chunk_count in rows:
            assert (generations, generation) == (1, 1), (document_id, generations, generation)
            assert count == chunk_count, (document_id, count, chunk_count)
            found[document_id] = count
        assert found == chunk_counts
        total = sum(chunk_counts.values())
        vectors = conn.execute(
            "SELECT count(*), sum(active) FROM chunk_vectors_384_v2 v "
            "JOIN chunks c ON c.rowid = v.rowid"
        ).fetchone()
        assert vectors == (total, total), vectors
        assert conn.execute("SELECT count(*) FROM chunk_vectors_384_v2").fetchone()[0] == total
        fts = conn.execute("SELECT count(*) FROM chunk_fts_v2").fetchone()[0]
        assert fts == total, fts
        statuses = conn.execute("SELECT status, count(*) FROM ingest_jobs GROUP BY 1").fetchall()
        assert statuses == [("completed", len(chunk_counts))], statuses
        unpublished = conn.execute(
            "SELECT count(*) FROM outbox WHERE published_at IS NULL"
        ).fetchone()[0]
        assert unpublished == 0, unpublished
    finally:
        conn.close()
