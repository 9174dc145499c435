"""One contract for every JobStore: in memory, SQLite and PostgreSQL must behave the same."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from knowledgeops.db.engine import Database
from knowledgeops.db.schema import outbox as outbox_table
from knowledgeops.errors import InvalidTransition, JobNotFound
from knowledgeops.jobs.memory_store import MemoryJobStore
from knowledgeops.jobs.model import Failure, Job, Lease, NewJob
from knowledgeops.jobs.sql_store import SqlJobStore
from knowledgeops.jobs.states import JobStatus, Stage
from knowledgeops.jobs.store import JobStore, LeaseLost
from tests.fixtures.rows import insert_dataset, insert_document

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
BOOM = Failure("the provider timed out", "timeout", "transient", True)


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, JobStatus, JobStatus]] = []

    def on_transition(self, tx: Any, job: Job, new_status: JobStatus) -> None:
        self.seen.append((job.id, job.status, new_status))


class Harness:
    """A store plus a way to make jobs in it (SQL stores need a document row for each job)."""

    def __init__(self, store: JobStore, db: Database | None, recorder: Recorder) -> None:
        self.store = store
        self.db = db
        self.recorder = recorder

    def new_job(
        self,
        *,
        max_attempts: int = 3,
        key: str | None = None,
        at: datetime = T0,
        tx: Any = None,
        dataset_id: str | None = None,
    ) -> Job:
        """A pending job on a new document, in a new dataset or in `dataset_id` (one an
        earlier call made)."""
        job_id, doc_id = str(uuid.uuid4()), str(uuid.uuid4())
        ds_id = dataset_id or str(uuid.uuid4())
        if self.db is None:
            return self.store.add(
                NewJob(job_id, doc_id, ds_id, 1, max_attempts, idempotency_key=key), now=at
            )
        if tx is None:
            with self.db.write() as conn:
                return self.new_job(
                    max_attempts=max_attempts, key=key, at=at, tx=conn, dataset_id=dataset_id
                )
        conn = tx
        if dataset_id is None:
            insert_dataset(conn, ds_id)
        insert_document(conn, ds_id, doc_id)
        return self.store.add(
            NewJob(job_id, doc_id, ds_id, 1, max_attempts, idempotency_key=key),
            now=at,
            tx=conn,
        )

    def running(self, **kw: Any) -> tuple[Job, Lease]:
        job = self.new_job(**kw)
        lease = self.store.claim(job.id, "w1", now=T0)
        assert lease is not None
        return job, lease

    def status(self, job_id: str) -> JobStatus:
        job = self.store.get(job_id)
        assert job is not None
        return job.status


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    recorder = Recorder()
    if request.param == "memory":
        yield Harness(MemoryJobStore(recorder), None, recorder)
        return
    db: Database = request.getfixturevalue(f"{request.param}_db")
    yield Harness(SqlJobStore(db, recorder), db, recorder)


def test_add_makes_a_pending_job_with_a_due_outbox_row(harness: Harness) -> None:
    job = harness.new_job(key="k-1")
    assert job.status is JobStatus.PENDING
    assert job.stage is Stage.QUEUED
    assert (job.attempt, job.max_attempts, job.version) == (0, 3, 1)
    assert harness.store.get(job.id) == job
    assert harness.store.find_by_idempotency_key("k-1") == job
    assert harness.store.find_by_idempotency_key("k-2") is None
    due = harness.store.due_outbox(now=T0, limit=10)
    assert [item.job_id for item in due] == [job.id]
    assert harness.store.due_outbox(now=T0 - timedelta(seconds=1), limit=10) == []


def test_claim_runs_the_job_once(harness: Harness) -> None:
    job = harness.new_job()
    lease = harness.store.claim(job.id, "w1", now=T0)
    assert lease == Lease(job.id, "w1", 1)
    assert harness.store.claim(job.id, "w2", now=T0) is None
    claimed = harness.store.get(job.id)
    assert claimed is not None
    assert claimed.status is JobStatus.RUNNING
    assert (claimed.lease_owner, claimed.attempt, claimed.heartbeat_at) == ("w1", 1, T0)
    assert claimed.started_at == T0
    assert harness.recorder.seen == [(job.id, JobStatus.PENDING, JobStatus.RUNNING)]


def test_two_workers_racing_for_one_job_never_both_win(harness: Harness) -> None:
    jobs = [harness.new_job() for _ in range(5)]
    wins: list[tuple[str, str]] = []
    barrier = threading.Barrier(4)

    def worker(name: str) -> None:
        barrier.wait()
        for job in jobs:
            if harness.store.claim(job.id, name, now=T0) is not None:
                wins.append((job.id, name))

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(job_id for job_id, _ in wins) == sorted(job.id for job in jobs)


def test_report_is_fenced_by_the_lease_and_commits_with_the_work(harness: Harness) -> None:
    job, lease = harness.running()
    ran: list[object] = []
    harness.store.report(
        lease,
        now=T0 + timedelta(seconds=5),
        stage=Stage.EMBEDDING,
        total=10,
        processed=4,
        work=ran.append,
    )
    got = harness.store.get(job.id)
    assert got is not None
    assert (got.stage, got.total_chunks, got.processed_chunks) == (Stage.EMBEDDING, 10, 4)
    assert got.heartbeat_at == T0 + timedelta(seconds=5)
    assert len(ran) == 1

    stranger = Lease(job.id, "w2", lease.attempt)
    with pytest.raises(LeaseLost):
        harness.store.report(stranger, now=T0, processed=9, work=ran.append)
    with pytest.raises(LeaseLost):
        harness.store.report(Lease(job.id, "w1", 2), now=T0, processed=9)
    assert len(ran) == 1
    got = harness.store.get(job.id)
    assert got is not None
    assert got.processed_chunks == 4


def test_work_that_raises_rolls_back_the_progress(harness: Harness) -> None:
    job, lease = harness.running()

    def explode(tx: object) -> None:
        raise RuntimeError("index write failed")

    with pytest.raises(RuntimeError):
        harness.store.report(lease, now=T0, processed=7, work=explode)
    got = harness.store.get(job.id)
    assert got is not None
    assert got.processed_chunks == 0


def test_complete_is_final_and_fenced(harness: Harness) -> None:
    job, lease = harness.running()
    done = harness.store.complete(lease, now=T0 + timedelta(seconds=9))
    assert done.status is JobStatus.COMPLETED
    assert done.stage is Stage.DONE
    assert done.finished_at == T0 + timedelta(seconds=9)
    assert done.lease_owner is None
    with pytest.raises(LeaseLost):
        harness.store.complete(lease, now=T0)
    assert harness.store.claim(job.id, "w2", now=T0) is None


def test_transient_failure_waits_for_run_after(harness: Harness) -> None:
    job, lease = harness.running()
    retry_at = T0 + timedelta(seconds=30)
    harness.store.mark_published([i.id for i in harness.store.due_outbox(now=T0, limit=10)], now=T0)
    failed = harness.store.fail(lease, BOOM, now=T0, retry_at=retry_at)
    assert failed.status is JobStatus.RETRYING
    assert (failed.error, failed.error_code, failed.error_category) == (
        "the provider timed out",
        "timeout",
        "transient",
    )
    assert failed.retryable is True
    assert failed.run_after == retry_at
    assert failed.finished_at is None
    assert harness.store.due_outbox(now=T0 + timedelta(seconds=29), limit=10) == []
    assert [i.job_id for i in harness.store.due_outbox(now=retry_at, limit=10)] == [job.id]
    assert harness.store.claim(job.id, "w2", now=T0 + timedelta(seconds=29)) is None
    second = harness.store.claim(job.id, "w2", now=retry_at)
    assert second == Lease(job.id, "w2", 2)
    with pytest.raises(LeaseLost):  # the first worker's late write is rejected
        harness.store.report(lease, now=retry_at, processed=1)


def test_permanent_failure_is_final(harness: Harness) -> None:
    job, lease = harness.running()
    failure = Failure("the PDF is encrypted", "pdf_encrypted", "user_action_required", True)
    failed = harness.store.fail(lease, failure, now=T0, retry_at=None)
    assert failed.status is JobStatus.FAILED
    assert failed.finished_at == T0
    assert failed.error_code == "pdf_encrypted"
    assert harness.store.claim(job.id, "w2", now=T0 + timedelta(days=1)) is None


def test_cancel_stops_a_running_job_and_fences_its_worker(harness: Harness) -> None:
    job, lease = harness.running()
    cancelled = harness.store.cancel(job.id, now=T0)
    assert cancelled.status is JobStatus.CANCELLED
    with pytest.raises(LeaseLost) as lost:
        harness.store.report(lease, now=T0, processed=3)
    assert lost.value.status == JobStatus.CANCELLED
    with pytest.raises(InvalidTransition):
        harness.store.cancel(job.id, now=T0)
    with pytest.raises(JobNotFound):
        harness.store.cancel(str(uuid.uuid4()), now=T0)


def test_completed_jobs_cannot_be_cancelled_or_requeued(harness: Harness) -> None:
    job, lease = harness.running()
    harness.store.complete(lease, now=T0)
    with pytest.raises(InvalidTransition):
        harness.store.cancel(job.id, now=T0)
    with pytest.raises(InvalidTransition):
        harness.store.requeue(job.id, now=T0, extra_attempts=3)


def test_requeue_gives_a_failed_job_fresh_attempts(harness: Harness) -> None:
    job, lease = harness.running(max_attempts=1)
    harness.store.fail(lease, BOOM, now=T0, retry_at=None)
    later = T0 + timedelta(minutes=5)
    requeued = harness.store.requeue(job.id, now=later, extra_attempts=3)
    assert requeued.status is JobStatus.PENDING
    assert (requeued.attempt, requeued.max_attempts) == (1, 4)
    assert requeued.error is None
    assert job.id in [i.job_id for i in harness.store.due_outbox(now=later, limit=10)]
    assert harness.store.claim(job.id, "w2", now=later) == Lease(job.id, "w2", 2)
    with pytest.raises(JobNotFound):
        harness.store.requeue(str(uuid.uuid4()), now=T0, extra_attempts=1)


def test_release_returns_the_attempt(harness: Harness) -> None:
    job, lease = harness.running()
    released = harness.store.release(lease, now=T0)
    assert released.status is JobStatus.RETRYING
    assert released.attempt == 0
    assert harness.store.claim(job.id, "w2", now=T0) == Lease(job.id, "w2", 1)


def test_heartbeat_refreshes_held_leases_and_reports_lost_ones(harness: Harness) -> None:
    job, lease = harness.running()
    other, other_lease = harness.running()
    harness.store.cancel(other.id, now=T0)
    lost = harness.store.heartbeat([lease, other_lease], now=T0 + timedelta(seconds=3))
    assert lost == [other_lease]
    got = harness.store.get(job.id)
    assert got is not None
    assert got.heartbeat_at == T0 + timedelta(seconds=3)


def test_rescue_moves_only_stale_running_jobs(harness: Harness) -> None:
    stale, _ = harness.running()
    fresh, fresh_lease = harness.running()
    spent, _ = harness.running(max_attempts=1)
    harness.store.heartbeat([fresh_lease], now=T0 + timedelta(seconds=50))
    lost = Failure("the worker stopped responding", "worker_lost", "transient", True)
    rescued = harness.store.rescue_stale(
        stale_before=T0 + timedelta(seconds=30),
        now=T0 + timedelta(seconds=60),
        failure=lost,
        retry_at=lambda job: (
            None if job.attempt >= job.max_attempts else T0 + timedelta(seconds=70)
        ),
    )
    by_id = {job.id: job for job in rescued}
    assert set(by_id) == {stale.id, spent.id}
    assert by_id[stale.id].status is JobStatus.RETRYING
    assert by_id[stale.id].error_code == "worker_lost"
    assert by_id[spent.id].status is JobStatus.FAILED
    assert harness.status(fresh.id) is JobStatus.RUNNING


def test_outbox_publish_requeue_and_prune(harness: Harness) -> None:
    job = harness.new_job()
    items = harness.store.due_outbox(now=T0, limit=10)
    assert harness.store.outbox_backlog(now=T0 + timedelta(seconds=4)) == (1, 4.0)
    harness.store.mark_published([i.id for i in items], now=T0)
    assert harness.store.due_outbox(now=T0, limit=10) == []
    assert harness.store.outbox_backlog(now=T0) == (0, 0.0)
    # published recently: not requeued; published before the cutoff and still pending: requeued
    assert harness.store.requeue_unclaimed(published_before=T0, now=T0) == 0
    cutoff = T0 + timedelta(minutes=5)
    assert harness.store.requeue_unclaimed(published_before=cutoff, now=cutoff) == 1
    assert [i.job_id for i in harness.store.due_outbox(now=cutoff, limit=10)] == [job.id]
    # a running job is never requeued
    lease = harness.store.claim(job.id, "w1", now=cutoff)
    assert lease is not None
    assert harness.store.requeue_unclaimed(published_before=cutoff, now=cutoff) == 0
    assert harness.store.prune_outbox(published_before=cutoff) == 1


def test_failed_publish_keeps_the_row(harness: Harness) -> None:
    job = harness.new_job()
    (item,) = harness.store.due_outbox(now=T0, limit=10)
    harness.store.mark_publish_failed(item.id, "ConnectionError: broker down")
    (again,) = harness.store.due_outbox(now=T0, limit=10)
    assert (again.id, again.job_id, again.publish_attempts) == (item.id, job.id, 1)


def test_publish_outbox_publishes_in_order_and_marks_rows(harness: Harness) -> None:
    jobs = [harness.new_job() for _ in range(5)]
    sent: list[tuple[str, str]] = []

    def publish(job_id: str, kind: str) -> None:
        sent.append((job_id, kind))

    assert harness.store.publish_outbox(now=T0, limit=3, publish=publish) == (3, None)
    assert harness.store.publish_outbox(now=T0, limit=3, publish=publish) == (2, None)
    assert sent == [(job.id, job.kind) for job in jobs]  # each with its kind, for its lane
    assert harness.store.publish_outbox(now=T0, limit=3, publish=publish) == (0, None)
    assert harness.store.due_outbox(now=T0, limit=10) == []


def test_publish_outbox_stops_at_a_broker_failure_and_keeps_the_rest(harness: Harness) -> None:
    jobs = [harness.new_job() for _ in range(3)]
    sent: list[tuple[str, str]] = []

    def publish(job_id: str, kind: str) -> None:
        sent.append((job_id, kind))

    def flaky(job_id: str, kind: str) -> None:
        if len(sent) == 1:
            raise ConnectionError("broker down")
        sent.append(job_id)

    published, error = harness.store.publish_outbox(now=T0, limit=10, publish=flaky)
    assert (published, error) == (1, "ConnectionError: broker down")
    due = harness.store.due_outbox(now=T0, limit=10)
    assert [item.job_id for item in due] == [jobs[1].id, jobs[2].id]
    assert [item.publish_attempts for item in due] == [1, 0]


def test_two_relays_publishing_at_once_never_send_a_row_twice(harness: Harness) -> None:
    jobs = [harness.new_job() for _ in range(40)]
    sent: list[tuple[str, str]] = []

    def publish(job_id: str, kind: str) -> None:
        sent.append((job_id, kind))

    lock = threading.Lock()
    first_inside = threading.Event()

    def slow(job_id: str, kind: str) -> None:
        first_inside.set()
        with lock:
            sent.append(job_id)
        time.sleep(0.005)

    def relay() -> None:
        harness.store.publish_outbox(now=T0, limit=15, publish=slow)

    threads = [threading.Thread(target=relay) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    while harness.store.publish_outbox(now=T0, limit=15, publish=slow)[0]:
        pass
    assert first_inside.is_set()
    assert sorted(sent) == sorted(job.id for job in jobs)  # each once, none lost


def test_metrics_count_states_stage_durations_and_outcomes(harness: Harness) -> None:
    def at(seconds: float) -> datetime:
        return T0 + timedelta(seconds=seconds)

    _, done_lease = harness.running()
    for seconds, stage in ((1, Stage.PARSING), (3, Stage.EMBEDDING), (4, Stage.INDEXING)):
        harness.store.report(done_lease, now=at(seconds), stage=stage)
    harness.store.report(done_lease, now=at(5), processed=3)  # no stage change: no event
    harness.store.complete(done_lease, now=at(6))
    _, retry_lease = harness.running()
    harness.store.fail(retry_lease, BOOM, now=at(2), retry_at=at(30))
    _, failed_lease = harness.running()
    harness.store.fail(
        failed_lease, Failure("bad", "corrupt_file", "permanent", False), now=at(2), retry_at=None
    )
    cancelled = harness.new_job()
    harness.store.cancel(cancelled.id, now=at(3))
    harness.new_job()  # pending since T0
    _, running_lease = harness.running()
    harness.store.report(running_lease, now=at(7), stage=Stage.PARSING)

    metrics = harness.store.metrics(now=at(10))
    assert metrics.jobs_by_status == {
        "completed": 1,
        "retrying": 1,
        "failed": 1,
        "cancelled": 1,
        "pending": 1,
        "running": 1,
    }
    assert metrics.outcomes == {
        ("completed", ""): 1,
        ("retry", "transient"): 1,
        ("failed", "permanent"): 1,
        ("cancelled", ""): 1,
    }
    assert metrics.stage_seconds == {
        "queued": (2, 8.0),  # 1 s for the completed job, 7 s for the running one
        "parsing": (1, 2.0),
        "embedding": (1, 1.0),
        "indexing": (1, 2.0),
    }
    assert metrics.oldest_waiting_age_s == 10.0  # the pending job; the retry is not due yet
    assert metrics.running_heartbeat_ages_s == [3.0]
    assert metrics.outbox_backlog >= 1


def test_listener_sees_every_transition(harness: Harness) -> None:
    job, lease = harness.running()
    harness.store.fail(lease, BOOM, now=T0, retry_at=T0)
    lease2 = harness.store.claim(job.id, "w2", now=T0)
    assert lease2 is not None
    harness.store.complete(lease2, now=T0)
    statuses = [(before, after) for job_id, before, after in harness.recorder.seen]
    S = JobStatus
    assert statuses == [
        (S.PENDING, S.RUNNING),
        (S.RUNNING, S.RETRYING),
        (S.RETRYING, S.RUNNING),
        (S.RUNNING, S.COMPLETED),
    ]


@pytest.fixture(params=["sqlite", "postgres"])
def sql_harness(request: pytest.FixtureRequest) -> Harness:
    """Only the SQL stores: the in-memory one has no transactions to join."""
    recorder = Recorder()
    db: Database = request.getfixturevalue(f"{request.param}_db")
    return Harness(SqlJobStore(db, recorder), db, recorder)


def test_outbox_row_is_in_the_callers_transaction(sql_harness: Harness) -> None:
    harness = sql_harness
    db = sql_harness.db
    assert db is not None
    added: list[Job] = []

    def upload_that_fails_after_adding_its_job() -> None:
        with db.write() as conn:
            added.append(harness.new_job(tx=conn))
            raise RuntimeError("the upload failed after the job was added")

    with pytest.raises(RuntimeError):
        upload_that_fails_after_adding_its_job()
    assert harness.store.get(added[0].id) is None
    with db.read() as conn:
        rows = conn.execute(select(outbox_table).where(outbox_table.c.job_id == added[0].id)).all()
    assert rows == []
