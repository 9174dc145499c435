"""The job store protocol: every read and write the jobs core makes, on any database.

Two implementations keep each other honest through one contract test suite
(tests/contract/test_job_store.py): `SqlJobStore` (SQLite, PostgreSQL) and `MemoryJobStore`.

`tx` arguments are the caller's open transaction (a SQLAlchemy `Connection` for the SQL store,
ignored by the in-memory one): a job is added in the same transaction as the business rows that
need it (the transactional outbox), and a worker's writes commit with its progress or not at all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol

from knowledgeops.jobs.model import Failure, Job, JobMetrics, Lease, NewJob, OutboxItem
from knowledgeops.jobs.states import JobStatus, Stage

Tx = Any  # the store's transaction handle; opaque to the jobs core
Work = Callable[[Tx], None]
PartsWork = Callable[[Tx, list[str]], None]
Guard = Callable[[Tx, Job], None]


class LeaseLost(Exception):
    """The worker no longer holds this attempt of the job: it was cancelled, rescued or deleted.

    The worker must stop and write nothing more for it.
    """

    def __init__(self, lease: Lease, status: str | None) -> None:
        self.lease = lease
        self.status = status
        shown = status or "deleted"
        super().__init__(f"job {lease.job_id} attempt {lease.attempt}: lease lost (now {shown})")


class JobNotFound(LookupError):
    """No job has this id."""


class TransitionListener(Protocol):
    """Called inside the transaction of every status change of a job that is not a part, so
    other rows change with it; it may raise to refuse the change (the transaction is rolled
    back and the caller sees the error)."""

    def on_transition(self, tx: Tx, job: Job, new_status: JobStatus) -> None: ...


class JobStore(Protocol):
    # --- creating and reading -------------------------------------------------------------------
    def add(self, new: NewJob, *, now: datetime, tx: Tx = None) -> Job:
        """Insert a pending job and its outbox row, in `tx` when given."""
        ...

    def get(self, job_id: str) -> Job | None: ...

    def find_by_idempotency_key(self, key: str) -> Job | None: ...

    # --- a worker's writes (fenced by its lease) ------------------------------------------------
    def claim(self, job_id: str, owner: str, *, now: datetime) -> Lease | None:
        """pending, or retrying and due → running with attempt + 1; None if someone else won."""
        ...

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
        ...

    def heartbeat(self, leases: Sequence[Lease], *, now: datetime) -> list[Lease]:
        """Refresh heartbeats; returns the leases that are no longer held."""
        ...

    def complete(self, lease: Lease, *, now: datetime) -> Job: ...

    def fail(
        self, lease: Lease, failure: Failure, *, now: datetime, retry_at: datetime | None
    ) -> Job:
        """running → retrying (when `retry_at` is given) or failed."""
        ...

    def release(self, lease: Lease, *, now: datetime) -> Job:
        """Give the job back (worker shutting down): retrying now, this attempt not counted."""
        ...

    def split(self, lease: Lease, parts: int, *, now: datetime, work: PartsWork) -> list[str]:
        """Hand the job's work to `parts` new part jobs (kind "part", pending, each with its
        outbox row), in one transaction fenced by the lease that also runs `work(tx, part_ids)`;
        returns the part ids, in order. The job stays running, held by no worker, and shows its
        parts' summed progress (jobs/parts.py); the last part to complete completes it, a part
        that fails for good fails it and cancels the rest, cancelling it (or a part) cancels
        all. Parts an earlier attempt made are deleted. The listener is not told of parts'
        transitions, only of the job's. LeaseLost if not held."""
        ...

    # --- operator actions -----------------------------------------------------------------------
    def cancel(self, job_id: str, *, now: datetime) -> Job: ...

    def requeue(
        self, job_id: str, *, now: datetime, extra_attempts: int, guard: Guard | None = None
    ) -> Job:
        """failed | cancelled → pending, with `extra_attempts` more attempts allowed. `guard`
        runs in the same transaction first and may raise to refuse."""
        ...

    # --- the relay's scans ----------------------------------------------------------------------
    def rescue_stale(
        self,
        *,
        stale_before: datetime,
        now: datetime,
        failure: Failure,
        retry_at: Callable[[Job], datetime | None],
    ) -> list[Job]:
        """Running jobs whose heartbeat is older than `stale_before` → retrying or failed."""
        ...

    def due_outbox(self, *, now: datetime, limit: int) -> list[OutboxItem]: ...

    def mark_published(self, item_ids: Sequence[int], *, now: datetime) -> None: ...

    def mark_publish_failed(self, item_id: int, error: str) -> None: ...

    def publish_outbox(
        self, *, now: datetime, limit: int, publish: Callable[[str], None]
    ) -> tuple[int, str | None]:
        """Hand due outbox rows to `publish` in id order and mark them published, all in one
        transaction that holds the rows (FOR UPDATE SKIP LOCKED on PostgreSQL), so that two
        relays never publish the same row. Stops at the first failure, which is recorded on its
        row; returns (rows published, the failure's message or None)."""
        ...

    def requeue_unclaimed(self, *, published_before: datetime, now: datetime) -> int:
        """A new outbox row for each runnable job whose last publish is older than the cutoff."""
        ...

    def prune_outbox(self, *, published_before: datetime) -> int: ...

    def outbox_backlog(self, *, now: datetime) -> tuple[int, float]:
        """(unpublished rows that are due, age in seconds of the oldest of them)."""
        ...

    # --- metrics --------------------------------------------------------------------------------
    def metrics(self, *, now: datetime) -> JobMetrics:
        """Jobs by status, outbox backlog, waiting and heartbeat ages, outcome and stage
        counters (every stage change, retry, failure, cancel and completion is recorded in the
        transaction that makes it)."""
        ...
