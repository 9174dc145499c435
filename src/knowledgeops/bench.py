"""`kops bench embedded`: the embedded default measured as a user meets it, over HTTP.

Starts `kops serve` in a fresh data folder, times start-to-ready, uploads every document of a
corpus folder (timing each accept), follows every job to the end, and prints documents, pages and
chunks per second, time-to-searchable percentiles and seconds per upload accept; `--out` writes
the same figures as JSON.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

SUFFIXES = {".pdf", ".docx", ".html", ".htm", ".md", ".markdown", ".txt"}
TERMINAL = {"completed", "failed", "cancelled"}


@dataclass
class EmbeddedFigures:
    documents: int
    completed: int
    failed: list[str]
    start_to_ready_s: float
    accept_ms_p50: float
    accept_ms_p99: float
    accept_ms_max: float
    wall_s: float
    chunks: int
    pages: int
    documents_per_s: float
    chunks_per_s: float
    pages_per_s: float
    time_to_searchable_s_p50: float
    time_to_searchable_s_p95: float
    workers: int
    extra: dict[str, Any] = field(default_factory=dict)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def corpus_files(corpus: Path) -> list[Path]:
    return sorted(p for p in corpus.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES)


def run_embedded(corpus: Path, *, workers: int = 2, timeout_s: float = 3600) -> EmbeddedFigures:
    files = corpus_files(corpus)
    if not files:
        raise SystemExit(f"no documents in {corpus}")
    with tempfile.TemporaryDirectory(prefix="kops-bench-") as data_dir:
        port = _free_port()
        env = {
            **os.environ,
            "KOPS_DATA_DIR": data_dir,
            "KOPS_PORT": str(port),
            "KOPS_WORKERS": str(workers),
            "KOPS_MAX_UPLOAD_MB": "1024",
            "HF_HUB_OFFLINE": "1",
        }
        log = Path(data_dir) / "serve.log"
        started = time.perf_counter()
        with log.open("wb") as log_file:
            server = subprocess.Popen(
                [sys.executable, "-m", "knowledgeops.cli", "serve"],
                env=env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        try:
            return _measure(files, f"http://127.0.0.1:{port}", started, workers, timeout_s, log)
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()


def _wait_ready(client: httpx.Client, started: float, log: Path) -> float:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if client.get("/readyz").status_code == 200:
                return time.perf_counter() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"kops serve did not get ready; its log:\n{log.read_text()[-3000:]}")


def _measure(
    files: list[Path],
    url: str,
    started: float,
    workers: int,
    timeout_s: float,
    log: Path,
    api_key: str | None = None,
) -> EmbeddedFigures:
    """`api_key`: default, the key `kops serve` wrote at its first start (next to `log`)."""
    with httpx.Client(base_url=url, timeout=120) as client:
        ready_s = _wait_ready(client, started, log)
        if api_key is None:  # the key `kops serve` wrote at its first start
            from knowledgeops.runtime import FIRST_KEY_FILE

            written = log.parent / FIRST_KEY_FILE
            api_key = written.read_text().strip() if written.exists() else None
        if api_key:
            client.headers["Authorization"] = f"Bearer {api_key}"
        accepts: list[float] = []
        submitted: dict[str, float] = {}
        began = time.perf_counter()
        for path in files:
            with path.open("rb") as handle:
                t0 = time.perf_counter()
                response = client.post("/docs/upload", files={"file": (path.name, handle)})
                accepts.append((time.perf_counter() - t0) * 1000)
            response.raise_for_status()
            submitted[response.json()["jobId"]] = time.perf_counter()
        finished: dict[str, dict[str, Any]] = {}
        searchable: list[float] = []
        deadline = time.monotonic() + timeout_s
        while len(finished) < len(submitted) and time.monotonic() < deadline:
            for job_id, at in submitted.items():
                if job_id in finished:
                    continue
                job = client.get(f"/docs/jobs/{job_id}").json()
                if job["status"] in TERMINAL:
                    finished[job_id] = job
                    searchable.append(time.perf_counter() - at)
            time.sleep(0.2)
        wall = time.perf_counter() - began
        pages = 0
        for job in finished.values():
            document = client.get(f"/docs/documents/{job['documentId']}").json()
            pages += document.get("pageCount") or 0
    completed = [j for j in finished.values() if j["status"] == "completed"]
    chunks = sum(j["totalChunks"] or 0 for j in completed)
    return EmbeddedFigures(
        documents=len(files),
        completed=len(completed),
        failed=[
            f"{j['fileName']}: {j['error']}"
            for j in finished.values()
            if j["status"] != "completed"
        ]
        + [f"job {j}: not finished" for j in submitted if j not in finished],
        start_to_ready_s=round(ready_s, 2),
        accept_ms_p50=round(_percentile(accepts, 50), 1),
        accept_ms_p99=round(_percentile(accepts, 99), 1),
        accept_ms_max=round(max(accepts), 1),
        wall_s=round(wall, 1),
        chunks=chunks,
        pages=pages,
        documents_per_s=round(len(completed) / wall, 3),
        chunks_per_s=round(chunks / wall, 1),
        pages_per_s=round(pages / wall, 2),
        time_to_searchable_s_p50=round(_percentile(searchable, 50), 1),
        time_to_searchable_s_p95=round(_percentile(searchable, 95), 1),
        workers=workers,
    )


def render(figures: EmbeddedFigures) -> str:
    rows = [(name, value) for name, value in asdict(figures).items() if name != "extra"]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def write_json(figures: EmbeddedFigures, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(asdict(figures), indent=2))
