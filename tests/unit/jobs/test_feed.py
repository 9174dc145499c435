"""The change feed (jobs/feed.py) over the in-memory store: each change reaches the subscribers
of its job or dataset once, in id order, and never past an id that has not committed."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from knowledgeops.jobs.feed import ChangeFeed, Topic
from knowledgeops.jobs.memory_store import MemoryJobStore
from knowledgeops.jobs.model import Change, Job, NewJob
from knowledgeops.jobs.states import Stage

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Uncommitted(MemoryJobStore):
    """A store whose rows in `hidden` are not visible yet: a transaction that took its ids and
    has not committed (PostgreSQL hands ids out before commit)."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden: set[int] = set()

    def record_after(self, *, after: int, limit: int) -> list[tuple[int, Change | None]]:
        rows = super().record_after(after=after, limit=limit + len(self.hidden))
        return [row for row in rows if row[0] not in self.hidden][:limit]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Inbox:
    def __init__(self) -> None:
        self.got: list[Change] = []

    def __call__(self, changes: Sequence[Change]) -> None:
        self.got += changes

    def seen(self) -> list[tuple[str, str]]:
        return [(c.job_id, c.status) for c in self.got]


def add(store: MemoryJobStore, dataset_id: str) -> Job:
    new = NewJob(str(uuid.uuid4()), str(uuid.uuid4()), dataset_id, 1, 3)
    return store.add(new, now=T0)


def test_changes_reach_the_subscribers_of_their_job_or_dataset() -> None:
    store, clock = MemoryJobStore(), Clock()
    feed = ChangeFeed(store, poll_s=60, clock=clock)
    a = add(store, "ds-1")  # before anyone subscribed: not handed out
    by_job, by_dataset, other = Inbox(), Inbox(), Inbox()
    feed.subscribe(Topic(job_id=a.id), by_job)
    sub = feed.subscribe(Topic(dataset_id="ds-1"), by_dataset)
    feed.subscribe(Topic(dataset_id="ds-2"), other)
    assert sub.since == store.last_event_id()
    b = add(store, "ds-1")
    lease = store.claim(a.id, "w", now=T0)
    assert lease is not None
    store.report(lease, now=T0, stage=Stage.PARSING)
    feed.poll_once()
    assert by_job.seen() == [(a.id, "running"), (a.id, "running")]
    assert by_dataset.seen() == [(b.id, "pending"), (a.id, "running"), (a.id, "running")]
    assert other.got == []
    assert feed.poll_once() == 0  # nothing new: nothing handed out twice
    assert len(by_dataset.got) == 3


def test_an_uncommitted_id_holds_back_what_follows_until_it_commits() -> None:
    store, clock = Uncommitted(), Clock()
    feed = ChangeFeed(store, poll_s=60, gap_wait_s=5, clock=clock)
    inbox = Inbox()
    feed.subscribe(Topic(dataset_id="ds"), inbox)
    slow = add(store, "ds")
    store.hidden.add(store.last_event_id())  # its transaction has not committed
    fast = add(store, "ds")
    feed.poll_once()
    assert inbox.got == []  # fast's change waits behind slow's
    clock.now = 1.0
    store.hidden.clear()  # slow commits
    feed.poll_once()
    assert inbox.seen() == [(slow.id, "pending"), (fast.id, "pending")]


def test_a_gap_that_never_fills_is_stepped_over_after_the_wait() -> None:
    store, clock = Uncommitted(), Clock()
    feed = ChangeFeed(store, poll_s=60, gap_wait_s=5, clock=clock)
    inbox = Inbox()
    feed.subscribe(Topic(dataset_id="ds"), inbox)
    add(store, "ds")
    store.hidden.add(store.last_event_id())  # rolled back: never visible
    kept = add(store, "ds")
    feed.poll_once()
    clock.now = 4.9
    feed.poll_once()
    assert inbox.got == []
    clock.now = 5.0
    feed.poll_once()
    assert inbox.seen() == [(kept.id, "pending")]
    assert feed.watermark == store.last_event_id()


def test_a_subscriber_reads_up_to_its_start_from_the_record_and_the_rest_from_the_feed() -> None:
    store, clock = MemoryJobStore(), Clock()
    feed = ChangeFeed(store, poll_s=60, clock=clock)
    early = Inbox()
    feed.subscribe(Topic(dataset_id="ds"), early)
    first = add(store, "ds")
    feed.poll_once()
    second = add(store, "ds")  # recorded, not yet polled
    late = Inbox()
    sub = feed.subscribe(Topic(dataset_id="ds"), late)
    backlog = store.changes(after=0, through=sub.since, limit=100, dataset_id="ds")
    feed.poll_once()
    assert [c.job_id for c in backlog] + [c.job_id for c in late.got] == [first.id, second.id]
    assert [c.job_id for c in early.got] == [first.id, second.id]


def test_a_closed_subscription_and_a_failing_one_get_nothing_more() -> None:
    store = MemoryJobStore()
    feed = ChangeFeed(store, poll_s=60)
    closed, good = Inbox(), Inbox()

    def broken(changes: Sequence[Change]) -> None:
        raise RuntimeError("queue full")

    sub = feed.subscribe(Topic(dataset_id="ds"), closed)
    feed.subscribe(Topic(dataset_id="ds"), broken)
    feed.subscribe(Topic(dataset_id="ds"), good)
    sub.close()
    add(store, "ds")
    feed.poll_once()
    assert closed.got == []
    assert len(good.got) == 1
    assert feed.subscribers == 1  # the failing one was dropped


def test_the_feed_thread_delivers_within_its_poll_interval() -> None:
    store = MemoryJobStore()
    feed = ChangeFeed(store, poll_s=0.02)
    arrived = threading.Event()
    got: list[Change] = []

    def deliver(changes: Sequence[Change]) -> None:
        got.extend(changes)
        arrived.set()

    feed.subscribe(Topic(dataset_id="ds"), deliver)
    try:
        job = add(store, "ds")
        assert arrived.wait(5)
        assert [c.job_id for c in got] == [job.id]
    finally:
        feed.stop()


def test_a_topic_is_one_job_or_one_dataset() -> None:
    with pytest.raises(ValueError, match="one job or one dataset"):
        Topic()
    with pytest.raises(ValueError, match="one job or one dataset"):
        Topic(job_id="j", dataset_id="d")
