"""The job store: every read and write the jobs core makes, with its rules written once.

`JobStore` holds the rules: which transition is allowed (states.py), compare-and-set retried a few
times from a fresh read, the fences of a worker's lease, the record each change leaves
(records.py) and what a split job's parts do to it (parts.py). Its two subclasses supply only the
narrowest primitives, each one plain read or write of job, outbox and event rows in a
transaction, plus the relay's and /metrics' queries:

    SqlJobStore     SQLAlchemy Core, the same statements on SQLite and PostgreSQL (sql_store.py)
    MemoryJobStore  dictionaries behind a lock, a snapshot per transaction (memory_store.py): the
                    twin the unit tests run on

One contract suite keeps the two honest (tests/contract/test_job_store.py, test_job_parts.py).

`tx` arguments are the caller's open transaction (`db.engine.Tx`; None on the in-memory twin): a
job is added in the same transaction as the business rows that need it (the transactional
outbox), and a worker's writes commit with its progress or not at all.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from typing import Any, Protocol

from knowledgeops.db.engine import Tx
from knowledgeops.errors import InvalidTransition, JobNotFound, JobStateError
from knowledgeops.jobs import states
from knowledgeops.jobs.model import Failure, Job, Lease, NewJob
from knowledgeops.jobs.parts import new_part, part_budget, progress
from knowledgeops.jobs.records import (
    cancel_values,
    change_event,
    completed_values,
    counted,
    failure_event,
    failure_values,
    outcome_event,
    shown,
    stage_event,
)
from knowledgeops.jobs.rows import Fence, JobRows, Values
from knowledgeops.jobs.states import OPEN, TERMINAL, Event, JobStatus, Stage

__all__ = [
    "Guard",
    "JobNotFound",
    "JobStore",
    "LeaseLost",
    "OutcomeListener",
    "PartsWork",
    "TransitionListener",
]

Work = Callable[[Tx], None]
PartsWork = Callable[[Tx, list[str]], None]
Guard = Callable[[Tx, Job], None]
CAS_TRIES = 5


class LeaseLost(JobStateError):
    """The worker no longer holds this attempt of the job: it was cancelled, rescued or deleted.

    The worker must stop and write nothing more for it.
    """

    def __init__(self, lease: Lease, status: str | None) -> None:
        self.lease = lease
        self.status = status
        shown = status or "deleted"
        super().__init__(
            f"job {lease.job_id} attempt {lease.attempt}: lease lost (now {shown})",
            code="lease_lost",
        )


class TransitionListener(Protocol):
    """Called inside the transaction of every status change of a job that is not a part, so
    other rows change with it; it may raise to refuse the change (the transaction is rolled
    back and the caller sees the error)."""

    def on_transition(self, tx: Tx, job: Job, new_status: JobStatus) -> None: ...


class OutcomeListener(Protocol):
    """Told, inside the transaction, of a job (not a part) that has just ended (completed,
    failed or cancelled), as it now stands. It may add jobs of its own in that transaction
    (`store.add(…, tx=tx)`): a webhook delivery is written with the change it reports, or
    neither is."""

    def on_outcome(self, store: JobStore, tx: Tx, job: Job, now: datetime) -> None: ...


class JobStore(JobRows):
    def __init__(
        self,
        listener: TransitionListener | None = None,
        outcomes: Sequence[OutcomeListener] = (),
        silent_kinds: Collection[str] = (),
    ) -> None:
        self.listener = listener
        self.outcomes = list(outcomes)
        # kinds of the system's own work that no user follows as a job (a webhook delivery has
        # its own listing): their changes are not recorded for the event streams, and neither
        # they nor their outcomes count in /metrics' job figures
        self.silent_kinds = frozenset(silent_kinds)

    # --- creating and reading -------------------------------------------------------------------
    def add(self, new: NewJob, *, now: datetime, tx: Tx | None = None) -> Job:
        """Insert a pending job and its outbox row, in `tx` when given."""
        job = new.pending(now)
        with self._joined(tx) as conn:
            self._insert(conn, [job])
            self._add_outbox(conn, job.id, now, now)
            self._record_change(conn, job.id, now)
            return self._reload(conn, job.id)

    def get(self, job_id: str) -> Job | None:
        with self._read() as tx:
            return self._load(tx, job_id)

    def find_by_idempotency_key(self, key: str) -> Job | None:
        with self._read() as tx:
            return self._load_by_key(tx, key)

    # --- a worker's writes (fenced by its lease) ------------------------------------------------
    def claim(self, job_id: str, owner: str, *, now: datetime) -> Lease | None:
        """pending, or retrying and due → running with attempt + 1; None if someone else won."""
        with self._write() as tx:
            job = self._load(tx, job_id)
            if job is None or job.status not in states.sources(Event.CLAIM):
                return None
            if not job.is_due(now):
                return None
            attempt = job.attempt + 1
            values: Values = {
                "attempt": attempt,
                "lease_owner": owner,
                "heartbeat_at": now,
                "started_at": now,
                "finished_at": None,
                "stage": Stage.QUEUED,
                "stage_started_at": now,
                "total_chunks": None,
                "processed_chunks": 0,
                "run_after": None,
            }
            if not self._move(tx, job, Event.CLAIM, now, values):
                return None
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
        """Record progress, and run `work` in the same transaction; LeaseLost if not held."""
        values: Values = {"heartbeat_at": now, "updated_at": now}
        if stage is not None:
            values["stage"] = stage
        if total is not None:
            values["total_chunks"] = total
        if processed is not None:
            values["processed_chunks"] = processed
        with self._write() as tx:
            self._lock_parent(tx, lease.parent_id)
            ended: list[dict[str, Any]] = []  # the stage this report leaves, if it leaves one
            before = self._load(tx, lease.job_id) if stage is not None else None
            if before is not None and before.stage is not stage:
                started = self._stage_started(tx, lease.job_id)
                ended = stage_event(lease.job_id, before.stage.value, started, now)
                values["stage_started_at"] = now
            self._hold(tx, lease, values)
            if work is not None:
                work(tx)
            if lease.parent_id is not None:
                self._refresh_parent(tx, lease.parent_id, now)
            self._add_events(tx, ended)  # event rows last: their ids are taken just before commit
            self._record_change(tx, lease.parent_id or lease.job_id, now)

    def heartbeat(self, leases: Sequence[Lease], *, now: datetime) -> list[Lease]:
        """Refresh heartbeats; returns the leases that are no longer held."""
        with self._write() as tx:
            return [lease for lease in leases if not self._beat(tx, lease, now)]

    def complete(self, lease: Lease, *, now: datetime) -> Job:
        return self._transition(
            lease.job_id,
            Event.COMPLETE,
            now,
            lambda job: completed_values(now),
            lease=lease,
            events=lambda job, started: [
                *stage_event(job.id, job.stage.value, started, now),
                outcome_event(job, "completed", now),
            ],
        )

    def fail(
        self, lease: Lease, failure: Failure, *, now: datetime, retry_at: datetime | None
    ) -> Job:
        """running → retrying (when `retry_at` is given) or failed."""
        return self._transition(
            lease.job_id,
            Event.FAIL if retry_at is None else Event.RETRY_LATER,
            now,
            lambda job: failure_values(failure, now, retry_at),
            lease=lease,
            outbox_at=lambda job: retry_at,
            events=lambda job, _: [failure_event(job, failure, now, retry_at)],
        )

    def release(self, lease: Lease, *, now: datetime) -> Job:
        """Give the job back (worker shutting down): retrying now, this attempt not counted."""
        return self._transition(
            lease.job_id,
            Event.RETRY_LATER,
            now,
            lambda job: {
                "attempt": job.attempt - 1,
                "lease_owner": None,
                "run_after": now,
                "stage": Stage.QUEUED,
            },
            lease=lease,
            outbox_at=lambda job: now,
        )

    def split(self, lease: Lease, parts: int, *, now: datetime, work: PartsWork) -> list[str]:
        """Hand the job's work to `parts` new part jobs (kind "part", pending, each with its
        outbox row), in one transaction fenced by the lease that also runs `work(tx, part_ids)`;
        returns the part ids, in order. The job stays running, held by no worker, and shows its
        parts' summed progress (jobs/parts.py); the last part to complete completes it, a part
        that fails for good fails it and cancels the rest, cancelling it (or a part) cancels
        all. Parts an earlier attempt made are deleted. The listener is not told of parts'
        transitions, only of the job's. LeaseLost if not held."""
        if parts < 1:
            raise ValueError("a job splits into one part or more")
        with self._write() as tx:
            before = self._load(tx, lease.job_id)
            started = self._stage_started(tx, lease.job_id)
            values: Values = {
                "lease_owner": None,
                "stage": Stage.PARSING,
                "stage_started_at": now,
                "total_chunks": None,
                "processed_chunks": 0,
                "heartbeat_at": now,
                "updated_at": now,
            }
            self._hold(tx, lease, values)
            assert before is not None
            job = self._reload(tx, lease.job_id)
            self._add_events(tx, stage_event(job.id, before.stage.value, started, now))
            self._delete_parts(tx, job.id)  # an earlier attempt's
            ids = [str(uuid.uuid4()) for _ in range(parts)]
            budget = part_budget(job.max_attempts, job.attempt)
            self._insert(tx, [new_part(job, part_id, budget, now) for part_id in ids])
            for part_id in ids:
                self._add_outbox(tx, part_id, now, now)
            work(tx, ids)
            self._record_change(tx, job.id, now)
            return ids

    # --- operator actions -----------------------------------------------------------------------
    def cancel(self, job_id: str, *, now: datetime) -> Job:
        return self._transition(
            job_id,
            Event.CANCEL,
            now,
            lambda job: cancel_values(now),
            events=lambda job, _: [outcome_event(job, "cancelled", now)],
        )

    def requeue(
        self, job_id: str, *, now: datetime, extra_attempts: int, guard: Guard | None = None
    ) -> Job:
        """failed | cancelled → pending, with `extra_attempts` more attempts allowed. `guard`
        runs in the same transaction first and may raise to refuse."""
        return self._transition(
            job_id,
            Event.REQUEUE,
            now,
            lambda job: {
                "max_attempts": job.attempt + extra_attempts,
                "stage": Stage.QUEUED,
                "finished_at": None,
                "run_after": now,  # due now; also where its wait for a worker starts
                "error": None,
                "error_code": None,
                "error_category": None,
                "retryable": False,
                "total_chunks": None,
                "processed_chunks": 0,
            },
            outbox_at=lambda job: now,
            guard=guard,
        )

    # --- the relay's scan of lost workers ------------------------------------------------------
    def rescue_stale(
        self,
        *,
        stale_before: datetime,
        now: datetime,
        failure: Failure,
        retry_at: Callable[[Job], datetime | None],
    ) -> list[Job]:
        """Running jobs whose heartbeat is older than `stale_before` → retrying or failed. A job
        waiting on its parts is not lost (no worker holds it), nor is one a frozen worker still
        holds a lock on (PostgreSQL: it is looked at again on the next pass)."""
        with self._read() as tx:
            found = self._silent_running(tx, stale_before)
        rescued = []
        for job_id, parent_id in found:
            with self._write() as tx:
                self._lock_parent(tx, parent_id)
                if not self._lock_for_rescue(tx, job_id):
                    continue
                job = self._load(tx, job_id)
                if job is None or job.status is not JobStatus.RUNNING:
                    continue
                if job.heartbeat_at is not None and job.heartbeat_at >= stale_before:
                    continue
                when = retry_at(job)
                event = Event.FAIL if when is None else Event.RETRY_LATER
                values = failure_values(failure, now, when)
                if self._move(tx, job, event, now, values, silent_before=stale_before):
                    self._add_events(tx, self._kept(job, [failure_event(job, failure, now, when)]))
                    if when is not None:
                        self._add_outbox(tx, job_id, now, when)
                    rescued.append(self._reload(tx, job_id))
        return rescued

    # --- the rules, once ------------------------------------------------------------------------
    def _transition(
        self,
        job_id: str,
        event: Event,
        now: datetime,
        values: Callable[[Job], Values],
        *,
        lease: Lease | None = None,
        outbox_at: Callable[[Job], datetime | None] | None = None,
        guard: Guard | None = None,
        events: Callable[[Job, datetime | None], Sequence[dict[str, Any]]] | None = None,
    ) -> Job:
        """Move the job by `event` from a fresh read, a few times if it changed meanwhile."""
        for _ in range(CAS_TRIES):
            with self._write() as tx:
                job = self._load(tx, job_id)
                if job is None:
                    raise LeaseLost(lease, None) if lease is not None else JobNotFound(job_id)
                if lease is not None and not _holds(job, lease):
                    raise LeaseLost(lease, job.status)
                if guard is not None:
                    guard(tx, job)
                started = self._stage_started(tx, job_id) if events is not None else None
                if self._move(tx, job, event, now, values(job), lease=lease):
                    if events is not None:
                        self._add_events(tx, self._kept(job, events(job, started)))
                    available = outbox_at(job) if outbox_at else None
                    if available is not None:
                        self._add_outbox(tx, job_id, now, available)
                    return self._reload(tx, job_id)
        raise InvalidTransition(f"job {job_id} kept changing; try again")

    def _move(
        self,
        tx: Tx,
        job: Job,
        event: Event,
        now: datetime,
        values: Values,
        *,
        lease: Lease | None = None,
        silent_before: datetime | None = None,
    ) -> bool:
        """Move `job` by `event` if nobody changed it since it was read; tell the listener (or,
        for a part, carry the change to its parent and siblings). False if it changed."""
        new_status = states.target(job.status, event)
        self._lock_parent(tx, job.parent_id)
        changes = {"status": new_status, "updated_at": now, **values}
        if not self._set(tx, job, changes, Fence(lease, silent_before)):
            return False
        if job.parent_id is not None:
            self._part_moved(tx, job, new_status, now)
            self._record_change(tx, job.parent_id, now)  # its progress, if that moved
            return True
        if self.listener is not None:
            self.listener.on_transition(tx, job, new_status)
        if new_status in (JobStatus.FAILED, JobStatus.CANCELLED):
            self._cancel_parts(tx, job.id, now)
        self._record_change(tx, job.id, now)
        if new_status in TERMINAL and self.outcomes:
            ended = self._reload(tx, job.id)
            for outcome in self.outcomes:
                outcome.on_outcome(self, tx, ended, now)
        return True

    def _record_change(self, tx: Tx, job_id: str, now: datetime) -> None:
        """Record the job as it now stands if a user would see a difference since its last
        recorded change (a part's changes show on its parent, not on their own)."""
        job = self._load(tx, job_id)
        if job is None or job.parent_id is not None or job.kind in self.silent_kinds:
            return
        row = change_event(job, now)
        if shown(row) != shown(self._last_change(tx, job_id)):
            self._add_events(tx, [row])

    def _kept(self, job: Job, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The event rows of `job` the record keeps: none for a silent kind (its outcomes are
        not the documents' and stay out of /metrics), a part's without its own outcomes."""
        return [] if job.kind in self.silent_kinds else counted(job, rows)

    def _hold(self, tx: Tx, lease: Lease, values: Values) -> None:
        if not self._update_held(tx, lease, values):
            job = self._load(tx, lease.job_id)
            raise LeaseLost(lease, job.status if job else None)

    def _reload(self, tx: Tx, job_id: str) -> Job:
        job = self._load(tx, job_id)
        assert job is not None, f"job {job_id} vanished inside its own transaction"
        return job

    # --- parts (jobs/parts.py) ------------------------------------------------------------------
    def _part_moved(self, tx: Tx, part: Job, new_status: JobStatus, now: datetime) -> None:
        """What a part's move does to its parent: a part that fails for good fails it, one
        cancelled cancels it, the last to complete completes it; else it shows the progress."""
        assert part.parent_id is not None
        parent = self._load(tx, part.parent_id)
        if parent is None or parent.status is not JobStatus.RUNNING:
            return
        if new_status is JobStatus.FAILED:
            failed = self._reload(tx, part.id)
            failure = Failure(
                failed.error or "a part of this job failed",
                failed.error_code or "part_failed",
                failed.error_category or "permanent",
                failed.retryable,
            )
            if self._move(tx, parent, Event.FAIL, now, failure_values(failure, now, None)):
                self._add_events(tx, [failure_event(parent, failure, now, None)])
            return
        if new_status is JobStatus.CANCELLED:
            if self._move(tx, parent, Event.CANCEL, now, cancel_values(now)):
                self._add_events(tx, [outcome_event(parent, "cancelled", now)])
            return
        parts = self._parts(tx, parent.id)
        if new_status is JobStatus.COMPLETED and all(
            p.status is JobStatus.COMPLETED for p in parts
        ):
            written = sum(p.processed_chunks for p in parts)
            values = {
                **completed_values(now),
                "total_chunks": written,
                "processed_chunks": written,
                "heartbeat_at": now,
            }
            if self._move(tx, parent, Event.COMPLETE, now, values):
                self._add_events(tx, [outcome_event(parent, "completed", now)])
            return
        self._show_progress(tx, parent.id, progress(parts), now)

    def _refresh_parent(self, tx: Tx, parent_id: str, now: datetime) -> None:
        self._show_progress(tx, parent_id, progress(self._parts(tx, parent_id)), now)

    def _cancel_parts(self, tx: Tx, parent_id: str, now: datetime) -> None:
        """End the parts still at work of a job that failed or was cancelled, in id order (as
        heartbeats take them: no lock cycle)."""
        for part in sorted(self._parts(tx, parent_id), key=lambda p: p.id):
            if part.status in OPEN:
                self._move(tx, part, Event.CANCEL, now, cancel_values(now))


def _holds(job: Job, lease: Lease) -> bool:
    return (
        job.status is JobStatus.RUNNING
        and job.lease_owner == lease.owner
        and job.attempt == lease.attempt
    )
