"""The change feed: follows the record of job changes (`job_events`, kind `change`) in the
database and hands each new change to the subscribers that asked for its job or its dataset.

One feed per API process polls the record every `poll_s` for the rows after its watermark, so a
change made by any process (a worker on another machine, another API process) reaches every
open stream: the database is the source, not an in-process queue (docs/architecture.md: Live
progress).

Ids come from one sequence, but on PostgreSQL a transaction can take an id and commit after a
later one. The feed therefore reads every row after its watermark (metrics rows too) and stops at
the first missing id: that transaction has not committed yet. A gap still there after `gap_wait_s`
is a rolled-back transaction and is stepped over. The watermark is thus a promise: every change
with an id at or below it has been handed out, which is what lets a stream that resumes
(`Last-Event-ID`) read the changes up to the watermark from the database and the rest from the
feed, missing none and repeating none.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from knowledgeops.jobs.model import Change
from knowledgeops.jobs.rows import JobRows

log = logging.getLogger(__name__)

BATCH = 1000  # record rows read per query
Deliver = Callable[[Sequence[Change]], None]


@dataclass(frozen=True, slots=True)
class Topic:
    """What a subscriber follows: one job, or every job of one dataset."""

    job_id: str | None = None
    dataset_id: str | None = None

    def __post_init__(self) -> None:
        if (self.job_id is None) == (self.dataset_id is None):
            raise ValueError("a topic is one job or one dataset")

    def admits(self, change: Change) -> bool:
        if self.job_id is not None:
            return change.job_id == self.job_id
        return change.dataset_id == self.dataset_id


@dataclass(eq=False)
class Subscription:
    """`since`: the feed's watermark when it subscribed; changes up to it are the subscriber's to
    read from the database (`JobRows.changes(through=since)`), those after it come by `deliver`."""

    topic: Topic
    since: int
    _feed: ChangeFeed = field(repr=False)
    _id: int = 0

    def close(self) -> None:
        self._feed._unsubscribe(self)


class ChangeFeed:
    def __init__(
        self,
        store: JobRows,
        *,
        poll_s: float,
        gap_wait_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.poll_s = poll_s
        self.gap_wait_s = gap_wait_s
        self.clock = clock
        self.watermark: int | None = None  # None until the feed first reads the record's head
        self._gaps: dict[int, float] = {}  # missing id → when it was first seen missing
        self._subscribers: dict[int, tuple[Subscription, Deliver]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- subscribers ----------------------------------------------------------------------------
    def subscribe(self, topic: Topic, deliver: Deliver) -> Subscription:
        """Follow `topic`: `deliver` is called from the feed's thread with each batch of new
        changes it admits (keep it short: hand them to a queue). Starts the feed if needed."""
        self.start()
        with self._lock:
            if self.watermark is None:
                self.watermark = self.store.last_event_id()
            sub = Subscription(topic, self.watermark, self, next(self._ids))
            self._subscribers[sub._id] = (sub, deliver)
            return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            self._subscribers.pop(sub._id, None)

    @property
    def subscribers(self) -> int:
        with self._lock:
            return len(self._subscribers)

    # --- the thread -----------------------------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="kops-change-feed", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                while self.poll_once() >= BATCH:  # behind: read on at once
                    pass
            except Exception:  # the database may be briefly down: the next poll tries again
                log.warning("reading the record of job changes failed", exc_info=True)

    def poll_once(self) -> int:
        """Read the record after the watermark, hand out what is complete; returns how many
        rows the watermark moved past."""
        with self._lock:
            if self.watermark is None:
                self.watermark = self.store.last_event_id()
                return 0
            after = self.watermark
        rows = self.store.record_after(after=after, limit=BATCH)
        ready: list[Change] = []
        upto, expected, now, passed = after, after + 1, self.clock(), 0
        for row_id, change in rows:
            if row_id != expected:
                first_seen = self._gaps.setdefault(expected, now)
                if now - first_seen < self.gap_wait_s:
                    break  # not committed yet: wait for it, hand out nothing after it
                log.debug("job_events ids %d..%d never committed", expected, row_id - 1)
            if change is not None:
                ready.append(change)
            upto, expected, passed = row_id, row_id + 1, passed + 1
        for gap in [g for g in self._gaps if g <= upto]:
            del self._gaps[gap]
        with self._lock:
            self.watermark = upto
            by_topic: dict[Topic, list[tuple[Subscription, Deliver]]] = {}
            for sub, deliver in self._subscribers.values():
                by_topic.setdefault(sub.topic, []).append((sub, deliver))
        if ready and by_topic:
            batches: dict[int, tuple[Subscription, Deliver, list[Change]]] = {}
            for change in ready:  # only the streams of its job and of its dataset look at it
                for topic in (Topic(job_id=change.job_id), Topic(dataset_id=change.dataset_id)):
                    for sub, deliver in by_topic.get(topic, ()):
                        if change.id > sub.since:
                            batches.setdefault(sub._id, (sub, deliver, []))[2].append(change)
            for sub, deliver, mine in batches.values():
                try:
                    deliver(mine)
                except Exception:
                    log.warning("a stream's delivery failed; it is dropped", exc_info=True)
                    self._unsubscribe(sub)
        return passed
