"""The split-job contract (JobStore.split, jobs/parts.py), on every store: in memory, SQLite and
PostgreSQL. A split job waits on its parts, shows their summed progress, completes with the last
of them, fails with the first that fails for good, and is cancelled with them."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

from knowledgeops.jobs.model import Failure, Job, Lease
from knowledgeops.jobs.parts import PART_KIND
from knowledgeops.jobs.states import JobStatus, Stage
from knowledgeops.jobs.store import LeaseLost
from tests.contract.test_job_store import BOOM, T0, Harness, Recorder, harness

__all__ = ["harness"]  # the store fixture, shared with the job store's contract suite

S = JobStatus
LOST = Failure("the worker stopped responding", "worker_lost", "transient", True)
BROKEN = Failure("The file could not be read as a PDF", "corrupt_file", "permanent", False)


def at(seconds: float) -> Any:
    return T0 + timedelta(seconds=seconds)


def split(h: Harness, parts: int = 3, **kw: Any) -> tuple[Job, Lease, list[str], list[Any]]:
    job, lease = h.running(**kw)
    seen: list[Any] = []

    def work(tx: Any, ids: list[str]) -> None:
        seen.append((tx is None, list(ids)))

    ids = h.store.split(lease, parts, now=at(1), work=work)
    return job, lease, ids, seen


def claim(h: Harness, job_id: str, owner: str, seconds: float = 2) -> Lease:
    lease = h.store.claim(job_id, owner, now=at(seconds))
    assert lease is not None
    return lease


def got(h: Harness, job_id: str) -> Job:
    job = h.store.get(job_id)
    assert job is not None
    return job


def test_split_hands_the_work_to_pending_parts(harness: Harness) -> None:
    job, lease, ids, seen = split(harness, 3, max_attempts=4)
    assert len(ids) == len(set(ids)) == 3
    assert seen == [(harness.db is None, ids)]  # the work ran once, in the store's transaction
    parent = got(harness, job.id)
    assert parent.status is S.RUNNING
    assert parent.lease_owner is None  # no worker holds it now
    assert (parent.stage, parent.total_chunks, parent.processed_chunks) == (Stage.PARSING, None, 0)
    for part_id in ids:
        part = got(harness, part_id)
        assert (part.status, part.kind, part.parent_id) == (S.PENDING, PART_KIND, job.id)
        assert (part.document_id, part.generation) == (job.document_id, job.generation)
        assert (part.attempt, part.max_attempts) == (0, 4)
    due = {item.job_id for item in harness.store.due_outbox(now=at(1), limit=50)}
    assert set(ids) <= due
    with pytest.raises(LeaseLost):  # the splitting worker holds nothing now
        harness.store.report(lease, now=at(2), processed=1)
    # the listener hears of the job, never of its parts
    assert [seen_id for seen_id, _, _ in harness.recorder.seen] == [job.id]


def test_split_is_fenced_by_the_lease(harness: Harness) -> None:
    job, lease = harness.running()
    harness.store.cancel(job.id, now=T0)
    ran: list[Any] = []
    with pytest.raises(LeaseLost):
        harness.store.split(lease, 2, now=at(1), work=lambda tx, ids: ran.append(ids))
    assert ran == []
    assert [i.job_id for i in harness.store.due_outbox(now=at(1), limit=50)] == [job.id]


def test_parent_shows_the_parts_summed_progress(harness: Harness) -> None:
    job, _, ids, _ = split(harness, 3)
    first, second = claim(harness, ids[0], "w1"), claim(harness, ids[1], "w2")
    harness.store.report(first, now=at(3), stage=Stage.EMBEDDING, total=10, processed=4)
    harness.store.report(second, now=at(4), stage=Stage.CHUNKING)
    parent = got(harness, job.id)
    # a part is embedding: so is the job, whatever its other parts are at (one still queued)
    assert (parent.stage, parent.total_chunks, parent.processed_chunks) == (
        Stage.EMBEDDING,
        None,
        4,
    )
    assert parent.heartbeat_at == at(4)
    third = claim(harness, ids[2], "w3", 5)
    harness.store.report(third, now=at(6), stage=Stage.EMBEDDING, total=5, processed=5)
    harness.store.report(second, now=at(7), stage=Stage.EMBEDDING, total=7, processed=2)
    parent = got(harness, job.id)
    assert (parent.stage, parent.total_chunks, parent.processed_chunks) == (
        Stage.EMBEDDING,
        22,
        11,
    )
    assert parent.status is S.RUNNING


def test_the_last_part_to_complete_completes_the_job(harness: Harness) -> None:
    job, _, ids, _ = split(harness, 2)
    leases = [claim(harness, part_id, f"w{n}") for n, part_id in enumerate(ids)]
    for n, lease in enumerate(leases):
        harness.store.report(lease, now=at(3), stage=Stage.EMBEDDING, total=3 + n, processed=3 + n)
    harness.store.complete(leases[0], now=at(4))
    assert got(harness, job.id).status is S.RUNNING
    harness.store.complete(leases[1], now=at(5))
    parent = got(harness, job.id)
    assert parent.status is S.COMPLETED
    assert (parent.stage, parent.total_chunks, parent.processed_chunks) == (Stage.DONE, 7, 7)
    assert parent.finished_at == at(5)
    assert harness.recorder.seen[-1] == (job.id, S.RUNNING, S.COMPLETED)
    assert [r for r in harness.recorder.seen if r[0] != job.id] == []
    outcomes = harness.store.metrics(now=at(6)).outcomes
    assert outcomes == {("completed", ""): 1}  # the job's completion, not its parts'


def test_a_part_failing_for_good_fails_the_job_and_cancels_the_rest(harness: Harness) -> None:
    job, _, ids, _ = split(harness, 3)
    broken, running = claim(harness, ids[0], "w1"), claim(harness, ids[1], "w2")
    harness.store.fail(broken, BROKEN, now=at(3), retry_at=None)
    parent = got(harness, job.id)
    assert parent.status is S.FAILED
    assert (parent.error, parent.error_code, parent.error_category, parent.retryable) == (
        BROKEN.message,
        BROKEN.code,
        BROKEN.category,
        BROKEN.retryable,
    )
    assert got(harness, ids[1]).status is S.CANCELLED
    assert got(harness, ids[2]).status is S.CANCELLED
    with pytest.raises(LeaseLost):  # the other part's worker is stopped at its next write
        harness.store.report(running, now=at(4), processed=1)
    assert harness.store.claim(ids[2], "w3", now=at(5)) is None
    assert harness.recorder.seen[-1] == (job.id, S.RUNNING, S.FAILED)
    assert harness.store.metrics(now=at(6)).outcomes == {("failed", "permanent"): 1}


def test_a_part_retrying_leaves_the_job_running(harness: Harness) -> None:
    job, _, ids, _ = split(harness, 2)
    lease = claim(harness, ids[0], "w1")
    harness.store.fail(lease, BOOM, now=at(3), retry_at=at(30))
    assert got(harness, ids[0]).status is S.RETRYING
    assert got(harness, job.id).status is S.RUNNING
    assert claim(harness, ids[0], "w2", 30) == Lease(ids[0], "w2", 2, job.id)
    assert harness.store.metrics(now=at(31)).outcomes == {("retry", "transient"): 1}


def test_cancelling_the_job_cancels_its_parts(harness: Harness) -> None:
    job, _, ids, _ = split(harness, 2)
    lease = claim(harness, ids[0], "w1")
    harness.store.cancel(job.id, now=at(3))
    assert [got(harness, i).status for i in ids] == [S.CANCELLED, S.CANCELLED]
    with pytest.raises(LeaseLost):
        harness.store.report(lease, now=at(4), processed=1)


def test_cancelling_a_part_cancels_the_job(harness: Harness) -> None:
    job, _, ids, _ = split(harness, 3)
    harness.store.cancel(ids[1], now=at(3))
    assert got(harness, job.id).status is S.CANCELLED
    assert [got(harness, i).status for i in ids] == [S.CANCELLED] * 3
    assert harness.store.metrics(now=at(4)).outcomes == {("cancelled", ""): 1}


def test_a_crashed_part_is_rescued_and_its_waiting_parent_is_not(harness: Harness) -> None:
    job, _, ids, _ = split(harness, 2)
    crashed = claim(harness, ids[0], "w1")  # its worker dies: no more heartbeats
    alive = claim(harness, ids[1], "w2")
    harness.store.heartbeat([alive], now=at(100))
    rescued = harness.store.rescue_stale(
        stale_before=at(60), now=at(120), failure=LOST, retry_at=lambda j: at(125)
    )
    assert [j.id for j in rescued] == [ids[0]]  # not the parent, silent as it is
    assert got(harness, ids[0]).status is S.RETRYING
    assert got(harness, job.id).status is S.RUNNING
    with pytest.raises(LeaseLost):
        harness.store.report(crashed, now=at(121), processed=1)
    again = claim(harness, ids[0], "w3", 125)
    harness.store.complete(again, now=at(126))
    harness.store.complete(alive, now=at(127))
    assert got(harness, job.id).status is S.COMPLETED
    # a parent waiting on its parts has no heartbeat of its own to be stale
    assert harness.store.metrics(now=at(127)).running_heartbeat_ages_s == []


def test_a_job_split_again_replaces_its_earlier_parts(harness: Harness) -> None:
    job, _, ids, _ = split(harness, 2)
    harness.store.cancel(job.id, now=at(2))
    harness.store.requeue(job.id, now=at(3), extra_attempts=2)
    lease = harness.store.claim(job.id, "w9", now=at(3))
    assert lease is not None
    new = harness.store.split(lease, 3, now=at(4), work=lambda tx, ids: None)
    assert set(new).isdisjoint(ids)
    assert all(harness.store.get(old) is None for old in ids)
    assert [got(harness, i).status for i in new] == [S.PENDING] * 3
    assert all(got(harness, i).max_attempts == 2 for i in new)


class Refuser(Recorder):
    """A listener that refuses to complete a job (as the ingest pipeline refuses a document
    whose parts found no text)."""

    def on_transition(self, tx: Any, job: Job, new_status: JobStatus) -> None:
        if new_status is S.COMPLETED:
            raise RuntimeError("nothing to activate")
        super().on_transition(tx, job, new_status)


def test_a_refused_completion_leaves_the_last_part_running(harness: Harness) -> None:
    harness.store.listener = Refuser()  # type: ignore[attr-defined]
    job, _, ids, _ = split(harness, 1)
    lease = claim(harness, ids[0], "w1")
    with pytest.raises(RuntimeError, match="nothing to activate"):
        harness.store.complete(lease, now=at(3))
    part = got(harness, ids[0])
    assert (part.status, part.lease_owner) == (S.RUNNING, "w1")
    assert got(harness, job.id).status is S.RUNNING
    harness.store.fail(lease, BROKEN, now=at(4), retry_at=None)
    assert got(harness, job.id).status is S.FAILED


def test_parts_completing_at_once_complete_the_job_once(harness: Harness) -> None:
    job, _, ids, _ = split(harness, 6)
    leases = [claim(harness, part_id, f"w{n}") for n, part_id in enumerate(ids)]
    barrier = threading.Barrier(len(leases))
    errors: list[BaseException] = []

    def finish(lease: Lease) -> None:
        try:
            barrier.wait()
            harness.store.report(lease, now=at(3), stage=Stage.EMBEDDING, total=2, processed=2)
            harness.store.complete(lease, now=at(4))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=finish, args=(lease,)) for lease in leases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    parent = got(harness, job.id)
    assert (parent.status, parent.processed_chunks, parent.total_chunks) == (S.COMPLETED, 12, 12)
    completions = [r for r in harness.recorder.seen if r[2] is S.COMPLETED]
    assert completions == [(job.id, S.RUNNING, S.COMPLETED)]
