"""`kops serve` end to end: real files of every format in, the right document out of search."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import KOPS, Server, free_port, kops_env
from tests.e2e.corpus import TOPICS, write_topics

pytestmark = pytest.mark.e2e

ORDER = {"pending": 0, "running": 1, "completed": 2}


def _when(value: str) -> datetime:
    return datetime.fromisoformat(value)


def follow_jobs(
    server: Server, job_ids: dict[str, str], timeout: float = 120.0
) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    """Poll every job until all are completed, checking on every poll that each one only moves
    forward. Returns the final jobs and, per job, the seconds from the first poll to completion."""
    seen: dict[str, dict[str, Any]] = {}
    done_after: dict[str, float] = {}
    started = time.perf_counter()
    deadline = time.monotonic() + timeout
    while len(done_after) < len(job_ids):
        for name, job_id in job_ids.items():
            if name in done_after:
                continue
            job = server.job(job_id)
            status = job["status"]
            assert status in ORDER, f"{name}: unexpected status {status}: {job}"
            before = seen.get(name)
            if before is not None:
                assert ORDER[status] >= ORDER[before["status"]], (
                    f"{name}: status went back from {before['status']} to {status}"
                )
                assert job["processedChunks"] >= before["processedChunks"], (
                    f"{name}: processedChunks went down: {before['processedChunks']} → "
                    f"{job['processedChunks']}"
                )
                if before["totalChunks"] is not None:
                    assert job["totalChunks"] == before["totalChunks"], f"{name}: total changed"
            if job["totalChunks"] is not None:
                assert 0 <= job["processedChunks"] <= job["totalChunks"], f"{name}: {job}"
            else:
                assert job["processedChunks"] == 0, f"{name}: progress without a total: {job}"
            seen[name] = job
            if status == "completed":
                assert job["processedChunks"] == job["totalChunks"] > 0, f"{name}: {job}"
                assert job["attempt"] == 1, f"{name}: {job}"
                done_after[name] = time.perf_counter() - started
        if time.monotonic() > deadline:
            pytest.fail(f"jobs not completed within {timeout:g} s: {seen}")
        time.sleep(0.1)
    return seen, done_after


def test_serve_ingest_search(kops_server: Callable[..., Server], tmp_path: Path) -> None:
    server = kops_server()
    model_s = server.wait_model()
    files = write_topics(tmp_path / "docs")

    job_ids: dict[str, str] = {}
    accept_s: dict[str, float] = {}
    for name, path in files.items():
        body, seconds = server.upload(path)
        assert body["status"] == "pending"
        job_ids[name], accept_s[name] = body["jobId"], seconds

    jobs, done_after = follow_jobs(server, job_ids)

    dataset = server.default_dataset()
    for topic in TOPICS:
        for mode in ("vector", "hybrid"):
            hits = server.search(dataset, topic.question, mode=mode)
            assert hits, f"{mode} search for {topic.question!r} found nothing"
            first = hits[0]
            ranked = [(h["fileName"], h["page"], round(h["score"], 4)) for h in hits]
            assert first["fileName"] == topic.file_name, (
                f"{mode}: {topic.question!r} should find {topic.file_name} first: {ranked}"
            )
            if topic.page is not None:
                assert first["page"] is not None, f"PDF hit without a page: {first}"
                assert first["page"] <= topic.page <= first["pageEnd"], (
                    f"{mode}: {topic.question!r} should hit page {topic.page}: {ranked}"
                )
            else:
                assert first["page"] is None, first
    for hit in server.search(dataset, "volcano eruption magma", mode="vector", top_k=10):
        if hit["fileName"] == "volcanoes.pdf":
            assert 1 <= hit["page"] <= hit["pageEnd"] <= 3, hit
    # the HTML page's chrome and scripts were not indexed
    for words in (
        "pageview analytics",
        "Sidebar Chapter",
        "Sponsored widgets",
        "ACME footer",
        "trackingCode",
        "console log head script",
        "color red css",
    ):
        hits = server.search(dataset, words, mode="keyword", top_k=20)
        assert not [h for h in hits if h["fileName"] == "honeybees.html"], (words, hits)
    # the Latin-1 text was decoded as Latin-1
    hits = server.search(dataset, "crème fraîche Évêque", mode="keyword")
    assert hits, "no hit for Latin-1 words"
    assert hits[0]["fileName"] == "camembert.txt", hits
    assert "crème fraîche" in hits[0]["text"], hits[0]
    assert "Pont-l'Évêque" in hits[0]["text"], hits[0]

    # the figures the lead asked for
    total_chunks = sum(job["totalChunks"] for job in jobs.values())
    first_start = min(_when(job["startedAt"]) for job in jobs.values())
    last_finish = max(_when(job["finishedAt"]) for job in jobs.values())
    busy_s = (last_finish - first_start).total_seconds()
    print(
        f"\n[e2e figures] kops serve: /readyz 200 after {server.ready_s:.2f} s, "
        f"model loaded after {model_s:.2f} s (from process start)"
    )
    for name in files:
        job = jobs[name]
        run_s = (_when(job["finishedAt"]) - _when(job["startedAt"])).total_seconds()
        print(
            f"[e2e figures] {name:16} accepted in {accept_s[name] * 1000:6.1f} ms; "
            f"{job['totalChunks']:3} chunks; completed {done_after[name]:5.2f} s after the "
            f"uploads; ran {run_s:5.2f} s"
        )
    print(
        f"[e2e figures] {total_chunks} chunks in {busy_s:.2f} s from the first start to the "
        f"last finish: {total_chunks / busy_s:.1f} chunks/s (parsing and indexing included)"
    )


def test_second_serve_on_same_data_dir_refuses(
    kops_server: Callable[..., Server], tmp_path: Path
) -> None:

    first = kops_server()
    started = time.perf_counter()
    second = subprocess.run(
        [*KOPS, "serve", "--port", str(free_port())],
        env=kops_env(first.data_dir),
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
        check=False,
    )
    seconds = time.perf_counter() - started
    stderr = " ".join(second.stderr.decode(errors="replace").split())
    assert second.returncode != 0, stderr
    assert seconds < 10, f"the second serve took {seconds:.1f} s to give up"
    assert "Traceback" not in stderr, stderr
    assert f"pid {first.pid}" in stderr, stderr
    assert "already using the data folder" in stderr, stderr
    assert str(first.data_dir.resolve()) in stderr, stderr
    assert "Stop the other process" in stderr, stderr
    assert "KOPS_DATA_DIR" in stderr, stderr
    print(f"\n[e2e figures] second kops serve refused in {seconds:.2f} s")

    # the first one is unaffected
    assert first.alive()
    assert first.http.get("/readyz").status_code == 200
    assert (first.data_dir / "kops.lock").read_text().strip() == str(first.pid)
    body, _ = first.upload(_small_text(tmp_path))
    assert first.job(body["jobId"])["id"] == body["jobId"]


def _small_text(folder: Path) -> Path:
    path = folder / "note.txt"
    path.write_text("A short note about lighthouses and the keepers who tended their lamps.\n")
    return path


def test_an_open_event_stream_does_not_hold_the_shutdown(
    kops_server: Callable[..., Server],
) -> None:
    """A browser tab left open on a stream: SIGTERM still stops `kops serve` at once, not after
    the 20 s graceful timeout (the server ends its streams when it is told to stop)."""
    server = kops_server()
    dataset = server.default_dataset()
    headers = {"Authorization": f"Bearer {server.api_key}"}
    with httpx.stream(
        "GET", f"{server.url}/datasets/{dataset}/events", headers=headers, timeout=30
    ) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(lines) == ": stream open"
        began = time.perf_counter()
        code = server.stop(timeout=30)
        seconds = time.perf_counter() - began
        # a graceful stop: uvicorn re-raises the signal once it has shut down
        assert code in (0, -signal.SIGTERM), server.log()
        assert "Application shutdown complete" in server.log()
        assert seconds < 10, f"kops serve took {seconds:.1f} s to stop with a stream open"
        rest = list(lines)  # raises if the body was cut rather than ended
        assert rest[:2] == ["id: 0", "retry: 2000"], rest  # the rest of the opening, then the end
    print(f"\n[e2e figures] kops serve stopped in {seconds:.2f} s with an event stream open")
