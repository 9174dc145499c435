from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import pytest

from knowledgeops.errors import PermanentError, TransientError, UserActionRequired
from knowledgeops.jobs.memory_store import MemoryJobStore
from knowledgeops.jobs.model import Failure
from knowledgeops.jobs.runner import JobContext, Outcome
from knowledgeops.jobs.states import JobStatus, Stage

from .helpers import Clock, add_job, counting_handler, failing_handler, make_runner


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store() -> MemoryJobStore:
    return MemoryJobStore()


def test_a_job_runs_to_completion_with_honest_counts(store: MemoryJobStore, clock: Clock) -> None:
    job = add_job(store, clock)
    seen: list[tuple[Stage, int | None, int]] = []

    def handle(ctx: JobContext) -> None:
        counting_handler(total=10, step=5)(ctx)
        current = store.get(ctx.job.id)
        assert current is not None
        seen.append((current.stage, current.total_chunks, current.processed_chunks))

    assert make_runner(store, handle, clock).run_job(job.id) is Outcome.COMPLETED
    done = store.get(job.id)
    assert done is not None
    assert (done.status, done.stage, done.total_chunks, done.processed_chunks) == (
        JobStatus.COMPLETED,
        Stage.DONE,
        10,
        10,
    )
    assert seen == [(Stage.EMBEDDING, 10, 10)]


def test_transient_errors_are_retried_after_backoff(store: MemoryJobStore, clock: Clock) -> None:
    job = add_job(store, clock)
    runner = make_runner(store, failing_handler([TransientError("timeout", code="timeout")]), clock)
    assert runner.run_job(job.id) is Outcome.RETRYING
    waiting = store.get(job.id)
    assert waiting is not None
    assert waiting.status is JobStatus.RETRYING
    assert (waiting.error_code, waiting.error_category, waiting.retryable) == (
        "timeout",
        "transient",
        True,
    )
    assert waiting.run_after is not None
    assert clock() <= waiting.run_after <= clock() + timedelta(seconds=1)  # attempt 1: base 1 s
    if waiting.run_after > clock():
        assert runner.run_job(job.id) is Outcome.SKIPPED  # not due yet
    clock.advance(11)
    assert runner.run_job(job.id) is Outcome.COMPLETED
    done = store.get(job.id)
    assert done is not None
    assert (done.status, done.attempt, done.error) == (JobStatus.COMPLETED, 2, None)


def test_attempts_are_bounded(store: MemoryJobStore, clock: Clock) -> None:
    job = add_job(store, clock, max_attempts=2)
    errors: list[Exception] = [TransientError("down"), TransientError("still down")]
    runner = make_runner(store, failing_handler(errors), clock)
    assert runner.run_job(job.id) is Outcome.RETRYING
    clock.advance(11)
    assert runner.run_job(job.id) is Outcome.FAILED
    failed = store.get(job.id)
    assert failed is not None
    assert (failed.status, failed.attempt, failed.error) == (JobStatus.FAILED, 2, "still down")
    assert failed.retryable is True


@pytest.mark.parametrize(
    ("error", "category", "retryable"),
    [
        (PermanentError("the file is corrupt", code="corrupt_file"), "permanent", False),
        (
            UserActionRequired("remove the password", code="pdf_encrypted"),
            "user_action_required",
            True,
        ),
    ],
)
def test_permanent_and_user_action_errors_fail_at_once(
    store: MemoryJobStore, clock: Clock, error: Exception, category: str, retryable: bool
) -> None:
    job = add_job(store, clock)
    assert make_runner(store, failing_handler([error]), clock).run_job(job.id) is Outcome.FAILED
    failed = store.get(job.id)
    assert failed is not None
    assert (failed.attempt, failed.error_category, failed.retryable) == (1, category, retryable)
    assert failed.error == str(error)


def test_an_unclassified_exception_is_a_permanent_failure_with_a_reference(
    store: MemoryJobStore, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    job = add_job(store, clock)
    with caplog.at_level(logging.ERROR):
        outcome = make_runner(store, failing_handler([KeyError("oops")]), clock).run_job(job.id)
    assert outcome is Outcome.FAILED
    failed = store.get(job.id)
    assert failed is not None
    assert failed.error_code == "internal_error"
    assert failed.error is not None
    reference = failed.error.split("reference ")[1].split(")")[0]
    assert reference in caplog.text
    assert "KeyError" in caplog.text


def test_a_redelivery_is_skipped(store: MemoryJobStore, clock: Clock) -> None:
    job = add_job(store, clock)
    started, release = threading.Event(), threading.Event()

    def slow(ctx: JobContext) -> None:
        started.set()
        release.wait(5)
        counting_handler()(ctx)

    first = make_runner(store, slow, clock, "first")
    second = make_runner(store, counting_handler(), clock, "second")
    outcomes: list[Outcome] = []
    thread = threading.Thread(target=lambda: outcomes.append(first.run_job(job.id)))
    thread.start()
    assert started.wait(5)
    assert second.run_job(job.id) is Outcome.SKIPPED  # running elsewhere
    release.set()
    thread.join()
    assert outcomes == [Outcome.COMPLETED]
    assert second.run_job(job.id) is Outcome.SKIPPED  # already completed
    assert second.run_job("no-such-job") is Outcome.SKIPPED
    done = store.get(job.id)
    assert done is not None
    assert done.attempt == 1


def test_cancel_stops_the_job_at_its_next_write(store: MemoryJobStore, clock: Clock) -> None:
    job = add_job(store, clock)
    writes: list[int] = []

    def handle(ctx: JobContext) -> None:
        ctx.report(stage=Stage.EMBEDDING, total=4, processed=0)
        for n in range(1, 5):
            if n == 2:
                store.cancel(ctx.job.id, now=clock())
            ctx.report(processed=n, work=lambda tx, n=n: writes.append(n))

    assert make_runner(store, handle, clock).run_job(job.id) is Outcome.LOST
    cancelled = store.get(job.id)
    assert cancelled is not None
    assert cancelled.status is JobStatus.CANCELLED
    assert cancelled.processed_chunks == 1
    assert writes == [1]


def test_a_stopping_worker_gives_the_job_back_without_spending_an_attempt(
    store: MemoryJobStore, clock: Clock
) -> None:
    job = add_job(store, clock)
    runner = make_runner(store, counting_handler(), clock)

    def handle(ctx: JobContext) -> None:
        ctx.report(stage=Stage.PARSING)
        runner.stopping.set()
        ctx.report(stage=Stage.CHUNKING)

    runner.handler = handle
    assert runner.run_job(job.id) is Outcome.RELEASED
    released = store.get(job.id)
    assert released is not None
    assert (released.status, released.attempt) == (JobStatus.RETRYING, 0)
    again = make_runner(store, counting_handler(), clock, "next")
    assert again.run_job(job.id) is Outcome.COMPLETED
    done = store.get(job.id)
    assert done is not None
    assert done.attempt == 1


def test_a_report_past_the_jobs_deadline_raises_what_the_worker_set(
    store: MemoryJobStore, clock: Clock
) -> None:
    """The scale-out worker's time limit, checked at each report as well as by Celery's signal
    (which a weakref's callback can swallow): the job fails with the worker's error."""
    job = add_job(store, clock)
    reports: list[int] = []

    def handle(ctx: JobContext) -> None:
        ctx.deadline = time.monotonic() + 0.2
        ctx.past_deadline = lambda: PermanentError("over its time", code="time_limit")
        for n in range(1, 1000):
            ctx.report(stage=Stage.EMBEDDING, total=1000, processed=n)
            reports.append(n)
            time.sleep(0.01)

    assert make_runner(store, handle, clock).run_job(job.id) is Outcome.FAILED
    failed = store.get(job.id)
    assert failed is not None
    assert (failed.status, failed.error_code, failed.error_category) == (
        JobStatus.FAILED,
        "time_limit",
        "permanent",
    )
    assert 0 < len(reports) < 100  # stopped at the first report past 0.2 s
    assert failed.processed_chunks == len(reports)


def test_a_worker_that_lost_its_lease_cannot_complete(store: MemoryJobStore, clock: Clock) -> None:
    job = add_job(store, clock)
    second = make_runner(store, counting_handler(), clock, "second")
    outcome_of_second: list[Outcome] = []

    def paused_then_resumes(ctx: JobContext) -> None:
        ctx.report(stage=Stage.EMBEDDING, total=2, processed=1)
        # while this worker is "paused", its job is rescued and run by another worker
        clock.advance(120)
        store.rescue_stale(
            stale_before=clock(),
            now=clock(),
            failure=Failure("worker lost", "worker_lost", "transient", True),
            retry_at=lambda job: clock(),
        )
        outcome_of_second.append(second.run_job(ctx.job.id))
        ctx.report(processed=2)  # the late write

    first = make_runner(store, paused_then_resumes, clock, "first")
    assert first.run_job(job.id) is Outcome.LOST
    assert outcome_of_second == [Outcome.COMPLETED]
    done = store.get(job.id)
    assert done is not None
    assert (done.status, done.attempt) == (JobStatus.COMPLETED, 2)
