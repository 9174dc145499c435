"""The embedded default measured as a user meets it, over HTTP.

`EmbeddedServer` starts `kops serve` (or, for the pipeline's ceiling, the same service with the
null embedder) in a fresh data folder. `measure` uploads every document of a corpus (timing each
accept), follows every job to the end, and returns documents, pages and chunks per second,
time-to-searchable percentiles and the seconds each stage took (summed over jobs, from the
service's own metrics). `accept_latency` sends 100 KB uploads at a steady rate and times each
accept.
"""

from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from knowledgeops.db.engine import Database
from knowledgeops.jobs.states import TERMINAL
from knowledgeops.roles.first_key import FIRST_KEY_FILE

SUFFIXES = {".pdf", ".docx", ".html", ".htm", ".md", ".markdown", ".txt"}
STAGES = ("parsing", "chunking", "embedding", "indexing")
POLL_S = 1.0  # s between progress polls: rare enough to cost the service nothing measurable;
# the figures come from the jobs' own timestamps, so polling adds no error to them


@dataclass
class RunFigures:
    name: str
    documents: int
    completed: int
    failed: list[str]
    start_to_ready_s: float
    accept_ms_p50: float
    accept_ms_p99: float
    wall_s: float
    chunks: int
    pages: int
    documents_per_s: float
    chunks_per_s: float
    pages_per_s: float
    time_to_searchable_s_p50: float
    time_to_searchable_s_p95: float
    workers: int
    stage_seconds: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def corpus_files(corpus: Path) -> list[Path]:
    """The corpus's text documents (not formats/ and scans/: `kops bench formats` reads
    those), so that the figures compare with earlier runs and with the peer."""
    return sorted(
        p
        for p in corpus.rglob("*")
        if p.is_file()
        and p.suffix.lower() in SUFFIXES
        and not set(p.relative_to(corpus).parts[:-1]) & {"formats", "scans"}
    )


class EmbeddedServer:
    """`kops serve` in a fresh data folder, as a child process; `null_embedder` runs the same
    service with an embedder that costs nothing."""

    def __init__(
        self, *, workers: int, null_embedder: bool = False, env: dict[str, str] | None = None
    ) -> None:
        self.workers = workers
        self.null_embedder = null_embedder
        self.env = env or {}
        self._tmp = tempfile.TemporaryDirectory(prefix="kops-bench-")
        self.data_dir = Path(self._tmp.name)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.data_dir / "serve.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def __enter__(self) -> EmbeddedServer:
        env = {
            **os.environ,
            "KOPS_DATA_DIR": str(self.data_dir),
            "KOPS_PORT": str(self.port),
            "KOPS_WORKERS": str(self.workers),
            "KOPS_MAX_UPLOAD_MB": "1024",
            "KOPS_MAX_WAITING_JOBS": "100000",
            "KOPS_RATE_LIMIT": "1000000/minute",
            "HF_HUB_OFFLINE": "1",
            # the raw-model and peer phases run the fp32 model with the default threads: so
            # does the service, whatever this shell's environment says
            "KOPS_MODEL_VARIANT": "fp32",
            "KOPS_MODEL_THREADS": "0",
            **self.env,
        }
        module = ["knowledgeops.lab.bench.server"] if self.null_embedder else ["knowledgeops.cli"]
        args = [sys.executable, "-m", *module] + ([] if self.null_embedder else ["serve"])
        self.started = time.perf_counter()
        with self.log.open("wb") as log_file:
            self.process = subprocess.Popen(
                args, env=env, stdout=log_file, stderr=subprocess.STDOUT
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._tmp.cleanup()

    def cpu_seconds(self) -> float:
        """CPU time the server process has used so far (user + system, all its threads)."""
        assert self.process is not None
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def chunk_texts(self) -> list[tuple[str, int]]:
        """Every searchable chunk's text and token count, from the service's own database."""

        db = Database(f"sqlite:///{self.data_dir / 'kops.db'}")
        try:
            with db.read() as conn:
                rows = conn.execute(
                    text(
                        "SELECT c.text, c.token_count FROM chunks c JOIN documents d "
                        "ON d.id = c.document_id AND d.active_generation = c.generation"
                    )
                ).all()
        finally:
            db.dispose()
        return [(row[0], int(row[1])) for row in rows]


def wait_ready(client: httpx.Client, started: float, log: Path, timeout_s: float = 300) -> float:
    """Seconds until the service is ready and its model loaded (it accepts uploads while the
    model loads; the bench starts once it would not wait for it, as the raw model does not)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            response = client.get("/readyz")
            if response.status_code == 200 and response.json().get("model", "loaded") == "loaded":
                return time.perf_counter() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"the service did not get ready; its log:\n{log.read_text()[-3000:]}")


@contextmanager
def connect(
    url: str, started: float, log: Path, api_key: str | None = None
) -> Iterator[tuple[httpx.Client, float]]:
    """A client with the service's key (default: the first key `kops serve` wrote next to
    `log`), and the seconds from start to ready."""
    with httpx.Client(base_url=url, timeout=120) as client:
        ready_s = wait_ready(client, started, log)
        if api_key is None:
            written = log.parent / FIRST_KEY_FILE
            api_key = written.read_text().strip() if written.exists() else None
        if api_key:
            client.headers["Authorization"] = f"Bearer {api_key}"
        yield client, ready_s


def measure(
    name: str,
    client: httpx.Client,
    files: list[Path],
    *,
    ready_s: float,
    workers: int,
    timeout_s: float = 3600,
) -> RunFigures:
    """Upload `files` into a dataset of their own, wait until every job has ended, and read the
    figures back. Times come from the jobs themselves (created and finished, the service's
    clock on this machine), so polling adds no error to them."""
    before = stage_seconds(client)
    created = client.post("/datasets", json={"name": f"bench-{name}-{time.time_ns()}"})
    created.raise_for_status()
    dataset_id = created.json()["id"]
    began = time.time()
    accepts = _upload_timed(client, files, dataset_id)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and ended_jobs(client, dataset_id) < len(files):
        time.sleep(POLL_S)
    jobs = dataset_jobs(client, dataset_id)
    after = stage_seconds(client)
    ended = [j for j in jobs if j["status"] in TERMINAL]
    completed = [j for j in ended if j["status"] == "completed"]
    last = max((_epoch(j["finishedAt"]) for j in ended), default=time.time())
    wall = max(1e-6, last - began)
    searchable = [_epoch(j["finishedAt"]) - _epoch(j["createdAt"]) for j in completed]
    pages = sum(
        client.get(f"/docs/documents/{job['documentId']}").json().get("pageCount") or 0
        for job in completed
    )
    chunks = sum(j["totalChunks"] or 0 for j in completed)
    return RunFigures(
        name=name,
        documents=len(files),
        completed=len(completed),
        failed=[f"{j['fileName']}: {j['error']}" for j in ended if j["status"] != "completed"]
        + [f"{j['fileName']}: not finished" for j in jobs if j["status"] not in TERMINAL],
        start_to_ready_s=round(ready_s, 2),
        accept_ms_p50=round(percentile(accepts, 50), 1),
        accept_ms_p99=round(percentile(accepts, 99), 1),
        wall_s=round(wall, 2),
        chunks=chunks,
        pages=pages,
        documents_per_s=round(len(completed) / wall, 3),
        chunks_per_s=round(chunks / wall, 1),
        pages_per_s=round(pages / wall, 2),
        time_to_searchable_s_p50=round(percentile(searchable, 50), 2),
        time_to_searchable_s_p95=round(percentile(searchable, 95), 2),
        workers=workers,
        stage_seconds={s: round(after.get(s, 0.0) - before.get(s, 0.0), 2) for s in STAGES},
    )


def _upload_timed(client: httpx.Client, files: list[Path], dataset_id: str) -> list[float]:
    """Upload each file into the dataset; how long each took to be accepted, in ms."""
    accepts: list[float] = []
    for path in files:
        with path.open("rb") as handle:
            t0 = time.perf_counter()
            response = client.post(
                "/docs/upload",
                params={"datasetId": dataset_id},
                files={"file": (path.name, handle)},
            )
            accepts.append((time.perf_counter() - t0) * 1000)
        response.raise_for_status()
    return accepts


def ended_jobs(client: httpx.Client, dataset_id: str) -> int:
    total = 0
    for status in TERMINAL:
        response = client.get(
            "/docs/jobs", params={"datasetId": dataset_id, "status": status, "limit": 1}
        )
        response.raise_for_status()
        total += int(response.json()["total"])
    return total


def dataset_jobs(client: httpx.Client, dataset_id: str) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = []
    page = 1
    while True:
        response = client.get(
            "/docs/jobs", params={"datasetId": dataset_id, "limit": 200, "page": page}
        )
        response.raise_for_status()
        items = response.json()["items"]
        jobs.extend(items)
        if len(items) < 200:
            return jobs
        page += 1


def _epoch(stamp: str) -> float:

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def stage_seconds(client: httpx.Client) -> dict[str, float]:
    """Seconds spent in each stage, summed over all jobs so far (the service's metrics)."""

    response = client.get("/metrics")
    response.raise_for_status()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        if family.name != "kops_stage_duration_seconds":
            continue
        for sample in family.samples:
            if sample.name.endswith("_sum"):
                totals[sample.labels["stage"]] = sample.value
    return totals


@dataclass
class AcceptFigures:
    rate_per_s: float
    seconds: float
    size_kb: int
    sent: int
    accepted: int
    ms_p50: float
    ms_p99: float
    ms_max: float
    server_cores_busy: float  # CPU seconds the server used per second of the phase
    extra: dict[str, Any] = field(default_factory=dict)


def accept_latency(
    client: httpx.Client,
    server: EmbeddedServer,
    *,
    rate: float = 20.0,
    seconds: float = 10.0,
    size_kb: int = 100,
    filler: str,
    dataset_id: str | None = None,
) -> AcceptFigures:
    """Open-loop load: `rate` uploads per second of distinct `size_kb` KB text files for
    `seconds`, each timed from send to answer; a slow answer never delays the next send. The
    uploads go to `dataset_id`, or a dataset of their own, and their jobs are cancelled
    afterwards."""
    if dataset_id is None:
        dataset = client.post("/datasets", json={"name": f"bench-accept-{time.time_ns()}"})
        dataset.raise_for_status()
        dataset_id = dataset.json()["id"]
    count = int(rate * seconds)
    bodies = [_text_file(n, size_kb, filler) for n in range(count)]
    latencies: list[float] = []
    job_ids: list[str] = []
    lock = threading.Lock()

    def send(n: int) -> None:
        t0 = began + n / rate  # from when it was due: time queued in this client counts too
        response = client.post(
            "/docs/upload",
            params={"datasetId": dataset_id},
            files={"file": (f"accept-{n:04d}.txt", bodies[n], "text/plain")},
        )
        elapsed = (time.perf_counter() - t0) * 1000
        with lock:
            if response.status_code == 202:
                latencies.append(elapsed)
                job_ids.append(response.json()["jobId"])

    cpu0 = server.cpu_seconds()
    began = time.perf_counter()
    with ThreadPoolExecutor(max_workers=16) as pool:
        for n in range(count):
            delay = began + n / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            pool.submit(send, n)
    elapsed = time.perf_counter() - began
    busy = (server.cpu_seconds() - cpu0) / elapsed
    for job_id in job_ids:
        client.post(f"/docs/jobs/{job_id}/cancel")
    return AcceptFigures(
        rate_per_s=rate,
        seconds=seconds,
        size_kb=size_kb,
        sent=count,
        accepted=len(latencies),
        ms_p50=round(percentile(latencies, 50), 1),
        ms_p99=round(percentile(latencies, 99), 1),
        ms_max=round(max(latencies, default=0.0), 1),
        server_cores_busy=round(busy, 2),
    )


def _text_file(n: int, size_kb: int, filler: str) -> bytes:
    head = f"Accept-latency probe {n}: a distinct text file of {size_kb} KB.\n\n".encode()
    size = size_kb * 1024
    body = filler.encode()
    while len(body) < size:
        body += body
    return head + body[: size - len(head)]


def wait_for_stage(client: httpx.Client, job_id: str, stage: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.get(f"/docs/jobs/{job_id}").json()
        if job["stage"] == stage or job["status"] in TERMINAL:
            return
        time.sleep(0.1)
    raise SystemExit(f"job {job_id} did not reach {stage} in {timeout_s:.0f} s")
