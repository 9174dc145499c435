"""`JobStore` in memory: the twin that unit tests run on, held to the SQL store's behaviour by the
shared contract suite. Thread-safe; `tx` is ignored (the listener is given None)."""

from __future__ import annotations

import itertools
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from knowledgeops.jobs import states
from knowledgeops.jobs.events import age, counted, failure_event, outcome_event, stage_event
from knowledgeops.jobs.model import Failure, Job, JobMetrics, Lease, NewJob, OutboxItem
from knowledgeops.jobs.parts import PART_KIND, PartState, part_budget, summed
from knowledgeops.jobs.states import OPEN, Event, JobStatus, Stage
from knowledgeops.jobs.store import (
    Guard,
    JobNotFound,
    LeaseLost,
    PartsWork,
    TransitionListener,
    Tx,
    Work,
)
from knowledgeops.jobs.values import cancel_values, completed_values, failure_values


@dataclass
class _OutboxRow:
    id: int
    job_id: str
    created_at: datetime
    available_at: datetime
    published_at: datetime | None = None
    publish_attempts: int = 0
    last_error: str | None = None


class MemoryJobStore:
    def __init__(self, listener: TransitionListener | None = None) -> None:
        self.listener = listener
        self.jobs: dict[str, Job] = {}
        self.outbox: list[_OutboxRow] = []
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._publishing = threading.Lock()
        self.events: list[dict[str, Any]] = []
        self._stage_started: dict[str, datetime] = {}

    # --- helpers --------------------------------------------------------------------------------
    def _add_outbox(self, job_id: str, now: datetime, available_at: datetime) -> None:
        self.outbox.append(_OutboxRow(next(self._ids), job_id, now, available_at))

    def _move(self, job: Job, event: Event, now: datetime, **values: Any) -> Job:
        new_status = states.target(job.status, event)
        moved = replace(job, status=new_status, version=job.version + 1, updated_at=now, **values)
        if job.parent_id is not None:
            self.jobs[job.id] = moved
            try:
                self._part_moved(moved, now)
            except BaseException:  # the parent's listener refused: as if nothing happened
                self.jobs[job.id] = job
                raise
            return self.jobs[job.id]
        if self.listener is not None:  # first: it may refuse, and then nothing has changed
            self.listener.on_transition(None, job, new_status)
        self.jobs[job.id] = moved
        if new_status in (JobStatus.FAILED, JobStatus.CANCELLED):
            self._cancel_parts(job.id, now)
        return moved

    def _record(self, job: Job, rows: list[dict[str, Any]]) -> None:
        self.events += counted(job, rows)

    # --- parts (jobs/parts.py) ------------------------------------------------------------------
    def _parts(self, parent_id: str) -> list[Job]:
        return [j for j in self.jobs.values() if j.parent_id == parent_id]

    def _part_moved(self, part: Job, now: datetime) -> None:
        assert part.parent_id is not None
        parent = self.jobs.get(part.parent_id)
        if parent is None or parent.status is not JobStatus.RUNNING:
            return
        if part.status is JobStatus.FAILED:
            failure = Failure(
                part.error or "a part of this job failed",
                part.error_code or "part_failed",
                part.error_category or "permanent",
                part.retryable,
            )
            self._move(parent, Event.FAIL, now, **failure_values(failure, now, None))
            self.events.append(failure_event(parent, failure, now, None))
            return
        if part.status is JobStatus.CANCELLED:
            self._move(parent, Event.CANCEL, now, **cancel_values(now))
            self.events.append(outcome_event(parent, "cancelled", now))
            return
        parts = self._parts(parent.id)
        if all(p.status is JobStatus.COMPLETED for p in parts):
            written = sum(p.processed_chunks for p in parts)
            self._move(
                parent,
                Event.COMPLETE,
                now,
                total_chunks=written,
                processed_chunks=written,
                heartbeat_at=now,
                **completed_values(now),
            )
            self.events.append(outcome_event(parent, "completed", now))
            return
        self._refresh_parent(parent.id, now)

    def _refresh_parent(self, parent_id: str, now: datetime) -> None:
        parent = self.jobs.get(parent_id)
        if parent is None or parent.status is not JobStatus.RUNNING or parent.lease_owner:
            return
        sums = summed(
            PartState(p.status, p.stage, p.total_chunks, p.processed_chunks)
            for p in self._parts(parent_id)
        )
        self.jobs[parent_id] = replace(
            parent,
            stage=sums.stage,
            total_chunks=sums.total_chunks,
            processed_chunks=sums.processed_chunks,
            heartbeat_at=now,
            updated_at=now,
        )

    def _cancel_parts(self, parent_id: str, now: datetime) -> None:
        for part in sorted(self._parts(parent_id), key=lambda p: p.id):
            if part.status in OPEN:
                self._move(part, Event.CANCEL, now, **cancel_values(now))

    def _waiting_on_parts(self, job: Job) -> bool:
        return any(p.status in OPEN for p in self._parts(job.id))

    def _held(self, lease: Lease) -> Job:
        job = self.jobs.get(lease.job_id)
        if (
            job is None
            or job.status is not JobStatus.RUNNING
            or job.lease_owner != lease.owner
            or job.attempt != lease.attempt
        ):
            raise LeaseLost(lease, job.status if job else None)
        return job

    def _existing(self, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise JobNotFound(job_id)
        return job

    # --- creating and reading -------------------------------------------------------------------
    def add(self, new: NewJob, *, now: datetime, tx: Tx = None) -> Job:
        with self._lock:
            if new.id in self.jobs:
                raise ValueError(f"job {new.id} exists")
            if new.idempotency_key and self.find_by_idempotency_key(new.idempotency_key):
                raise ValueError(f"idempotency key {new.idempotency_key} is taken")
            job = Job(
                id=new.id,
                document_id=new.document_id,
                dataset_id=new.dataset_id,
                kind=new.kind,
                generation=new.generation,
                status=JobStatus.PENDING,
                stage=Stage.QUEUED,
                total_chunks=None,
                processed_chunks=0,
                error=None,
                error_code=None,
                error_category=None,
                retryable=False,
                attempt=0,
                max_attempts=new.max_attempts,
                run_after=None,
                lease_owner=None,
                heartbeat_at=None,
                started_at=None,
                finished_at=None,
                version=1,
                idempotency_key=new.idempotency_key,
                created_at=now,
                updated_at=now,
            )
            self.jobs[job.id] = job
            self._add_outbox(job.id, now, now)
            return job

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self.jobs.get(job_id)

    def find_by_idempotency_key(self, key: str) -> Job | None:
        with self._lock:
            return next((j for j in self.jobs.values() if j.idempotency_key == key), None)

    # --- a worker's writes ----------------------------------------------------------------------
    def claim(self, job_id: str, owner: str, *, now: datetime) -> Lease | None:
        with self._lock:
            job = self.jobs.get(job_id)
            if job is None or job.status not in states.sources(Event.CLAIM):
                return None
            if not job.is_due(now):
                return None
            attempt = job.attempt + 1
            self._move(
                job,
                Event.CLAIM,
                now,
                attempt=attempt,
                lease_owner=owner,
                heartbeat_at=now,
                started_at=now,
                finished_at=None,
                stage=Stage.QUEUED,
                total_chunks=None,
                processed_chunks=0,
                run_after=None,
            )
            self._stage_started[job_id] = now
            return Lease(job_id, owner, attempt, job.parent_id)

    def report(
        self,
        lease: Lease,
        *,
        now: datetime,
        stage: Stage | None = None,
        total: int | None = None,
        processed: int | None = None,
        work: Work | None = None,
    ) -> None:
        with self._lock:
            job = self._held(lease)
            if work is not None:
                work(None)
            if stage is not None and stage is not job.stage:
                started = self._stage_started.get(job.id)
                self.events += stage_event(job.id, job.stage.value, started, now)
                self._stage_started[job.id] = now
            self.jobs[job.id] = replace(
                job,
                heartbeat_at=now,
                updated_at=now,
                version=job.version + 1,
                stage=stage if stage is not None else job.stage,
                total_chunks=total if total is not None else job.total_chunks,
                processed_chunks=processed if processed is not None else job.processed_chunks,
            )
            if lease.parent_id is not None:
                self._refresh_parent(lease.parent_id, now)

    def heartbeat(self, leases: Sequence[Lease], *, now: datetime) -> list[Lease]:
        lost = []
        with self._lock:
            for lease in leases:
                try:
                    job = self._held(lease)
                except LeaseLost:
                    lost.append(lease)
                    continue
                self.jobs[job.id] = replace(job, heartbeat_at=now)
        return lost

    def complete(self, lease: Lease, *, now: datetime) -> Job:
        with self._lock:
            job = self._held(lease)
            moved = self._move(job, Event.COMPLETE, now, **completed_values(now))
            self._record(
                job,
                [
                    *stage_event(job.id, job.stage.value, self._stage_started.get(job.id), now),
                    outcome_event(job, "completed", now),
                ],
            )
            return moved

    def fail(
        self, lease: Lease, failure: Failure, *, now: datetime, retry_at: datetime | None
    ) -> Job:
        with self._lock:
            job = self._held(lease)
            return self._fail(job, failure, now, retry_at)

    def _fail(self, job: Job, failure: Failure, now: datetime, retry_at: datetime | None) -> Job:
        event = Event.FAIL if retry_at is None else Event.RETRY_LATER
        moved = self._move(job, event, now, **failure_values(failure, now, retry_at))
        self._record(job, [failure_event(job, failure, now, retry_at)])
        if retry_at is not None:
            self._add_outbox(job.id, now, retry_at)
        return moved

    def release(self, lease: Lease, *, now: datetime) -> Job:
        with self._lock:
            job = self._held(lease)
            moved = self._move(
                job,
                Event.RETRY_LATER,
                now,
                attempt=job.attempt - 1,
                lease_owner=None,
                run_after=now,
                stage=Stage.QUEUED,
            )
            self._add_outbox(job.id, now, now)
            return moved

    def split(self, lease: Lease, parts: int, *, now: datetime, work: PartsWork) -> list[str]:
        if parts < 1:
            raise ValueError("a job splits into one part or more")
        with self._lock:
            job = self._held(lease)
            self.events += stage_event(
                job.id, job.stage.value, self._stage_started.get(job.id), now
            )
            self._stage_started[job.id] = now
            job = replace(
                job,
                lease_owner=None,
                stage=Stage.PARSING,
                total_chunks=None,
                processed_chunks=0,
                heartbeat_at=now,
                updated_at=now,
                version=job.version + 1,
            )
            self.jobs[job.id] = job
            for old in self._parts(job.id):
                del self.jobs[old.id]
            self.outbox = [r for r in self.outbox if r.job_id in self.jobs]
            ids = [str(uuid.uuid4()) for _ in range(parts)]
            budget = part_budget(job.max_attempts, job.attempt)
            for part_id in ids:
                self.jobs[part_id] = replace(
                    job,
                    id=part_id,
                    parent_id=job.id,
                    kind=PART_KIND,
                    status=JobStatus.PENDING,
                    stage=Stage.QUEUED,
                    attempt=0,
                    max_attempts=budget,
                    heartbeat_at=None,
                    started_at=None,
                    finished_at=None,
                    run_after=None,
                    version=1,
                    idempotency_key=None,
                    created_at=now,
                    error=None,
                    error_code=None,
                    error_category=None,
                    retryable=False,
                )
                self._add_outbox(part_id, now, now)
            work(None, ids)
            return ids

    # --- operator actions -----------------------------------------------------------------------
    def cancel(self, job_id: str, *, now: datetime) -> Job:
        with self._lock:
            job = self._existing(job_id)
            moved = self._move(job, Event.CANCEL, now, **cancel_values(now))
            self._record(job, [outcome_event(job, "cancelled", now)])
            return moved

    def requeue(
        self, job_id: str, *, now: datetime, extra_attempts: int, guard: Guard | None = None
    ) -> Job:
        with self._lock:
            job = self._existing(job_id)
            if guard is not None:
                guard(None, job)
            moved = self._move(
                job,
                Event.REQUEUE,
                now,
                max_attempts=job.attempt + extra_attempts,
                stage=Stage.QUEUED,
                finished_at=None,
                run_after=now,
                error=None,
                error_code=None,
                error_category=None,
                retryable=False,
                total_chunks=None,
                processed_chunks=0,
            )
            self._add_outbox(job_id, now, now)
            return moved

    # --- the relay's scans ----------------------------------------------------------------------
    def rescue_stale(
        self,
        *,
        stale_before: datetime,
        now: datetime,
        failure: Failure,
        retry_at: Callable[[Job], datetime | None],
    ) -> list[Job]:
        with self._lock:
            stale = [
                j
                for j in self.jobs.values()
                if j.status is JobStatus.RUNNING
                and (j.heartbeat_at is None or j.heartbeat_at < stale_before)
                and not self._waiting_on_parts(j)
            ]
            rescued = []
            for job in stale:
                current = self.jobs.get(job.id)  # an earlier rescue's part may have ended it
                if current is not None and current.status is JobStatus.RUNNING:
                    rescued.append(self._fail(current, failure, now, retry_at(current)))
            return rescued

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
        self, *, now: datetime, limit: int, publish: Callable[[str], None]
    ) -> tuple[int, str | None]:
        with self._publishing:  # like the rows a SQL relay holds while it publishes
            due = self.due_outbox(now=now, limit=limit)
            published: list[int] = []
            for item in due:
                try:
                    publish(item.job_id)
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
                self._add_outbox(job_id, now, now)
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

    def metrics(self, *, now: datetime) -> JobMetrics:
        with self._lock:
            by_status = Counter(job.status.value for job in self.jobs.values())
            waiting = [
                job.run_after or job.created_at
                for job in self.jobs.values()
                if job.status in (JobStatus.PENDING, JobStatus.RETRYING) and job.is_due(now)
            ]
            beats = [
                job.heartbeat_at
                for job in self.jobs.values()
                if job.status is JobStatus.RUNNING and not self._waiting_on_parts(job)
            ]
            outcomes = Counter(
                (e["kind"], e["category"] or "") for e in self.events if e["kind"] != "stage"
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
