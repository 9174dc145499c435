"""The scale-out worker's time limit against the real signal: billiard's soft-limit handler
installed as a prefork child has it, and `SIGUSR1` sent to this process as the pool sends it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from datetime import datetime

import pytest
from billiard.pool import soft_timeout_sighandler

from knowledgeops.jobs.memory_store import MemoryJobStore
from knowledgeops.jobs.model import Job, Lease
from knowledgeops.jobs.runner import JobContext, Outcome
from knowledgeops.jobs.states import JobStatus, Stage
from knowledgeops.roles.time_limit import TimeLimit

from .jobs.helpers import Clock, add_job, make_runner


def soft_limit() -> None:
    """What billiard's pool does at a task's soft limit: SIGUSR1 to the child running it."""
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(0.05)  # the handler runs on this thread at the next bytecode; this is a margin


class SignalledWhileCompleting(MemoryJobStore):
    """The soft limit strikes while the job's completion is being recorded."""

    def complete(self, lease: Lease, *, now: datetime) -> Job:
        soft_limit()
        return super().complete(lease, now=now)


@pytest.fixture
def as_a_prefork_child() -> Iterator[None]:
    previous = signal.signal(signal.SIGUSR1, soft_timeout_sighandler)
    yield
    signal.signal(signal.SIGUSR1, previous)


def working_until_the_limit(ctx: JobContext) -> None:
    ctx.report(stage=Stage.EMBEDDING, total=4, processed=1)
    soft_limit()
    ctx.report(processed=2)


def finishing(ctx: JobContext) -> None:
    ctx.report(stage=Stage.EMBEDDING, total=4, processed=4)


@pytest.mark.usefixtures("as_a_prefork_child")
def test_the_soft_limit_during_the_work_fails_the_job_with_the_reason() -> None:
    store, clock = MemoryJobStore(), Clock()
    job = add_job(store, clock)
    limit = TimeLimit(3)
    limit.started()
    assert signal.getsignal(signal.SIGUSR1) is not soft_timeout_sighandler  # taken over
    assert make_runner(store, limit.wrap(working_until_the_limit), clock).run_job(job.id) is (
        Outcome.FAILED
    )
    failed = store.get(job.id)
    assert failed is not None
    assert (failed.status, failed.error_code, failed.error_category, failed.processed_chunks) == (
        JobStatus.FAILED,
        "time_limit",
        "permanent",
        1,
    )
    assert failed.error is not None
    assert "KOPS_JOB_TIME_LIMIT_S" in failed.error
    assert limit.ignored == 0


@pytest.mark.usefixtures("as_a_prefork_child")
def test_the_soft_limit_after_the_work_is_done_lets_the_job_complete() -> None:
    """Billiard's handler alone raises inside the completing write, and the attempt was retried
    for a reason that was not the real one; the next task's limit strikes again."""
    store, clock = SignalledWhileCompleting(), Clock()
    job = add_job(store, clock)
    limit = TimeLimit(3)
    limit.started()
    runner = make_runner(store, limit.wrap(finishing), clock)
    assert runner.run_job(job.id) is Outcome.COMPLETED
    done = store.get(job.id)
    assert done is not None
    assert (done.status, done.attempt, done.error_code) == (JobStatus.COMPLETED, 1, None)
    assert limit.ignored == 1

    following = add_job(store, clock)
    limit.started()
    assert make_runner(store, limit.wrap(working_until_the_limit), clock).run_job(following.id) is (
        Outcome.FAILED
    )
    stopped = store.get(following.id)
    assert stopped is not None
    assert (stopped.status, stopped.error_code) == (JobStatus.FAILED, "time_limit")
    assert limit.ignored == 1


@pytest.mark.usefixtures("as_a_prefork_child")
def test_billiards_handler_alone_fails_the_finished_job_for_another_reason() -> None:
    """Why the handler is taken over: without it the same signal breaks the finished job's
    completion, and the attempt is recorded as failed for a reason that is not the real one
    (here an internal error; on PostgreSQL the broken connection's `database_unavailable`)."""
    store, clock = SignalledWhileCompleting(), Clock()
    job = add_job(store, clock)
    limit = TimeLimit(3)  # started() is not called: billiard's handler stays
    outcome = make_runner(store, limit.wrap(finishing), clock).run_job(job.id)
    assert outcome in (Outcome.FAILED, Outcome.RETRYING)
    broken = store.get(job.id)
    assert broken is not None
    assert broken.status is not JobStatus.COMPLETED
    assert broken.error_code not in (None, "time_limit")


def test_a_process_without_billiards_handler_is_left_alone() -> None:
    previous = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        TimeLimit(3).started()
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGUSR1, previous)
