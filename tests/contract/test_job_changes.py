"""The record of job changes (kind `change` in `job_events`), on every store: in memory, SQLite
and PostgreSQL. Each change a user can see is recorded once, as the job stood after it, in the
transaction that made it; the event streams follow that record by id (docs/architecture.md:
Live progress)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from knowledgeops.jobs.model import Change, Failure
from knowledgeops.jobs.states import Stage
from tests.contract.test_job_parts import claim, split
from tests.contract.test_job_store import BOOM, T0, Harness, harness

__all__ = ["harness"]  # the store fixture, shared with the job store's contract suite

BROKEN = Failure("The file could not be read as a PDF", "corrupt_file", "permanent", False)


def at(seconds: float) -> Any:
    return T0 + timedelta(seconds=seconds)


def of(h: Harness, job_id: str) -> list[Change]:
    return h.store.changes(after=0, through=h.store.last_event_id(), limit=1000, job_id=job_id)


def seen(changes: list[Change]) -> list[tuple[str, str, int | None, int, int]]:
    return [(c.status, c.stage, c.total, c.processed, c.attempt) for c in changes]


def test_each_visible_change_is_recorded_once_in_order(harness: Harness) -> None:
    job, lease = harness.running()
    store = harness.store
    store.report(lease, now=at(1), stage=Stage.PARSING)
    store.report(lease, now=at(2))  # a heartbeat by report: nothing a user sees changed
    store.report(lease, now=at(3), stage=Stage.EMBEDDING, total=10, processed=0)
    store.report(lease, now=at(4), processed=4)
    store.report(lease, now=at(5), processed=4)  # the same count again
    store.report(lease, now=at(6), processed=10)
    store.complete(lease, now=at(7))
    assert seen(of(harness, job.id)) == [
        ("pending", "queued", None, 0, 0),
        ("running", "queued", None, 0, 1),
        ("running", "parsing", None, 0, 1),
        ("running", "embedding", 10, 0, 1),
        ("running", "embedding", 10, 4, 1),
        ("running", "embedding", 10, 10, 1),
        ("completed", "done", 10, 10, 1),
    ]
    changes = of(harness, job.id)
    assert [c.id for c in changes] == sorted({c.id for c in changes})
    assert {(c.job_id, c.dataset_id, c.document_id) for c in changes} == {
        (job.id, job.dataset_id, job.document_id)
    }
    assert changes[-1].at == at(7)


def test_a_failure_is_recorded_with_its_error_and_a_retry_with_its_next_attempt(
    harness: Harness,
) -> None:
    job, lease = harness.running()
    harness.store.fail(lease, BOOM, now=at(1), retry_at=at(10))
    again = harness.store.claim(job.id, "w2", now=at(10))
    assert again is not None
    harness.store.fail(again, BROKEN, now=at(11), retry_at=None)
    changes = of(harness, job.id)
    retrying, running, failed = changes[-3:]
    assert (retrying.status, retrying.error_code, retrying.error_category) == (
        "retrying",
        "timeout",
        "transient",
    )
    assert (retrying.error, retrying.retryable) == ("the provider timed out", True)
    # the second attempt still shows why the first one ended, until it ends itself
    assert (running.status, running.attempt, running.error_code) == ("running", 2, "timeout")
    assert (failed.status, failed.error_code, failed.retryable) == ("failed", "corrupt_file", False)
    assert failed.error == "The file could not be read as a PDF"


def test_cancel_and_requeue_are_recorded(harness: Harness) -> None:
    job = harness.new_job()
    harness.store.cancel(job.id, now=at(1))
    harness.store.requeue(job.id, now=at(2), extra_attempts=3)
    assert [(c.status, c.error_code) for c in of(harness, job.id)] == [
        ("pending", None),
        ("cancelled", "cancelled"),
        ("pending", None),
    ]


def test_work_that_raises_records_no_change(harness: Harness) -> None:
    job, lease = harness.running()
    before = of(harness, job.id)

    def broken(tx: Any) -> None:
        raise RuntimeError("index write failed")

    with pytest.raises(RuntimeError):
        harness.store.report(lease, now=at(1), stage=Stage.EMBEDDING, total=3, work=broken)
    assert of(harness, job.id) == before


def test_a_split_job_shows_its_parts_progress_and_the_parts_show_nothing(
    harness: Harness,
) -> None:
    job, _, ids, _ = split(harness, 2)
    first, second = claim(harness, ids[0], "w1"), claim(harness, ids[1], "w2")
    harness.store.report(first, now=at(3), stage=Stage.EMBEDDING, total=4, processed=4)
    harness.store.report(second, now=at(4), stage=Stage.EMBEDDING, total=6, processed=2)
    harness.store.complete(first, now=at(5))
    harness.store.report(second, now=at(6), processed=6)
    harness.store.complete(second, now=at(7))
    head = harness.store.last_event_id()
    everything = harness.store.changes(after=0, through=head, limit=1000)
    assert {c.job_id for c in everything} == {job.id}  # no part is ever shown
    shown = seen(of(harness, job.id))
    assert shown[0][:2] == ("pending", "queued")
    assert ("running", "parsing", None, 0, 1) in shown  # the split itself
    assert ("running", "embedding", 10, 6, 1) in shown  # the parts summed
    assert shown[-1] == ("completed", "done", 10, 10, 1)
    assert [s for s in shown if s[0] == "completed"] == [shown[-1]]  # completed once


def test_changes_are_read_by_job_by_dataset_and_up_to_an_id(harness: Harness) -> None:
    a = harness.new_job()
    b = harness.new_job(dataset_id=a.dataset_id)
    other = harness.new_job()
    harness.store.cancel(a.id, now=at(1))
    head = harness.store.last_event_id()
    in_dataset = harness.store.changes(after=0, through=head, limit=100, dataset_id=a.dataset_id)
    assert [(c.job_id, c.status) for c in in_dataset] == [
        (a.id, "pending"),
        (b.id, "pending"),
        (a.id, "cancelled"),
    ]
    assert other.id not in {c.job_id for c in in_dataset}
    first = in_dataset[0].id
    assert [c.job_id for c in harness.store.changes(after=first, through=head, limit=1)] == [b.id]
    upto = harness.store.changes(after=0, through=in_dataset[1].id, limit=100)
    assert [c.job_id for c in upto] == [a.id, b.id]
    assert harness.store.changes(after=head, through=head, limit=100) == []


def test_the_record_lists_every_row_id_and_marks_the_changes(harness: Harness) -> None:
    _job, lease = harness.running()
    harness.store.report(lease, now=at(1), stage=Stage.PARSING)
    harness.store.report(lease, now=at(2), stage=Stage.EMBEDDING)  # leaves parsing: a stage row
    harness.store.complete(lease, now=at(3))  # a stage row and an outcome row too
    rows = harness.store.record_after(after=0, limit=1000)
    ids = [row_id for row_id, _ in rows]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert ids[-1] == harness.store.last_event_id()
    changes = [c for _, c in rows if c is not None]
    assert [c.status for c in changes][-1] == "completed"
    assert len(changes) < len(rows)  # the metrics rows are listed, not as changes
    later = harness.store.record_after(after=ids[2], limit=2)
    assert [row_id for row_id, _ in later] == ids[3:5]


def test_pruning_drops_old_changes_and_keeps_metrics_and_the_newest_row(
    harness: Harness,
) -> None:
    _job, lease = harness.running()
    harness.store.complete(lease, now=at(1))
    before = harness.store.metrics(now=at(2))
    head = harness.store.last_event_id()
    pruned = harness.store.prune_changes(before=at(3600))
    assert pruned >= 2
    assert harness.store.last_event_id() == head  # ids never go back
    left = [c for _, c in harness.store.record_after(after=0, limit=1000) if c is not None]
    assert all(c.id == head for c in left)
    assert harness.store.metrics(now=at(2)).outcomes == before.outcomes
    assert ("completed", "") in before.outcomes
    assert not any(kind == "change" for kind, _ in before.outcomes)
