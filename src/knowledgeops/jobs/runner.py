"""`run_job(job_id)`: the one code path every worker runs, in every topology (docs/architecture.md:
Data flow).

The message is never trusted: the job is reloaded, claimed by compare-and-set, handed to the
registered handler with a `JobContext`, and finished with a write fenced by the worker's lease.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import KW_ONLY, InitVar, dataclass, field
from enum import StrEnum
from typing import Protocol

from knowledgeops.clock import Clock
from knowledgeops.errors import WorkerStopping
from knowledgeops.jobs import faults
from knowledgeops.jobs.classify import classify
from knowledgeops.jobs.heartbeat import Heartbeat
from knowledgeops.jobs.model import Failure, Job, Lease
from knowledgeops.jobs.retry import RetryPolicy
from knowledgeops.jobs.states import JobStatus, Stage
from knowledgeops.jobs.store import JobStore, LeaseLost, PartsWork, Work

log = logging.getLogger(__name__)


class Outcome(StrEnum):
    COMPLETED = "completed"
    RETRYING = "retrying"
    FAILED = "failed"
    SKIPPED = "skipped"  # not runnable now (done, running elsewhere, not due, unknown)
    LOST = "lost"  # the lease was lost mid-way (cancelled, rescued, deleted)
    RELEASED = "released"  # given back because the worker is stopping
    SPLIT = "split"  # handed to part jobs, which complete it (JobStore.split)


@dataclass(eq=False)
class JobContext:
    """What a handler sees: the job, and fenced writes of progress (plus its own rows)."""

    store: JobStore
    lease: Lease
    job: Job
    clock: Clock
    stopping: threading.Event  # set when this worker shuts down
    heartbeat: Heartbeat | None = None
    parts: list[str] | None = field(default=None, init=False)  # set once the job has split
    # a time limit checked at every report (a monotonic deadline, and what to raise past it):
    # the scale-out worker sets it beside Celery's soft limit, whose signal can land where
    # Python ignores exceptions (a weakref's callback) and be lost
    deadline: float | None = field(default=None, init=False)
    past_deadline: Callable[[], BaseException] | None = field(default=None, init=False)

    def report(
        self,
        *,
        stage: Stage | None = None,
        total: int | None = None,
        processed: int | None = None,
        work: Work | None = None,
    ) -> None:
        """Record progress (and run `work` in the same transaction). Raises LeaseLost when the
        job was cancelled or taken away, WorkerStopping when this worker is shutting down."""
        if self.stopping.is_set():
            raise WorkerStopping
        if (
            self.deadline is not None
            and self.past_deadline is not None
            and time.monotonic() >= self.deadline
        ):
            raise self.past_deadline()
        self.store.report(
            self.lease, now=self.clock(), stage=stage, total=total, processed=processed, work=work
        )

    def split(self, parts: int, work: PartsWork) -> list[str]:
        """Hand this job's work to `parts` part jobs (JobStore.split), with `work(tx, ids)`
        writing what each part is to do in the same transaction. The handler must return right
        after: the job is no longer this worker's, and its last part completes it."""
        if self.stopping.is_set():
            raise WorkerStopping
        if self.heartbeat is not None:  # the job will be no worker's to beat for
            self.heartbeat.drop(self.lease)
        try:
            self.parts = self.store.split(self.lease, parts, now=self.clock(), work=work)
        except BaseException:
            if self.heartbeat is not None:
                self.heartbeat.hold(self.lease)
            raise
        return self.parts


class Handler(Protocol):
    def __call__(self, ctx: JobContext) -> None: ...


@dataclass(eq=False)
class Runner:
    store: JobStore
    handler: Handler
    _: KW_ONLY
    policy: RetryPolicy
    heartbeat: Heartbeat
    clock: Clock
    owner_prefix: InitVar[str] = "worker"  # the lease owner: this, then a random suffix
    on_split: Callable[[], None] | None = None  # e.g. wake the relay: the parts' rows are due
    owner: str = field(init=False)
    stopping: threading.Event = field(init=False, default_factory=threading.Event)

    def __post_init__(self, owner_prefix: str) -> None:
        self.owner = f"{owner_prefix}-{uuid.uuid4().hex[:12]}"

    def run_job(self, job_id: str) -> Outcome:
        job = self.store.get(job_id)
        if job is None or not self._runnable(job):
            log.debug("job %s: skipped (%s)", job_id, job.status if job else "unknown")
            return Outcome.SKIPPED
        lease = self.store.claim(job_id, self.owner, now=self.clock())
        if lease is None:
            return Outcome.SKIPPED
        claimed = self.store.get(job_id)
        assert claimed is not None
        log.info("job %s: attempt %d started by %s", job_id, lease.attempt, self.owner)
        self.heartbeat.hold(lease)
        try:
            return self._run_claimed(claimed, lease)
        finally:
            self.heartbeat.drop(lease)

    def _runnable(self, job: Job) -> bool:
        if job.status is JobStatus.PENDING:
            return True
        return job.status is JobStatus.RETRYING and job.is_due(self.clock())

    def _run_claimed(self, job: Job, lease: Lease) -> Outcome:
        ctx = JobContext(self.store, lease, job, self.clock, self.stopping, self.heartbeat)
        try:
            self.handler(ctx)
            if ctx.parts is not None:
                log.info("job %s: split into %d parts", job.id, len(ctx.parts))
                if self.on_split is not None:
                    self.on_split()
                return Outcome.SPLIT
            faults.hit("before_complete")  # the chaos suite's crash point; off by default
            self.store.complete(lease, now=self.clock())
        except LeaseLost as lost:
            log.warning("%s; this attempt's late writes were rejected", lost)
            return Outcome.LOST
        except WorkerStopping:
            return self._release(lease)
        except Exception as exc:
            return self._fail(job, lease, exc)
        log.info("job %s: completed", job.id)
        return Outcome.COMPLETED

    def _release(self, lease: Lease) -> Outcome:
        try:
            self.store.release(lease, now=self.clock())
        except LeaseLost as lost:
            log.warning("%s while releasing", lost)
            return Outcome.LOST
        log.info("job %s: released for another worker (shutting down)", lease.job_id)
        return Outcome.RELEASED

    def _fail(self, job: Job, lease: Lease, exc: Exception) -> Outcome:
        error = classify(exc, job_id=job.id)
        now = self.clock()
        retry_at = self.policy.next_run_after(
            error, attempt=lease.attempt, max_attempts=job.max_attempts, now=now
        )
        failure = Failure(error.message, error.code, error.category.value, error.retryable)
        try:
            self.store.fail(lease, failure, now=now, retry_at=retry_at)
        except LeaseLost as lost:
            log.warning("%s; its failure (%s) was not recorded", lost, error.code)
            return Outcome.LOST
        if retry_at is not None:
            log.info("job %s: %s (%s); retry at %s", job.id, error.code, error.message, retry_at)
            return Outcome.RETRYING
        log.info("job %s: failed: %s (%s)", job.id, error.code, error.message)
        return Outcome.FAILED
