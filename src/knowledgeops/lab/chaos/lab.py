"""The chaos suite's laboratory: the throwaway services every scenario runs on (PostgreSQL with
pgvector, Redis and the fake embeddings provider), the documents it uploads, and the audit of the
database that says whether anything was lost, doubled or left stuck (see lab/chaos/__init__.py).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import redis
from sqlalchemy import create_engine, text

from knowledgeops.errors import LabError
from knowledgeops.jobs.states import TERMINAL
from knowledgeops.lab.devpg import LocalPostgres, free_port
from knowledgeops.lab.topology import KOPS, LocalRedis, Proc, Topology, spawn

KEY = "chaos-provider-key"
WORDS = [
    "harbour",
    "lantern",
    "copper",
    "meadow",
    "orbit",
    "violin",
    "granite",
    "saddle",
    "compass",
    "glacier",
    "ledger",
    "mirror",
    "pepper",
    "quarry",
    "rudder",
    "summit",
    "timber",
    "velvet",
    "walnut",
    "anchor",
    "beacon",
    "canvas",
    "dynamo",
    "ember",
    "falcon",
]


@dataclass
class ScenarioResult:
    scenario: str
    accepted: int = 0
    completed: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    setbacks: dict[str, int] = field(default_factory=dict)  # retries and failures on the way
    duplicates: int = 0
    stuck: int = 0
    recover_s: float | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and self.duplicates == 0 and self.stuck == 0


@dataclass
class Lab:
    """The throwaway services every scenario runs on."""

    root: Path
    short: bool
    postgres: LocalPostgres = field(init=False)
    redis: LocalRedis = field(init=False)
    provider: Proc | None = None
    provider_port: int = field(default_factory=free_port)
    key_file: Path = field(init=False)

    def __post_init__(self) -> None:
        self.postgres = LocalPostgres(self.root / "pg", free_port())
        (self.root / "redis").mkdir(parents=True, exist_ok=True)
        self.redis = LocalRedis(self.root / "redis")
        self.key_file = self.root / "provider.key"

    @property
    def provider_url(self) -> str:
        return f"http://127.0.0.1:{self.provider_port}"

    def start(self) -> None:
        self.postgres.start()
        self.redis.start()
        self.key_file.write_text(KEY + "\n")
        args = [*KOPS[:-1], "knowledgeops.lab.fakeprovider", "--port", str(self.provider_port)]
        args += ["--key", KEY, "--hashing"]
        self.provider = spawn("provider", args, dict(os.environ), self.root / "provider.log")
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{self.provider_url}/_stats", timeout=1)
                return
            except httpx.HTTPError:
                if time.monotonic() > deadline or not self.provider.alive():
                    log = self.provider.log()
                    raise RuntimeError(f"the fake provider did not start:\n{log}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        """Each step on its own: one that fails must not leave the others running."""
        steps: list[Callable[[], None]] = [self.redis.stop, self.postgres.destroy]
        if self.provider is not None:
            steps.insert(0, lambda: self.provider.stop(timeout=10) if self.provider else None)
        for step in steps:
            try:
                step()
            except Exception as exc:
                print(f"chaos: clean-up step failed: {exc}")

    def control(self, **body: Any) -> None:
        httpx.post(f"{self.provider_url}/_control", json=body, timeout=5).raise_for_status()

    def fresh_database(self, name: str) -> str:

        with psycopg.connect(
            host=self.postgres.host, port=self.postgres.port, user="postgres", autocommit=True
        ) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.postgres.url(name)

    def flush_redis(self) -> None:

        for db in (0, 1):
            client = redis.Redis.from_url(self.redis.url(db))
            client.flushdb()
            client.close()

    @contextmanager
    def topology(
        self,
        name: str,
        *,
        workers: int = 2,
        relays: int = 1,
        worker_env: dict[str, str] | None = None,
    ) -> Iterator[Topology]:
        self.control(mode="ok", delay=0.0, keys=[KEY])
        self.flush_redis()
        topology = Topology(
            self.root / name,
            database_url=self.fresh_database(f"chaos_{name}"),
            broker_url=self.redis.url(0),
            cache_url=self.redis.url(1),
            settings={
                "embedder": "openai",
                "openai_base_url": f"{self.provider_url}/v1",
                "openai_model": "fake-minilm",
                "openai_dimensions": 384,
                "openai_api_key_file": self.key_file,
                "openai_timeout_s": 10,
                "embed_cache": False,  # every chunk goes to the provider: faults reach the work
                "embed_batch_size": 4,
                "heartbeat_interval_s": 1,
                "stale_after_s": 6,
                "relay_interval_s": 0.3,
                "republish_after_s": 10,
                "backoff_base_s": 0.5,
                "backoff_max_s": 3,
                "max_attempts": 8,
                "job_time_limit_s": 300,
                "log_level": "INFO",
                # the audit reads every job through the API: 10,000 of them at the default
                # 1,200 a minute spent 8 minutes waiting out 429s
                "rate_limit": "60000/minute",
            },
        )
        try:
            topology.migrate()
            topology.start(workers=workers, relays=relays, local_model=False, worker_env=worker_env)
            yield topology
        finally:
            topology.stop()

    def corpus(self, name: str, count: int, paragraphs: int = 5) -> list[Path]:
        folder = self.root / name / "corpus"
        folder.mkdir(parents=True, exist_ok=True)
        files = []
        for n in range(count):
            body = "\n\n".join(
                f"Part {p} of {name} document {n}. "
                + " ".join(
                    f"The {WORDS[(n + p + k) % len(WORDS)]} number {n * 1000 + p * 10 + k}."
                    for k in range(40)
                )
                for p in range(paragraphs)
            )
            path = folder / f"{name}-{n:03d}.txt"
            path.write_text(body + "\n")
            files.append(path)
        return files


# --- talking to the topology ------------------------------------------------------------------
def upload(client: httpx.Client, path: Path) -> httpx.Response:
    with path.open("rb") as handle:
        return client.post("/docs/upload", files={"file": (path.name, handle)})


def upload_all(client: httpx.Client, files: list[Path], result: ScenarioResult) -> list[str]:
    job_ids = []
    for path in files:
        response = upload(client, path)
        if response.status_code != 202:
            result.problems.append(f"{path.name}: upload answered {response.status_code}")
            continue
        job_ids.append(response.json()["jobId"])
    result.accepted += len(job_ids)
    return job_ids


def jobs(client: httpx.Client, job_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Each job as the API shows it. A 429 (the key's rate limit: an audit of thousands of jobs
    reaches it) or a 503 is waited out for its Retry-After, as a client would."""
    return {job_id: job(client, job_id) for job_id in job_ids}


def job(client: httpx.Client, job_id: str, patience_s: float = 300.0) -> dict[str, Any]:
    deadline = time.monotonic() + patience_s
    while True:
        answer = client.get(f"/docs/jobs/{job_id}")
        if answer.status_code == 200:
            return dict(answer.json())
        if answer.status_code not in (429, 503) or time.monotonic() > deadline:
            raise LabError(f"GET /docs/jobs/{job_id} answered {answer.status_code}: {answer.text}")
        time.sleep(min(30.0, float(answer.headers.get("retry-after", "1"))))


def wait_all(client: httpx.Client, job_ids: list[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if all(j.get("status") in TERMINAL for j in jobs(client, job_ids).values()):
                return True
        except (httpx.HTTPError, LabError):  # the API is restarting, or its database
            pass
        time.sleep(0.5)
    return False


def wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return False


def audit(
    topology: Topology, client: httpx.Client, job_ids: list[str], result: ScenarioResult
) -> None:
    """Count the endings, duplicates and stuck jobs in the database (the truth)."""

    found = jobs(client, job_ids)
    ends = Counter(job["status"] for job in found.values())
    result.completed = ends["completed"]
    result.stuck = sum(1 for job in found.values() if job["status"] not in TERMINAL)
    result.failed = dict(
        Counter(
            f"{job['errorCategory']}/{job['errorCode']}"
            for job in found.values()
            if job["status"] in ("failed", "cancelled")
        )
    )
    engine = create_engine(topology.database_url)
    try:
        with engine.connect() as conn:
            doubled = conn.execute(
                text(
                    "SELECT count(*) FROM (SELECT 1 FROM chunks GROUP BY document_id, "
                    "generation, ordinal HAVING count(*) > 1) d"
                )
            ).scalar_one()
            wrong_counts = conn.execute(
                text(
                    "SELECT count(*) FROM documents d WHERE d.active_generation IS NOT NULL AND "
                    "d.chunk_count <> (SELECT count(*) FROM chunks c WHERE c.document_id = d.id "
                    "AND c.generation = d.active_generation)"
                )
            ).scalar_one()
            orphans = conn.execute(
                text(
                    "SELECT (SELECT count(*) FROM chunks) - (SELECT count(*) FROM "
                    "chunk_vectors_384)"
                )
            ).scalar_one()
            setbacks = conn.execute(
                text(
                    "SELECT code, count(*) FROM job_events WHERE kind IN ('retry', 'failed') "
                    "GROUP BY code"
                )
            ).all()
            twice = conn.execute(
                text(
                    "SELECT count(*) FROM (SELECT job_id FROM job_events WHERE kind = "
                    "'completed' GROUP BY job_id HAVING count(*) > 1) t"
                )
            ).scalar_one()
    finally:
        engine.dispose()
    result.setbacks = {str(code): int(count) for code, count in setbacks}
    for job in found.values():
        if job["status"] == "completed" and job["processedChunks"] != job["totalChunks"]:
            result.problems.append(
                f"job {job['id']}: {job['processedChunks']} of {job['totalChunks']} chunks"
            )
    result.duplicates = int(doubled) + int(wrong_counts) + abs(int(orphans)) + int(twice)


# --- what every scenario shares ------------------------------------------------------------
def finish(
    lab: Lab,
    topology: Topology,
    client: httpx.Client,
    job_ids: list[str],
    result: ScenarioResult,
    fault_at: float,
) -> ScenarioResult:
    if not wait_all(client, job_ids, timeout=240 if lab.short else 600):
        result.problems.append("not every job finished in time")
    result.recover_s = round(time.monotonic() - fault_at, 1)
    audit(topology, client, job_ids, result)
    if result.completed != result.accepted:
        result.problems.append(
            f"{result.accepted - result.completed} accepted uploads did not complete"
        )
    return result


def job_mid_embedding(
    topology: Topology, client: httpx.Client, job_ids: list[str], result: ScenarioResult
) -> tuple[str, int] | None:
    """Wait for a job in the middle of embedding; its id and the worker process running it
    (None, with the reason in `result`, when that does not happen)."""
    target: dict[str, Any] = {}

    def embedding() -> bool:
        found = running_owner(client, job_ids)
        if found is not None:
            target.update(found)
        return found is not None

    if not wait_until(embedding, timeout=60):
        result.problems.append("no job reached the middle of embedding")
        return None
    pid = _worker_pid(topology, target["id"])
    if pid is None:
        result.problems.append("could not tell which worker process runs the job")
        return None
    return target["id"], pid


def running_owner(client: httpx.Client, job_ids: list[str]) -> dict[str, Any] | None:
    for job in jobs(client, job_ids).values():
        if job["status"] == "running" and job["stage"] == "embedding" and job["processedChunks"]:
            return job
    return None


def lab_stats(lab: Lab) -> dict[str, Any]:
    return dict(httpx.get(f"{lab.provider_url}/_stats", timeout=5).json())


def _worker_pid(topology: Topology, job_id: str) -> int | None:

    engine = create_engine(topology.database_url)
    try:
        with engine.connect() as conn:
            owner = conn.execute(
                text("SELECT lease_owner FROM ingest_jobs WHERE id = :j"), {"j": job_id}
            ).scalar()
    finally:
        engine.dispose()
    # worker-<host>-<pid>-<random>
    parts = str(owner or "").split("-")
    return int(parts[-2]) if len(parts) >= 3 and parts[-2].isdigit() else None
