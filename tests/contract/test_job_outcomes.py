"""The jobs core's outcome listeners, on every store (memory, SQLite, PostgreSQL): told of each
job that ends, inside the transaction that ends it, as the job now stands; what a listener
adds there (a follow-up job with its outbox row, as a webhook delivery is) commits with the
end or not at all; a split job's end is told once, for the job, never for its parts; and a
silent kind's changes are not recorded for the event streams."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from knowledgeops.db.engine import Database
from knowledgeops.jobs.memory_store import MemoryJobStore
from knowledgeops.jobs.model import Job, NewJob
from knowledgeops.jobs.sql_store import SqlJobStore
from knowledgeops.jobs.states import JobStatus
from knowledgeops.jobs.store import JobStore
from tests.contract.test_job_store import BOOM, T0, Harness, Recorder

FOLLOW_UP = "followup"


class FollowUps:
    """Adds a job of kind `followup` for each job that ends (not for its own)."""

    def __init__(self) -> None:
        self.told: list[tuple[str, JobStatus, bool]] = []
        self.added: list[str] = []
        self.fail_next = False

    def on_outcome(self, store: JobStore, tx: Any, job: Job, now: datetime) -> None:
        self.told.append((job.id, job.status, job.finished_at is not None))
        if job.kind == FOLLOW_UP:
            return
        new = NewJob(str(uuid.uuid4()), None, job.dataset_id, 0, 5, kind=FOLLOW_UP)
        store.add(new, now=now, tx=tx)
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("the listener failed")
        self.added.append(new.id)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def outcomes(request: pytest.FixtureRequest) -> Iterator[tuple[Harness, FollowUps]]:
    follow_ups = FollowUps()
    silent = {FOLLOW_UP}
    if request.param == "memory":
        store: JobStore = MemoryJobStore(None, [follow_ups], silent_kinds=silent)
        yield Harness(store, None, Recorder()), follow_ups
        return
    db: Database = request.getfixturevalue(f"{request.param}_db")
    yield Harness(SqlJobStore(db, None, [follow_ups], silent), db, Recorder()), follow_ups


def test_an_end_is_told_as_the_job_now_stands_and_its_follow_up_is_due(
    outcomes: tuple[Harness, FollowUps],
) -> None:
    harness, follow_ups = outcomes
    job, lease = harness.running()
    harness.store.complete(lease, now=T0)
    assert follow_ups.told == [(job.id, JobStatus.COMPLETED, True)]
    (added,) = follow_ups.added
    follow_up = harness.store.get(added)
    assert follow_up is not None
    assert (follow_up.kind, follow_up.status) == (FOLLOW_UP, JobStatus.PENDING)
    sent: list[tuple[str, str]] = []
    harness.store.publish_outbox(now=T0, limit=10, publish=lambda j, k: sent.append((j, k)))
    assert (added, FOLLOW_UP) in sent  # published with its kind, for its lane


def test_a_retry_is_no_end_but_a_final_failure_and_a_cancel_are(
    outcomes: tuple[Harness, FollowUps],
) -> None:
    harness, follow_ups = outcomes
    job, lease = harness.running()
    harness.store.fail(lease, BOOM, now=T0, retry_at=T0)
    assert follow_ups.told == []
    again = harness.store.claim(job.id, "w2", now=T0)
    assert again is not None
    harness.store.fail(again, BOOM, now=T0, retry_at=None)
    cancelled = harness.new_job()
    harness.store.cancel(cancelled.id, now=T0)
    assert [(t[0], t[1]) for t in follow_ups.told] == [
        (job.id, JobStatus.FAILED),
        (cancelled.id, JobStatus.CANCELLED),
    ]
    assert len(follow_ups.added) == 2


def test_what_a_listener_adds_commits_with_the_end_or_not_at_all(
    outcomes: tuple[Harness, FollowUps],
) -> None:
    harness, follow_ups = outcomes
    job, lease = harness.running()
    follow_ups.fail_next = True
    with pytest.raises(RuntimeError, match="the listener failed"):
        harness.store.complete(lease, now=T0)
    assert harness.status(job.id) is JobStatus.RUNNING  # the end was rolled back
    due = harness.store.due_outbox(now=T0, limit=10)
    assert {item.job_id for item in due} == {job.id}  # its own row only: no follow-up
    harness.store.complete(lease, now=T0)
    assert harness.status(job.id) is JobStatus.COMPLETED
    assert len(follow_ups.added) == 1


def test_a_split_job_ends_once_for_its_parts(outcomes: tuple[Harness, FollowUps]) -> None:
    harness, follow_ups = outcomes
    job, lease = harness.running()
    parts = harness.store.split(lease, 2, now=T0, work=lambda tx, ids: None)
    for n, part_id in enumerate(parts):
        part_lease = harness.store.claim(part_id, f"p{n}", now=T0)
        assert part_lease is not None
        harness.store.complete(part_lease, now=T0)
    assert [(t[0], t[1]) for t in follow_ups.told] == [(job.id, JobStatus.COMPLETED)]


def test_a_silent_kinds_changes_are_not_recorded(outcomes: tuple[Harness, FollowUps]) -> None:
    harness, follow_ups = outcomes
    job, lease = harness.running()
    harness.store.complete(lease, now=T0)
    (added,) = follow_ups.added
    follow_up_lease = harness.store.claim(added, "w9", now=T0)
    assert follow_up_lease is not None
    harness.store.complete(follow_up_lease, now=T0)
    last = harness.store.last_event_id()
    assert harness.store.changes(after=0, through=last, limit=100, job_id=added) == []
    recorded = harness.store.changes(after=0, through=last, limit=100, job_id=job.id)
    assert [c.status for c in recorded][-1] == "completed"
    assert (added, JobStatus.COMPLETED, True) in follow_ups.told  # its own end told, no loop
    metrics = harness.store.metrics(now=T0)  # /metrics: the documents' jobs, not the system's
    assert metrics.jobs_by_status == {"completed": 1}
    assert sum(n for (kind, _), n in metrics.outcomes.items() if kind == "completed") == 1
