"""`kops chaos`: break the scale-out topology on purpose and prove nothing is lost or doubled.

Everything runs on services of its own: a throwaway PostgreSQL with pgvector (initdb + pg_ctl in a
temporary folder), a `redis-server` on a free port and the fake embeddings provider (real
vectors; faults on command), so it may stop and start them freely. Each scenario gets a fresh
database and a fresh topology (`kops api`, `kops relay`, two `kops worker`), uploads documents over
HTTP, injects its fault while work is in flight, waits for the system to recover and audits the
database:

- every accepted upload's job ended completed (or failed only where the scenario expects it);
- no chunk twice (document, generation, ordinal), chunk rows = `totalChunks`, one vector row per
  chunk, and no job completed twice (the `job_events` record);
- nothing stuck (a job not finished when the wait ran out).

The table it prints has one row per scenario; the command exits 1 on any loss, duplicate or
stuck job. `--short` is the form CI runs (fewer documents, shorter outages). Every process and
folder it started is removed at the end, also when it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from knowledgeops.devpg import LocalPostgres, free_port
from knowledgeops.topology import KOPS, LocalRedis, Proc, Topology, spawn

KEY = "chaos-provider-key"
TERMINAL = {"completed", "failed", "cancelled"}
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
class Outcome:
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
        args = [*KOPS[:-1], "knowledgeops.fakeprovider", "--port", str(self.provider_port)]
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
        import psycopg

        with psycopg.connect(
            host=self.postgres.host, port=self.postgres.port, user="postgres", autocommit=True
        ) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.postgres.url(name)

    def flush_redis(self) -> None:
        import redis

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


def upload_all(client: httpx.Client, files: list[Path], outcome: Outcome) -> list[str]:
    job_ids = []
    for path in files:
        response = upload(client, path)
        if response.status_code != 202:
            outcome.problems.append(f"{path.name}: upload answered {response.status_code}")
            continue
        job_ids.append(response.json()["jobId"])
    outcome.accepted += len(job_ids)
    return job_ids


def jobs(client: httpx.Client, job_ids: list[str]) -> dict[str, dict[str, Any]]:
    return {job_id: client.get(f"/docs/jobs/{job_id}").json() for job_id in job_ids}


def wait_all(client: httpx.Client, job_ids: list[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if all(j.get("status") in TERMINAL for j in jobs(client, job_ids).values()):
                return True
        except httpx.HTTPError:
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


def audit(topology: Topology, client: httpx.Client, job_ids: list[str], outcome: Outcome) -> None:
    """Count the endings, duplicates and stuck jobs in the database (the truth)."""
    from sqlalchemy import create_engine, text

    found = jobs(client, job_ids)
    ends = Counter(job["status"] for job in found.values())
    outcome.completed = ends["completed"]
    outcome.stuck = sum(1 for job in found.values() if job["status"] not in TERMINAL)
    outcome.failed = dict(
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
    outcome.setbacks = {str(code): int(count) for code, count in setbacks}
    for job in found.values():
        if job["status"] == "completed" and job["processedChunks"] != job["totalChunks"]:
            outcome.problems.append(
                f"job {job['id']}: {job['processedChunks']} of {job['totalChunks']} chunks"
            )
    outcome.duplicates = int(doubled) + int(wrong_counts) + abs(int(orphans)) + int(twice)


# --- the scenarios ----------------------------------------------------------------------------
def _finish(
    lab: Lab,
    topology: Topology,
    client: httpx.Client,
    job_ids: list[str],
    outcome: Outcome,
    fault_at: float,
) -> Outcome:
    if not wait_all(client, job_ids, timeout=240 if lab.short else 600):
        outcome.problems.append("not every job finished in time")
    outcome.recover_s = round(time.monotonic() - fault_at, 1)
    audit(topology, client, job_ids, outcome)
    if outcome.completed != outcome.accepted:
        outcome.problems.append(
            f"{outcome.accepted - outcome.completed} accepted uploads did not complete"
        )
    return outcome


def _job_mid_embedding(
    topology: Topology, client: httpx.Client, job_ids: list[str], outcome: Outcome
) -> tuple[str, int] | None:
    """Wait for a job in the middle of embedding; its id and the worker process running it
    (None, with the reason in `outcome`, when that does not happen)."""
    target: dict[str, Any] = {}

    def embedding() -> bool:
        found = _running_owner(client, job_ids)
        if found is not None:
            target.update(found)
        return found is not None

    if not wait_until(embedding, timeout=60):
        outcome.problems.append("no job reached the middle of embedding")
        return None
    pid = _worker_pid(topology, target["id"])
    if pid is None:
        outcome.problems.append("could not tell which worker process runs the job")
        return None
    return target["id"], pid


def _running_owner(client: httpx.Client, job_ids: list[str]) -> dict[str, Any] | None:
    for job in jobs(client, job_ids).values():
        if job["status"] == "running" and job["stage"] == "embedding" and job["processedChunks"]:
            return job
    return None


def worker_killed_mid_embedding(lab: Lab) -> Outcome:
    outcome = Outcome("kill -9 a worker process mid-embedding")
    with lab.topology("kill_mid") as topology, topology.client() as client:
        lab.control(delay=0.5)  # a batch takes a while: there is a middle to kill in
        files = lab.corpus("kill_mid", 4 if lab.short else 12, paragraphs=8)
        job_ids = upload_all(client, files, outcome)
        found = _job_mid_embedding(topology, client, job_ids, outcome)
        if found is None:
            return outcome
        target_id, pid = found
        os.kill(pid, signal.SIGKILL)
        fault_at = time.monotonic()
        lab.control(delay=0.0)
        _finish(lab, topology, client, job_ids, outcome, fault_at)
        if client.get(f"/docs/jobs/{target_id}").json()["attempt"] < 2:
            outcome.problems.append("the killed job was not run again")
        return outcome


def worker_paused_past_its_lease(lab: Lab) -> Outcome:
    outcome = Outcome("worker paused past its lease (SIGSTOP), then resumed")
    with lab.topology("paused") as topology, topology.client() as client:
        lab.control(delay=0.5)
        files = lab.corpus("paused", 3 if lab.short else 8, paragraphs=8)
        job_ids = upload_all(client, files, outcome)
        found = _job_mid_embedding(topology, client, job_ids, outcome)
        if found is None:
            return outcome
        target_id, pid = found
        os.kill(pid, signal.SIGSTOP)
        fault_at = time.monotonic()
        lab.control(delay=0.0)

        def taken_over() -> bool:
            job = client.get(f"/docs/jobs/{target_id}").json()
            return bool(job["status"] == "completed")

        try:
            if not wait_until(taken_over, timeout=180):
                outcome.problems.append("nobody finished the paused worker's job")
        finally:
            os.kill(pid, signal.SIGCONT)  # it wakes up and tries to go on writing
        rejected = wait_until(
            lambda: any("late writes were rejected" in worker.log() for worker in topology.procs),
            timeout=30,
        )
        if not rejected:
            outcome.problems.append("the resumed worker's late writes were not seen rejected")
        return _finish(lab, topology, client, job_ids, outcome, fault_at)


def killed_before_complete(lab: Lab) -> Outcome:
    outcome = Outcome("worker dies after the index write, before completed")
    marker = lab.root / "before_complete.spent"
    env = {"KOPS_FAULT": "before_complete", "KOPS_FAULT_ONCE": str(marker)}
    with (
        lab.topology("before_complete", worker_env=env) as topology,
        topology.client() as client,
    ):
        job_ids = upload_all(client, lab.corpus("before_complete", 3 if lab.short else 8), outcome)
        if not wait_until(marker.exists, timeout=120):
            outcome.problems.append("the fault point was never reached")
            return outcome
        _finish(lab, topology, client, job_ids, outcome, time.monotonic())
        if max(job["attempt"] for job in jobs(client, job_ids).values()) < 2:
            outcome.problems.append("the job whose worker died was not run again")
        return outcome


def broker_down(lab: Lab) -> Outcome:
    outage = 8.0 if lab.short else 60.0
    outcome = Outcome(f"Redis stopped {outage:g} s during uploads")
    with lab.topology("broker_down") as topology, topology.client() as client:
        files = lab.corpus("broker_down", 6 if lab.short else 20)
        half = len(files) // 2
        job_ids = upload_all(client, files[:half], outcome)
        lab.redis.stop()
        fault_at = time.monotonic()
        try:
            job_ids += upload_all(client, files[half:], outcome)  # each must still be 202
            time.sleep(max(0.0, outage - (time.monotonic() - fault_at)))
        finally:
            lab.redis.start()
        return _finish(lab, topology, client, job_ids, outcome, fault_at)


def postgres_restart(lab: Lab) -> Outcome:
    outcome = Outcome("PostgreSQL restarted while workers run")
    with lab.topology("pg_restart") as topology, topology.client() as client:
        lab.control(delay=0.2)
        files = lab.corpus("pg_restart", 5 if lab.short else 12)
        job_ids = upload_all(client, files[:-1], outcome)
        wait_until(lambda: _running_owner(client, job_ids) is not None, timeout=60)
        lab.postgres.stop(mode="fast")
        fault_at = time.monotonic()
        try:
            during = upload(client, files[-1])
            if during.status_code == 202:
                outcome.problems.append("an upload was answered 202 while the database was down")
                outcome.accepted += 1
                job_ids.append(during.json()["jobId"])
            elif during.status_code != 503 or "retry-after" not in during.headers:
                outcome.problems.append(
                    f"an upload during the outage got {during.status_code} without Retry-After"
                )
            time.sleep(3.0 if lab.short else 15.0)
        finally:
            lab.postgres.start()
        lab.control(delay=0.0)
        return _finish(lab, topology, client, job_ids, outcome, fault_at)


def relay_killed(lab: Lab) -> Outcome:
    outcome = Outcome("active relay killed (two relays), then restarted")
    with (
        lab.topology("relay_killed", relays=2) as topology,
        topology.client() as client,
    ):
        files = lab.corpus("relay_killed", 6 if lab.short else 16)
        half = len(files) // 2
        job_ids = upload_all(client, files[:half], outcome)
        relays = topology.by_role("relay")
        active = next((r for r in relays if "relay: active" in r.log()), None)
        if active is None:
            outcome.problems.append("no relay was active")
            return outcome
        (standby,) = [r for r in relays if r is not active]
        active.kill()
        fault_at = time.monotonic()
        job_ids += upload_all(client, files[half:], outcome)
        if not wait_until(lambda: "relay: active" in standby.log(), timeout=30):
            outcome.problems.append("the standby relay did not take over")
        topology.start_relay()  # the killed one comes back, as a standby
        return _finish(lab, topology, client, job_ids, outcome, fault_at)


def provider_errors(lab: Lab) -> Outcome:
    outcome = Outcome("provider 429s and 500s, then 401 until the key is fixed")
    with lab.topology("provider") as topology, topology.client() as client:
        count = 4 if lab.short else 10
        lab.control(mode="throttle", count=count, retry_after=0.5)
        fault_at = time.monotonic()
        job_ids = upload_all(client, lab.corpus("provider", count), outcome)
        wait_until(lambda: lab_stats(lab)["refused"].get("429", 0) >= count, timeout=60)
        lab.control(mode="error500", count=count)
        if not wait_all(client, job_ids, timeout=240):
            outcome.problems.append("jobs did not recover from 429s and 500s")
        refused = lab_stats(lab)["refused"]
        if refused.get("429", 0) < count or refused.get("500", 0) < 1:
            outcome.problems.append(f"the provider's faults did not reach the jobs: {refused}")
        # a wrong key: the jobs fail for the user; once the key is right, retry works
        lab.control(keys=["a-key-nobody-has"])
        locked = upload_all(client, lab.corpus("provider_401", 2), outcome)
        wait_all(client, locked, timeout=120)
        for job in jobs(client, locked).values():
            if (job["status"], job["errorCategory"]) != ("failed", "user_action_required"):
                outcome.problems.append(
                    f"with a refused key a job ended {job['status']}/{job['errorCategory']}"
                )
        lab.control(keys=[KEY])
        for job_id in locked:
            answer = client.post(f"/docs/jobs/{job_id}/retry")
            if answer.status_code != 202:
                outcome.problems.append(f"retry after the key was fixed: {answer.status_code}")
        return _finish(lab, topology, client, job_ids + locked, outcome, fault_at)


def duplicate_delivery(lab: Lab) -> Outcome:
    from knowledgeops.jobs.celery_dispatch import CeleryDispatcher, make_celery

    outcome = Outcome("every message delivered twice, and again after completion")
    with lab.topology("duplicates") as topology, topology.client() as client:
        lab.control(delay=0.05)
        job_ids = upload_all(client, lab.corpus("duplicates", 6 if lab.short else 20), outcome)
        dispatcher = CeleryDispatcher(
            make_celery(lab.redis.url(0), job_time_limit_s=300, visibility_timeout_s=900)
        )
        for job_id in job_ids:
            dispatcher.publish(job_id)
        fault_at = time.monotonic()
        if not wait_all(client, job_ids, timeout=240):
            outcome.problems.append("not every job finished")
        attempts = {job_id: job["attempt"] for job_id, job in jobs(client, job_ids).items()}
        for job_id in job_ids:  # stale redeliveries of finished jobs
            dispatcher.publish(job_id)
        if not wait_until(lambda: dispatcher.backlog() == 0, timeout=60):
            outcome.problems.append("the stale redeliveries were never taken by a worker")
        time.sleep(1)  # the last one taken is being looked at
        after = {job_id: job["attempt"] for job_id, job in jobs(client, job_ids).items()}
        if after != attempts:
            outcome.problems.append("a stale redelivery ran a finished job again")
        return _finish(lab, topology, client, job_ids, outcome, fault_at)


def lab_stats(lab: Lab) -> dict[str, Any]:
    return dict(httpx.get(f"{lab.provider_url}/_stats", timeout=5).json())


def _worker_pid(topology: Topology, job_id: str) -> int | None:
    from sqlalchemy import create_engine, text

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


SCENARIOS: dict[str, Callable[[Lab], Outcome]] = {
    "kill_mid_embedding": worker_killed_mid_embedding,
    "kill_before_complete": killed_before_complete,
    "worker_paused": worker_paused_past_its_lease,
    "broker_down": broker_down,
    "postgres_restart": postgres_restart,
    "relay_killed": relay_killed,
    "provider_errors": provider_errors,
    "duplicate_delivery": duplicate_delivery,
}


def run_chaos(*, short: bool, only: list[str] | None = None) -> list[Outcome]:
    names = only or list(SCENARIOS)
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenarios {unknown}; choose from {sorted(SCENARIOS)}")
    root = Path(tempfile.mkdtemp(prefix="kops-chaos-"))
    root.chmod(0o755)  # PostgreSQL runs as `postgres` when we are root
    lab = Lab(root, short)
    results = []
    try:
        lab.start()
        for name in names:
            try:
                results.append(SCENARIOS[name](lab))
            except Exception as exc:  # a scenario that broke is a failure, not a crash
                results.append(Outcome(name, problems=[f"{type(exc).__name__}: {exc}"]))
    finally:
        lab.stop()
        shutil.rmtree(root, ignore_errors=True)
    return results


def render(results: list[Outcome]) -> Any:
    from rich.table import Table

    table = Table(title="kops chaos")
    for column in (
        "scenario",
        "accepted",
        "completed",
        "failed (reasons)",
        "retries on the way (reasons)",
        "duplicates",
        "stuck",
        "recover s",
        "verdict",
    ):
        table.add_column(column)
    for r in results:
        failed = ", ".join(f"{k} ×{v}" for k, v in sorted(r.failed.items())) or "0"
        setbacks = ", ".join(f"{k} ×{v}" for k, v in sorted(r.setbacks.items())) or "0"
        verdict = "ok" if r.ok else "FAIL: " + "; ".join(r.problems or ["duplicates/stuck"])
        table.add_row(
            r.scenario,
            str(r.accepted),
            str(r.completed),
            failed,
            setbacks,
            str(r.duplicates),
            str(r.stuck),
            "" if r.recover_s is None else f"{r.recover_s:g}",
            verdict,
        )
    return table


def write_json(results: list[Outcome], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([{**asdict(r), "ok": r.ok} for r in results], indent=2))
