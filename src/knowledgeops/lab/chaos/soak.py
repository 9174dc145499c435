"""`kops chaos --soak N`: N documents of every format through the scale-out topology while faults
strike at random for the whole run, then the chaos suite's audit, plus memory.

One topology on the lab's own services (lab.py): `kops api`, two `kops relay` and three
`kops worker`. An uploader sends the documents at a steady rate (waiting out a 503's Retry-After,
as a client would); a fault thread strikes every few seconds, in a seeded random order that runs
through every kind before repeating: a worker killed (-9) or paused (SIGSTOP past its lease), Redis
stopped, PostgreSQL restarted, the active relay killed, a burst of provider 429s or 500s, every
queued message delivered twice. A killed worker or relay is replaced, as a supervisor would.

Recovery is timed per fault: for a worker, until every job it held has ended or runs elsewhere;
for Redis and PostgreSQL, from the moment they are back until the next job completes; for a
relay, until another is active; for a provider burst, until the burst has been spent and a job
completes; for duplicates, until every job delivered again has ended (and no finished one
ran again).

At the end every accepted job must have ended: completed, or failed with the reason its document
carries (one in a hundred documents is broken on purpose: a truncated PDF, a DOCX that is not a
zip), with no chunk twice and nothing stuck (lab.audit). Every process's RSS (with its children)
is sampled each few seconds; a process that lived the whole run must stay within 10% of its size
at the end of warm-up (the first quarter of the run).
"""

from __future__ import annotations

import html
import random
import signal
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docx
import httpx
from rich.table import Table
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine

from knowledgeops.jobs.celery_dispatch import CeleryDispatcher, make_celery
from knowledgeops.jobs.states import TERMINAL
from knowledgeops.lab.bench.corpus import Block, Chapter, write_pdf
from knowledgeops.lab.bench.memory import children, rss_mb
from knowledgeops.lab.chaos.lab import WORDS, Lab, ScenarioResult, audit, lab_stats
from knowledgeops.lab.topology import Proc, Topology

FORMATS = ("txt", "md", "html", "docx", "pdf")
BROKEN_EVERY = 100  # one document in this many is broken on purpose
LARGE_EVERY = 5  # one in this many is large
BROKEN_CODE = "permanent/corrupt_file"
ENDED = sorted(status.value for status in TERMINAL)  # as the database holds them
WORKERS = 3
RELAYS = 2
WARM_UP_SHARE = 0.25
RSS_TOLERANCE = 0.10
MIN_LIFE_S = 60.0  # a process that lived less is listed, its growth not judged
SAMPLE_S = 3.0
SHORT_UPLOAD_S = 120.0
RECOVERY_TIMEOUT_S = 300.0
BUSY_WAIT_S = 15.0
FAULTS = (
    "worker kill -9",
    "worker SIGSTOP",
    "Redis stopped",
    "PostgreSQL restarted",
    "relay killed",
    "provider 429 burst",
    "provider 500 burst",
    "duplicate deliveries",
)


@dataclass(frozen=True)
class Plan:
    """How long and how hard: the full soak and the short form CI runs."""

    rate: float  # uploads per second
    gap_s: tuple[float, float]  # between faults
    outage_s: float  # Redis and PostgreSQL down this long
    burst: int  # provider refusals per burst
    drain_s: float  # the most the end may take once uploads are done

    every_kind: bool  # strike each kind once at least, even after the last upload
    held_back: int = 0  # the last documents, uploaded once every kind has been struck: the
    # last fault then has work to recover with (a provider burst needs calls to refuse)

    @staticmethod
    def for_run(short: bool, count: int) -> Plan:
        if short:  # every kind once, over about two minutes of uploads
            rate = max(0.5, count / SHORT_UPLOAD_S)
            return Plan(
                rate,
                (3.0, 5.0),
                outage_s=3.0,
                burst=6,
                drain_s=300.0,
                every_kind=True,
                held_back=max(1, count // 20),
            )
        return Plan(8.0, (12.0, 30.0), outage_s=12.0, burst=30, drain_s=1800.0, every_kind=False)


@dataclass
class Document:
    path: Path
    broken: bool


@dataclass
class Fault:
    kind: str
    at_s: float  # since the run began
    down_s: float = 0.0  # how long the fault itself lasted (an outage, a pause)
    recover_s: float | None = None
    note: str = ""


@dataclass
class Memory:
    name: str
    lived_whole_run: bool
    warm_mb: float = 0.0
    end_mb: float = 0.0
    max_mb: float = 0.0

    @property
    def growth(self) -> float:
        return (self.end_mb - self.warm_mb) / self.warm_mb if self.warm_mb else 0.0


@dataclass
class SoakResult:
    documents: int
    audit: ScenarioResult
    refused_at_upload: dict[str, int] = field(default_factory=dict)
    broken_accepted: int = 0
    faults: list[Fault] = field(default_factory=list)
    memory: list[Memory] = field(default_factory=list)
    upload_s: float = 0.0
    total_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.audit.ok


# --- the documents ------------------------------------------------------------------------------
def make_documents(folder: Path, count: int, seed: int = 7) -> list[Document]:
    """`count` distinct documents cycling through the formats, one in LARGE_EVERY large (60
    paragraphs; PDFs of several pages), one in BROKEN_EVERY broken."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    out = []
    for n in range(count):
        kind = FORMATS[n % len(FORMATS)]
        path = folder / f"soak-{n:05d}.{kind}"
        broken = n % BROKEN_EVERY == BROKEN_EVERY - 1
        if broken:
            kind = "pdf" if (n // BROKEN_EVERY) % 2 == 0 else "docx"
            path = path.with_suffix(f".{kind}")
            _write_broken(path, kind, rng)
        else:
            paragraphs = 60 if n % LARGE_EVERY == 0 else 4
            _write(path, kind, _paragraphs(n, paragraphs, rng))
        out.append(Document(path, broken))
    return out


def _paragraphs(n: int, count: int, rng: random.Random) -> list[str]:
    return [
        f"Soak document {n}, part {p}. "
        + " ".join(
            f"The {rng.choice(WORDS)} {rng.choice(WORDS)} number {n * 1000 + p * 40 + k}."
            for k in range(25)
        )
        for p in range(count)
    ]


def _write(path: Path, kind: str, paragraphs: list[str]) -> None:
    title = path.stem
    if kind == "txt":
        path.write_text("\n\n".join(paragraphs) + "\n")
    elif kind == "md":
        path.write_text(f"# {title}\n\n" + "\n\n".join(paragraphs) + "\n")
    elif kind == "html":
        body = "".join(f"<p>{html.escape(p)}</p>\n" for p in paragraphs)
        path.write_text(
            f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title></head>"
            f"<body><h1>{title}</h1>\n{body}</body></html>\n"
        )
    elif kind == "docx":
        document = docx.Document()
        document.add_heading(title, level=1)
        for paragraph in paragraphs:
            document.add_paragraph(paragraph)
        document.save(str(path))
    else:
        blocks = (Block("h1", title), *(Block("p", p) for p in paragraphs))
        write_pdf(path, [Chapter(title, "", blocks)])


def _write_broken(path: Path, kind: str, rng: random.Random) -> None:
    if kind == "pdf":  # a PDF cut off after its header: no cross-reference table, no pages
        # (a comment of its own: identical files would be one upload, answered as a duplicate)
        path.write_bytes(
            b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n%"
            + rng.randbytes(16).hex().encode()
            + b"\n1 0 obj\n<< /Type /Catalog"
        )
    else:  # a DOCX whose zip is cut short
        path.write_bytes(b"PK\x03\x04" + rng.randbytes(2000))


# --- the run ------------------------------------------------------------------------------------
class Soak:
    def __init__(self, lab: Lab, documents: list[Document], plan: Plan, seed: int) -> None:
        self.lab = lab
        self.documents = documents
        self.plan = plan
        self.rng = random.Random(seed)
        self.began = time.monotonic()
        self.accepted: dict[str, Document] = {}
        self.refused: Counter[str] = Counter()
        self.faults: list[Fault] = []
        self.uploads_done = threading.Event()
        self.every_kind_struck = threading.Event()  # (or the striker stopped)
        self.stop = threading.Event()
        self.samples: dict[str, list[tuple[float, float]]] = {}
        self.problems: list[str] = []
        self.engine: Engine | None = None
        self.topology: Topology | None = None

    def now(self) -> float:
        return round(time.monotonic() - self.began, 1)

    # --- database views (the truth) ---------------------------------------------------------
    def _scalar(self, sql: str, **params: Any) -> Any:
        assert self.engine is not None
        with self.engine.connect() as conn:
            return conn.execute(text(sql), params).scalar()

    def completed(self) -> int | None:
        try:
            return int(self._scalar("SELECT count(*) FROM ingest_jobs WHERE status = 'completed'"))
        except Exception:  # PostgreSQL is being restarted
            return None

    def wait_for_completion_after(
        self, since: float, timeout: float = RECOVERY_TIMEOUT_S
    ) -> float | None:
        """Seconds from `since` (monotonic) until a job completes after it."""
        base = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.stop.is_set():
            found = self.completed()
            if found is not None:
                if base is None:
                    base = found
                elif found > base:
                    return round(time.monotonic() - since, 1)
            time.sleep(0.2)
        return None

    # --- the threads ------------------------------------------------------------------------
    def upload_all(self, client: httpx.Client) -> None:
        try:
            for n, document in enumerate(self.documents):
                if n >= len(self.documents) - self.plan.held_back:
                    while not self.every_kind_struck.wait(0.5):
                        if self.stop.is_set():
                            return
                due = self.began + n / self.plan.rate
                time.sleep(max(0.0, due - time.monotonic()))
                self._upload(client, document)
        finally:
            self.uploads_done.set()

    def _upload(self, client: httpx.Client, document: Document) -> None:
        while not self.stop.is_set():
            try:
                with document.path.open("rb") as handle:
                    answer = client.post(
                        "/docs/upload", files={"file": (document.path.name, handle)}
                    )
            except httpx.HTTPError:
                time.sleep(1.0)
                continue
            if answer.status_code in (200, 202):  # 200: a resent upload, its job already made
                self.accepted[answer.json()["jobId"]] = document
                return
            if answer.status_code in (429, 503):
                time.sleep(float(answer.headers.get("retry-after", "1")))
                continue
            reason = f"{answer.status_code} {answer.json().get('error', {}).get('code', '')}"
            self.refused[reason.strip()] += 1
            if not document.broken:
                self.problems.append(f"{document.path.name} refused at upload: {reason}")
            return

    def sample_memory(self, topology: Topology) -> None:
        while not self.stop.is_set():
            for proc in list(topology.procs):
                if proc.alive():
                    tree = [proc.pid, *_descendants(proc.pid)]
                    mb = sum(rss_mb(pid) for pid in tree)
                    self.samples.setdefault(proc.name, []).append((self.now(), mb))
            self.stop.wait(SAMPLE_S)

    def strike(self, topology: Topology) -> None:
        try:
            self._strike(topology)
        finally:
            self.every_kind_struck.set()  # the held-back uploads never wait on a stopped striker

    def _strike(self, topology: Topology) -> None:
        kinds: list[str] = []
        struck: set[str] = set()
        time.sleep(self.rng.uniform(*self.plan.gap_s))
        while not self.stop.is_set():
            if self.uploads_done.is_set() and not (self.plan.every_kind and struck != set(FAULTS)):
                return
            if not kinds:
                kinds = list(FAULTS)
                self.rng.shuffle(kinds)
            kind = kinds.pop()
            struck.add(kind)
            if struck == set(FAULTS):
                self.every_kind_struck.set()  # the last kind: its fault meets the last uploads
            fault = Fault(kind, self.now())
            try:
                FAULT_ACTIONS[kind](self, topology, fault)
            except Exception as exc:  # a fault that could not be made is a finding
                fault.note = f"{type(exc).__name__}: {exc}"
                self.problems.append(f"{kind} at {fault.at_s} s: {fault.note}")
            self.faults.append(fault)
            time.sleep(self.rng.uniform(*self.plan.gap_s))

    # --- faults -----------------------------------------------------------------------------
    def held_jobs(self, pids: set[int]) -> set[str]:
        assert self.engine is not None
        with self.engine.connect() as conn:
            rows = conn.execute(
                text("SELECT id, lease_owner FROM ingest_jobs WHERE status = 'running'")
            ).all()
        held = set()
        for job_id, owner in rows:
            parts = str(owner or "").split("-")
            if len(parts) >= 3 and parts[-2].isdigit() and int(parts[-2]) in pids:
                held.add(str(job_id))
        return held

    def wait_moved_on(self, jobs: set[str], owners: set[int], since: float) -> float | None:
        """Seconds from `since` until each of `jobs` has ended or runs under another owner
        (None if that takes more than RECOVERY_TIMEOUT_S)."""
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while jobs and time.monotonic() < deadline and not self.stop.is_set():
            try:
                still = self.held_jobs(owners) & jobs
                ended = self._ended(jobs)
            except Exception:
                time.sleep(0.5)
                continue
            jobs = still - ended
            if not jobs:
                break
            time.sleep(0.3)
        return round(time.monotonic() - since, 1) if not jobs else None

    def _ended(self, jobs: set[str]) -> set[str]:
        assert self.engine is not None
        with self.engine.connect() as conn:
            rows = conn.execute(
                text("SELECT id FROM ingest_jobs WHERE id = ANY(:ids) AND status = ANY(:t)"),
                {"ids": list(jobs), "t": sorted(TERMINAL)},
            ).all()
        return {str(row[0]) for row in rows}


def _descendants(pid: int) -> list[int]:
    found = []
    for child in children(pid):
        found += [child, *_descendants(child)]
    return found


def _pids(proc: Proc) -> set[int]:
    return {proc.pid, *_descendants(proc.pid)}


def _busy_worker(soak: Soak, topology: Topology) -> tuple[Proc, set[int], set[str]]:
    """A worker holding a job (waiting a little for one), else any: the fault should hit work."""
    deadline = time.monotonic() + BUSY_WAIT_S
    while True:
        workers = topology.by_role("worker")
        soak.rng.shuffle(workers)
        for worker in workers:
            pids = _pids(worker)
            held = soak.held_jobs(pids)
            if held:
                return worker, pids, held
        if time.monotonic() > deadline:
            victim = workers[0]
            return victim, _pids(victim), set()
        time.sleep(0.1)


def _kill_worker(soak: Soak, topology: Topology, fault: Fault) -> None:
    victim, pids, held = _busy_worker(soak, topology)
    began = time.monotonic()
    victim.kill()
    topology.start_worker()  # the supervisor brings one back
    fault.note = f"{victim.name} held {len(held)} job(s)"
    fault.recover_s = soak.wait_moved_on(held, pids, began) if held else 0.0


def _pause_worker(soak: Soak, topology: Topology, fault: Fault) -> None:
    """Frozen past its lease (stale_after_s + 2 s), then woken: its jobs are taken over (or,
    when it froze inside a transaction that holds the job's row, finished by it once awake:
    a worker frozen for good is let go by PostgreSQL's idle_in_transaction_session_timeout)."""
    victim, pids, held = _busy_worker(soak, topology)
    began = time.monotonic()
    stale = float(topology.settings.get("stale_after_s", 6))
    victim.signal(signal.SIGSTOP)
    try:
        time.sleep(stale + 2)
    finally:
        victim.signal(signal.SIGCONT)
    fault.down_s = round(time.monotonic() - began, 1)
    fault.note = f"{victim.name} held {len(held)} job(s)"
    fault.recover_s = soak.wait_moved_on(held, pids, began) if held else 0.0


def _outage(stop: Callable[[], None], start: Callable[[], None]) -> Callable[..., None]:
    """A service down for the plan's outage, then back; recovery: until a job completes."""

    def fault_action(soak: Soak, topology: Topology, fault: Fault) -> None:
        stop()
        began = time.monotonic()
        try:
            time.sleep(soak.plan.outage_s)
        finally:
            start()
        fault.down_s = round(time.monotonic() - began, 1)
        fault.recover_s = soak.wait_for_completion_after(time.monotonic())

    return fault_action


def _redis_stopped(soak: Soak, topology: Topology, fault: Fault) -> None:
    _outage(soak.lab.redis.stop, soak.lab.redis.start)(soak, topology, fault)


def _postgres_restarted(soak: Soak, topology: Topology, fault: Fault) -> None:
    pg = soak.lab.postgres
    _outage(lambda: pg.stop(mode="fast"), pg.start)(soak, topology, fault)


def _relay_killed(soak: Soak, topology: Topology, fault: Fault) -> None:
    relays = topology.by_role("relay")
    active = next((r for r in relays if _is_active(r.log())), None)
    if active is None:  # between leaders (a PostgreSQL restart): any will do
        active = soak.rng.choice(relays)
        fault.note = "no relay was active; "
    others = [r for r in relays if r is not active]
    began = time.monotonic()
    active.kill()
    others.append(topology.start_relay())  # the supervisor brings one back
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while time.monotonic() < deadline:
        if any(_is_active(r.log()) for r in others):
            fault.recover_s = round(time.monotonic() - began, 1)
            break
        time.sleep(0.2)
    fault.note += f"{active.name} was killed"


RELAY_IDLE = ("relay: standing by", "relay: lost the leader", "relay: cannot reach the database")


def _is_active(log: str) -> bool:
    """The relay's last word on its state (roles/relay.py, jobs/leader.py) was "active"."""
    return log.rfind("relay: active") > max(log.rfind(line) for line in RELAY_IDLE)


def _provider_burst(mode: str) -> Callable[[Soak, Topology, Fault], None]:
    status = "429" if mode == "throttle" else "500"

    def burst(soak: Soak, topology: Topology, fault: Fault) -> None:
        before = lab_stats(soak.lab)["refused"].get(status, 0)
        began = time.monotonic()
        soak.lab.control(mode=mode, count=soak.plan.burst, retry_after=0.5)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if lab_stats(soak.lab)["refused"].get(status, 0) - before >= soak.plan.burst:
                break
            time.sleep(0.2)
        fault.down_s = round(time.monotonic() - began, 1)
        fault.note = f"{soak.plan.burst} × {status}"
        fault.recover_s = soak.wait_for_completion_after(time.monotonic())

    return burst


def _duplicates(soak: Soak, topology: Topology, fault: Fault) -> None:
    """Every message of the 20 jobs that finished last and of the 20 oldest still waiting or
    running published again; recovered when each of those jobs has ended (the queue itself
    never drains while uploads outpace the workers), and no finished one may run again."""
    assert soak.engine is not None
    with soak.engine.connect() as conn:
        done = conn.execute(
            text(
                "SELECT id, attempt FROM ingest_jobs WHERE kind = 'ingest' AND status = ANY(:t) "
                "ORDER BY finished_at DESC NULLS LAST LIMIT 20"
            ),
            {"t": ENDED},
        ).all()
        open_ = conn.execute(
            text(
                "SELECT id FROM ingest_jobs WHERE kind = 'ingest' AND NOT status = ANY(:t) "
                "ORDER BY created_at LIMIT 20"
            ),
            {"t": ENDED},
        ).all()
    finished = {str(job_id): attempt for job_id, attempt in done}
    again = [*finished, *(str(row[0]) for row in open_)]
    dispatcher = CeleryDispatcher(
        make_celery(soak.lab.redis.url(0), job_time_limit_s=300, visibility_timeout_s=900)
    )
    began = time.monotonic()
    for job_id in again:
        dispatcher.publish(job_id)
    fault.note = f"{len(again)} messages again, {len(finished)} of finished jobs"
    deadline = began + RECOVERY_TIMEOUT_S
    while time.monotonic() < deadline and not soak.stop.is_set():
        try:
            with soak.engine.connect() as conn:
                ended = conn.execute(
                    text(
                        "SELECT count(*) FROM ingest_jobs WHERE id = ANY(:ids) AND status = ANY(:t)"
                    ),
                    {"ids": again, "t": ENDED},
                ).scalar_one()
        except Exception:  # PostgreSQL is being restarted
            ended = -1
        if ended == len(again):
            fault.recover_s = round(time.monotonic() - began, 1)
            break
        time.sleep(0.5)
    time.sleep(1.0)
    with soak.engine.connect() as conn:
        after: dict[Any, Any] = dict(
            conn.execute(
                text("SELECT id, attempt FROM ingest_jobs WHERE id = ANY(:ids)"),
                {"ids": list(finished)},
            ).all()
        )
    rerun = [job for job, attempt in finished.items() if after.get(job) != attempt]
    if rerun:
        soak.problems.append(f"a duplicate delivery ran {len(rerun)} finished job(s) again")


FAULT_ACTIONS: dict[str, Callable[[Soak, Topology, Fault], None]] = {
    "worker kill -9": _kill_worker,
    "worker SIGSTOP": _pause_worker,
    "Redis stopped": _redis_stopped,
    "PostgreSQL restarted": _postgres_restarted,
    "relay killed": _relay_killed,
    "provider 429 burst": _provider_burst("throttle"),
    "provider 500 burst": _provider_burst("error500"),
    "duplicate deliveries": _duplicates,
}


def run_soak(lab: Lab, count: int, *, short: bool, seed: int = 7) -> SoakResult:
    plan = Plan.for_run(short, count)
    documents = make_documents(lab.root / "soak-corpus", count, seed)
    result = ScenarioResult(f"soak: {count} documents, random faults")
    with lab.topology("soak", workers=WORKERS, relays=RELAYS) as topology:
        soak = Soak(lab, documents, plan, seed)
        soak.topology = topology
        soak.engine = create_engine(topology.database_url, pool_pre_ping=True)
        soak.began = time.monotonic()
        threads = [
            threading.Thread(target=soak.sample_memory, args=(topology,), daemon=True),
            threading.Thread(target=soak.strike, args=(topology,), daemon=True),
        ]
        for thread in threads:
            thread.start()
        try:
            with topology.client(timeout=60) as client:
                soak.upload_all(client)
                upload_s = soak.now()
                threads[1].join()  # the fault in progress finishes
                _wait_ended(soak, plan.drain_s)
                audit(topology, client, list(soak.accepted), result)
        finally:
            soak.stop.set()
            threads[0].join(timeout=10)
            soak.engine.dispose()
        total_s = soak.now()
    result.accepted = len(soak.accepted)
    result.problems += soak.problems
    _check_endings(soak, result)
    memory = _memory(soak, total_s)
    for m in memory:
        if m.lived_whole_run and m.growth > RSS_TOLERANCE:
            result.problems.append(
                f"{m.name} grew {m.growth:.0%} after warm-up ({m.warm_mb:.0f} → {m.end_mb:.0f} MB)"
            )
    return SoakResult(
        documents=count,
        audit=result,
        refused_at_upload=dict(soak.refused),
        broken_accepted=sum(1 for d in soak.accepted.values() if d.broken),
        faults=soak.faults,
        memory=memory,
        upload_s=upload_s,
        total_s=total_s,
    )


def _wait_ended(soak: Soak, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    ids = list(soak.accepted)
    while time.monotonic() < deadline:
        try:
            open_jobs = soak._scalar(
                "SELECT count(*) FROM ingest_jobs WHERE id = ANY(:ids) AND NOT status = ANY(:t)",
                ids=ids,
                t=sorted(TERMINAL),
            )
            if int(open_jobs) == 0:
                return
        except Exception:
            pass
        time.sleep(1.0)


def _check_endings(soak: Soak, result: ScenarioResult) -> None:
    """A job may fail only for the reason its document carries; a broken document must fail."""
    assert soak.engine is not None
    engine = create_engine(soak.engine.url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT id, status, error_category, error_code FROM ingest_jobs "
                    "WHERE id = ANY(:ids)"
                ),
                {"ids": list(soak.accepted)},
            ).all()
    finally:
        engine.dispose()
    wrong: Counter[str] = Counter()
    for job_id, status, category, code in rows:
        broken = soak.accepted[str(job_id)].broken
        reason = f"{category}/{code}"
        if broken and (status != "failed" or reason != BROKEN_CODE):
            wrong[f"broken document ended {status} {reason}"] += 1
        if not broken and status != "completed" and status in TERMINAL:
            wrong[f"sound document ended {status} {reason}"] += 1
    result.problems += [f"{what} ×{n}" for what, n in sorted(wrong.items())]
    expected = sum(1 for d in soak.accepted.values() if not d.broken)
    if result.completed != expected:
        result.problems.append(f"{result.completed} completed of {expected} sound documents")


def _memory(soak: Soak, total_s: float) -> list[Memory]:
    """Per process: its RSS at the end of its warm-up (the first quarter of the run, or of its
    own life if it started later) and at its end (the median of its last tenth)."""
    out = []
    for name, samples in sorted(soak.samples.items()):
        first, last = samples[0][0], samples[-1][0]
        lived = first <= SAMPLE_S * 2 and last >= total_s - SAMPLE_S * 3
        memory = Memory(name, lived, max_mb=max(mb for _, mb in samples))
        if last - first >= MIN_LIFE_S:
            warm_at = first + (last - first) * WARM_UP_SHARE
            after = [mb for at, mb in samples if at >= warm_at]
            tail = [mb for at, mb in samples if at >= last - (last - first) * 0.1]
            memory.warm_mb = after[0]
            memory.end_mb = statistics.median(tail)
        out.append(memory)
    return out


# --- the table ----------------------------------------------------------------------------------
def render(result: SoakResult) -> list[Any]:
    a = result.audit
    summary = Table(title=f"kops chaos --soak {result.documents}")
    for column in ("accepted", "completed", "failed (reasons)", "duplicates", "stuck", "verdict"):
        summary.add_column(column)
    failed = ", ".join(f"{k} ×{v}" for k, v in sorted(a.failed.items())) or "0"
    verdict = "ok" if result.ok else "FAIL: " + "; ".join(a.problems or ["duplicates/stuck"])
    summary.add_row(
        str(a.accepted), str(a.completed), failed, str(a.duplicates), str(a.stuck), verdict
    )
    faults = Table(title="faults injected and recovery")
    for column in ("fault", "times", "down s (max)", "recover s p50", "recover s max", "notes"):
        faults.add_column(column)
    by_kind: dict[str, list[Fault]] = {}
    for fault in result.faults:
        by_kind.setdefault(fault.kind, []).append(fault)
    for kind in FAULTS:
        struck = by_kind.get(kind, [])
        recovered = [f.recover_s for f in struck if f.recover_s is not None]
        unrecovered = len(struck) - len(recovered)
        faults.add_row(
            kind,
            str(len(struck)),
            f"{max((f.down_s for f in struck), default=0):g}",
            f"{statistics.median(recovered):g}" if recovered else "",
            f"{max(recovered):g}" if recovered else "",
            f"{unrecovered} not timed" if unrecovered else "",
        )
    memory = Table(title="RSS per process (with its children), MB")
    for column in ("process", "whole run", "end of warm-up", "end", "max", "growth"):
        memory.add_column(column)
    for m in result.memory:
        judged = m.warm_mb > 0
        memory.add_row(
            m.name,
            "yes" if m.lived_whole_run else "no",
            f"{m.warm_mb:.0f}" if judged else "",
            f"{m.end_mb:.0f}" if judged else "",
            f"{m.max_mb:.0f}",
            f"{m.growth:+.1%}" if judged else "(short-lived)",
        )
    return [summary, faults, memory]
