"""`JobStore` in memory: the twin that unit tests run on, held to the SQL store's behaviour by the
shared contract suite. The rules are `JobStore`'s (store.py); this supplies its primitives over
dictionaries behind one lock, and a transaction is a snapshot that an exception puts back, so a
refused change leaves nothing behind, as a rollback does. Thread-safe; there is no database, so
`tx` is None wherever one is handed on (a listener, a handler's work).
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, cast

from knowledgeops.db.engine import Tx
from knowledgeops.jobs.model import Change, Job, JobMetrics, Lease, OutboxItem
from knowledgeops.jobs.parts import Summed
from knowledgeops.jobs.records import CHANGE, OUTCOMES, age, change_of
from knowledgeops.jobs.rows import Fence, Values
from knowledgeops.jobs.states import OPEN, JobStatus
from knowledgeops.jobs.store import JobStore, OutcomeListener, TransitionListener

NO_TX = cast(Tx, None)  # what the twin hands where a database transaction would go


@dataclass
class _OutboxRow:
    id: int
    job_id: str
    created_at: datetime
    available_at: datetime
    published_at: datetime | None = None
    publish_attempts: int = 0
    last_error: str | None = None


class MemoryJobStore(JobStore):
    def __init__(
        self,
        listener: TransitionListener | None = None,
        outcomes: Sequence[OutcomeListener] = (),
        silent_kinds: Collection[str] = (),
    ) -> None:
        super().__init__(listener, outcomes, silent_kinds)
        self.jobs: dict[str, Job] = {}
        self.outbox: list[_OutboxRow] = []
        self.events: list[dict[str, Any]] = []
        self._stage_started_at: dict[str, datetime] = {}
        self._ids = itertools.count(1)
        self._event_ids = itertools.count(1)
        self._lock = threading.RLock()
        self._publishing = threading.Lock()

    # --- transactions ---------------------------------------------------------------------------
    @contextmanager
    def _write(self) -> Iterator[Tx]:
        with self._lock:
            saved = (
                dict(self.jobs),
                [replace(row) for row in self.outbox],
                list(self.events),
                dict(self._stage_started_at),
            )
            try:
                yield NO_TX
            except BaseException:
                self.jobs, self.outbox, self.events, self._stage_started_at = saved
                raise

    @contextmanager
    def _read(self) -> Iterator[Tx]:
        with self._lock:
            yield NO_TX

    @contextmanager
    def _joined(self, tx: Tx | None) -> Iterator[Tx]:
        with self._write() as conn:  # a caller's `tx` means nothing here
            yield conn

    # --- primitives -----------------------------------------------------------------------------
    def _load(self, tx: Tx, job_id: str) -> Job | None:
        return self.jobs.get(job_id)

    def _load_by_key(self, tx: Tx, key: str) -> Job | None:
        return next((j for j in self.jobs.values() if j.idempotency_key == key), None)

    def _stage_started(self, tx: Tx, job_id: str) -> datetime | None:
        return self._stage_started_at.get(job_id)

    def _insert(self, tx: Tx, jobs: Sequence[Job]) -> None:
        for job in jobs:
            if job.id in self.jobs:
                raise ValueError(f"job {job.id} exists")
            if job.idempotency_key and self._load_by_key(tx, job.idempotency_key):
                raise ValueError(f"idempotency key {job.idempotency_key} is taken")
            self.jobs[job.id] = job

    def _apply(self, job: Job, values: Values) -> None:
        changes = dict(values)
        started = changes.pop("stage_started_at", None)
        if started is not None:
            self._stage_started_at[job.id] = started
        self.jobs[job.id] = replace(job, version=job.version + 1, **changes)

    def _set(self, tx: Tx, job: Job, values: Values, fence: Fence) -> bool:
        current = self.jobs.get(job.id)
        if current is None or (current.status, current.version) != (job.status, job.version):
            return False
        lease, silent_before = fence.lease, fence.silent_before
        if lease is not None and (current.lease_owner, current.attempt) != (
            lease.owner,
            lease.attempt,
        ):
            return False
        if silent_before is not None and not self._silent(current, silent_before):
            return False
        self._apply(current, values)
        return True

    def _held(self, lease: Lease) -> Job | None:
        job = self.jobs.get(lease.job_id)
        if (
            job is None
            or job.status is not JobStatus.RUNNING
            or job.lease_owner != lease.owner
            or job.attempt != lease.attempt
        ):
            return None
        return job

    def _update_held(self, tx: Tx, lease: Lease, values: Values) -> bool:
        job = self._held(lease)
        if job is not None:
            self._apply(job, values)
        return job is not None

    def _beat(self, tx: Tx, lease: Lease, now: datetime) -> bool:
        job = self._held(lease)
        if job is not None:
            self.jobs[job.id] = replace(job, heartbeat_at=now)
        return job is not None

    def _lock_parent(self, tx: Tx, parent_id: str | None) -> None:
        """Nothing to lock: one lock guards every row."""

    def _lock_for_rescue(self, tx: Tx, job_id: str) -> bool:
        return True

    def _parts(self, tx: Tx, parent_id: str) -> list[Job]:
        return sorted((j for j in self.jobs.values() if j.parent_id == parent_id), key=_id)

    def _waiting_on_parts(self, job: Job) -> bool:
        return any(p.status in OPEN for p in self._parts(NO_TX, job.id))

    def _silent(self, job: Job, stale_before: datetime) -> bool:
        stale = job.heartbeat_at is None or job.heartbeat_at < stale_before
        return stale and not self._waiting_on_parts(job)

    def _show_progress(self, tx: Tx, parent_id: str, sums: Summed, now: datetime) -> None:
        parent = self.jobs.get(parent_id)
        if parent is None or parent.status is not JobStatus.RUNNING or parent.lease_owner:
            return
        self.jobs[parent_id] = replace(
            parent,
            stage=sums.stage,
            total_chunks=sums.total_chunks,
            processed_chunks=sums.processed_chunks,
            heartbeat_at=now,
            updated_at=now,
        )

    def _delete_parts(self, tx: Tx, parent_id: str) -> None:
        for part in self._parts(tx, parent_id):
            del self.jobs[part.id]
        self.outbox = [row for row in self.outbox if row.job_id in self.jobs]

    def _add_outbox(self, tx: Tx, job_id: str, now: datetime, available_at: datetime) -> None:
        self.outbox.append(_OutboxRow(next(self._ids), job_id, now, available_at))

    def _add_events(self, tx: Tx, rows: Sequence[dict[str, Any]]) -> None:
        self.events += [{**row, "id": next(self._event_ids)} for row in rows]

    def _last_change(self, tx: Tx, job_id: str) -> dict[str, Any] | None:
        for row in reversed(self.events):
            if row["kind"] == CHANGE and row["job_id"] == job_id:
                return cast(dict[str, Any], row)
        return None

    def _silent_running(self, tx: Tx, stale_before: datetime) -> list[tuple[str, str | None]]:
        return [
            (job.id, job.parent_id)
            for job in self.jobs.values()
            if job.status is JobStatus.RUNNING and self._silent(job, stale_before)
        ]

    # --- the outbox and the figures -------------------------------------------------------------
    def due_outbox(self, *, now: datetime, limit: int) -> list[OutboxItem]:
        with self._lock:
            due = [r for r in self.outbox if r.published_at is None and r.available_at <= now]
            return [OutboxItem(r.id, r.job_id, r.publish_attempts) for r in due[:limit]]

    def mark_published(self, item_ids: Sequence[int], *, now: datetime) -> None:
        with self._lock:
            wanted = set(item_ids)
            for row in self.outbox:
                if row.id in wanted:
                    row.published_at = now
                    row.publish_attempts += 1

    def mark_publish_failed(self, item_id: int, error: str) -> None:
        with self._lock:
            for row in self.outbox:
                if row.id == item_id:
                    row.publish_attempts += 1
                    row.last_error = error[:2000]

    def publish_outbox(
        self, *, now: datetime, limit: int, publish: Callable[[str, str], None]
    ) -> tuple[int, str | None]:
        with self._publishing:  # like the rows a SQL relay holds while it publishes
            due = self.due_outbox(now=now, limit=limit)
            published: list[int] = []
            for item in due:
                try:
                    job = self.jobs.get(item.job_id)
                    publish(item.job_id, job.kind if job is not None else "ingest")
                except Exception as exc:
                    error = f"{type(exc).__name__}: {exc}"
                    self.mark_publish_failed(item.id, error)
                    self.mark_published(published, now=now)
                    return len(published), error
                published.append(item.id)
            self.mark_published(published, now=now)
            return len(published), None

    def requeue_unclaimed(self, *, published_before: datetime, now: datetime) -> int:
        with self._lock:
            recent = {
                r.job_id
                for r in self.outbox
                if r.published_at is None or r.published_at >= published_before
            }
            runnable = [
                j.id
                for j in self.jobs.values()
                if j.status in (JobStatus.PENDING, JobStatus.RETRYING)
                and j.is_due(now)
                and j.id not in recent
            ]
            for job_id in runnable:
                self._add_outbox(NO_TX, job_id, now, now)
            return len(runnable)

    def prune_outbox(self, *, published_before: datetime) -> int:
        with self._lock:
            keep = [
                r
                for r in self.outbox
                if r.published_at is None or r.published_at >= published_before
            ]
            pruned = len(self.outbox) - len(keep)
            self.outbox = keep
            return pruned

    # --- the record of changes ------------------------------------------------------------------
    def record_after(self, *, after: int, limit: int) -> list[tuple[int, Change | None]]:
        with self._lock:
            rows = [row for row in self.events if row["id"] > after][:limit]
            return [(row["id"], change_of(row) if row["kind"] == CHANGE else None) for row in rows]

    def changes(
        self,
        *,
        after: int,
        through: int,
        limit: int,
        job_id: str | None = None,
        dataset_id: str | None = None,
    ) -> list[Change]:
        with self._lock:
            found = [
                change_of(row)
                for row in self.events
                if row["kind"] == CHANGE
                and after < row["id"] <= through
                and (job_id is None or row["job_id"] == job_id)
                and (dataset_id is None or row["dataset_id"] == dataset_id)
            ]
            return found[:limit]

    def last_event_id(self) -> int:
        with self._lock:
            return self.events[-1]["id"] if self.events else 0

    def prune_changes(self, *, before: datetime) -> int:
        with self._lock:
            newest = self.last_event_id()
            keep = [
                row
                for row in self.events
                if not (row["kind"] == CHANGE and row["at"] < before and row["id"] < newest)
            ]
            pruned = len(self.events) - len(keep)
            self.events = keep
            return pruned

    def metrics(self, *, now: datetime) -> JobMetrics:
        with self._lock:
            jobs = [job for job in self.jobs.values() if job.kind not in self.silent_kinds]
            by_status = Counter(job.status.value for job in jobs)
            waiting = [
                job.run_after or job.created_at
                for job in jobs
                if job.status in (JobStatus.PENDING, JobStatus.RETRYING) and job.is_due(now)
            ]
            beats = [
                job.heartbeat_at
                for job in jobs
                if job.status is JobStatus.RUNNING and not self._waiting_on_parts(job)
            ]
            outcomes = Counter(
                (e["kind"], e["category"] or "") for e in self.events if e["kind"] in OUTCOMES
            )
            stages: dict[str, tuple[int, float]] = {}
            for e in self.events:
                if e["kind"] == "stage":
                    count, total = stages.get(e["stage"], (0, 0.0))
                    stages[e["stage"]] = (count + 1, total + (e["seconds"] or 0.0))
        backlog, oldest = self.outbox_backlog(now=now)
        return JobMetrics(
            jobs_by_status=dict(by_status),
            outbox_backlog=backlog,
            outbox_oldest_age_s=oldest,
            oldest_waiting_age_s=max((age(t, now) for t in waiting), default=0.0),
            running_heartbeat_ages_s=[age(t, now) for t in beats],
            outcomes=dict(outcomes),
            stage_seconds=stages,
        )

    def outbox_backlog(self, *, now: datetime) -> tuple[int, float]:
        with self._lock:
            due = [r for r in self.outbox if r.published_at is None and r.available_at <= now]
            if not due:
                return 0, 0.0
            oldest = min(r.available_at for r in due)
            return len(due), max(0.0, (now - oldest).total_seconds())


def _id(job: Job) -> str:
    return job.id
