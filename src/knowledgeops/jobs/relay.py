"""The relay: closes the gap between a database commit and the broker (docs/architecture.md:
Failure classes).

Each pass it (1) moves running jobs whose heartbeat went stale to retrying or failed, (2) writes a
new outbox row for runnable jobs nobody claimed long after their last publish, (3) publishes due
outbox rows (new jobs, retries whose `run_after` came) and (4) prunes old published rows and
the record of job changes past its retention. When
the broker refuses a message the row stays unpublished and the next pass tries again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from knowledgeops.errors import TransientError
from knowledgeops.jobs.dispatch import Dispatcher
from knowledgeops.jobs.model import Failure, Job
from knowledgeops.jobs.retry import RetryPolicy
from knowledgeops.jobs.store import JobStore
from knowledgeops.jobs.ticker import Ticker

log = logging.getLogger(__name__)

PUBLISH_BATCH = 200
PRUNE_AFTER = timedelta(days=1)
BUSY_BROKER_FACTOR = 10  # while messages wait in the broker, re-publish only after 10× as long
BACKLOG_CHECK = timedelta(seconds=10)  # how long a look at the broker's backlog is trusted


@dataclass(frozen=True, slots=True)
class RelayPass:
    rescued: int
    requeued: int
    published: int
    publish_failed: int


class Relay(Ticker):
    def __init__(
        self,
        store: JobStore,
        dispatcher: Dispatcher,
        *,
        policy: RetryPolicy,
        stale_after_s: float,
        republish_after_s: float,
        interval_s: float,
        clock: Callable[[], datetime],
        change_retention_s: float | None = None,
    ) -> None:
        """`change_retention_s`: how long the record of job changes (what event streams replay)
        is kept; None keeps it all."""
        self.store = store
        self.dispatcher = dispatcher
        self.policy = policy
        self.stale_after = timedelta(seconds=stale_after_s)
        self.republish_after = timedelta(seconds=republish_after_s)
        self.change_retention = (
            None if change_retention_s is None else timedelta(seconds=change_retention_s)
        )
        self.clock = clock
        self._backlog: int | None = None
        self._backlog_at: datetime | None = None
        super().__init__(
            "kops-relay",
            interval_s,
            self.run_once,
            at_once=True,
            failure="relay pass failed",  # the database may be briefly down; the next pass tries
            join_timeout_s=10,
        )

    # --- one pass -------------------------------------------------------------------------------
    def run_once(self) -> RelayPass:
        now = self.clock()
        rescued = self.rescue(stale_before=now - self.stale_after)
        unclaimed_for = self.republish_after
        if self._broker_busy():
            unclaimed_for *= BUSY_BROKER_FACTOR
        requeued = self.store.requeue_unclaimed(published_before=now - unclaimed_for, now=now)
        published, failed = self.publish_due()
        self.store.prune_outbox(published_before=now - PRUNE_AFTER)
        if self.change_retention is not None:
            self.store.prune_changes(before=now - self.change_retention)
        return RelayPass(len(rescued), requeued, published, failed)

    def rescue(self, *, stale_before: datetime) -> list[Job]:
        now = self.clock()
        silent_s = int((now - stale_before).total_seconds())
        lost = TransientError(
            f"the worker stopped responding (no heartbeat for {silent_s} s)", code="worker_lost"
        )
        failure = Failure(lost.message, lost.code, lost.category.value, retryable=True)

        def retry_at(job: Job) -> datetime | None:
            return self.policy.next_run_after(
                lost, attempt=max(job.attempt, 1), max_attempts=job.max_attempts, now=now
            )

        rescued = self.store.rescue_stale(
            stale_before=stale_before, now=now, failure=failure, retry_at=retry_at
        )
        for job in rescued:
            log.warning("job %s: worker lost; now %s", job.id, job.status)
        return rescued

    def _broker_busy(self) -> bool:
        """Messages still wait in the broker. A runnable job nobody claimed may have its message
        among them, so re-publishing it soon would only pile up copies: it waits ten times as
        long. With the queue empty, an unclaimed job's message was lost (a broker restarted
        without persistence, a worker died before its claim) and it is published again after
        `republish_after_s`. The broker is asked at most every BACKLOG_CHECK."""
        now = self.clock()
        if self._backlog_at is None or now - self._backlog_at >= BACKLOG_CHECK:
            try:
                self._backlog = self.dispatcher.backlog()
            except Exception:
                self._backlog = None
            self._backlog_at = now
        return self._backlog is not None and self._backlog > 0

    def publish_due(self) -> tuple[int, int]:
        """Publish due outbox rows, a batch at a time, until none is due or the broker fails."""
        total = 0
        while True:
            published, error = self.store.publish_outbox(
                now=self.clock(), limit=PUBLISH_BATCH, publish=self.dispatcher.publish
            )
            total += published
            if error is not None:  # the broker is down: the rows stay, the next pass tries
                log.warning("publishing to the broker failed: %s", error)
                return total, 1
            if published < PUBLISH_BATCH:
                return total, 0

    def recover_after_restart(self) -> RelayPass:
        """Embedded start-up only (this process holds the data folder's lock, so no other worker
        can be alive): every running job is orphaned, and every open job must be published again
        because the in-process queue died with the last process."""
        now = self.clock()
        everything_until_now = now + timedelta(microseconds=1)
        rescued = self.rescue(stale_before=everything_until_now)
        requeued = self.store.requeue_unclaimed(published_before=everything_until_now, now=now)
        published, failed = self.publish_due()
        log.info(
            "recovered after restart: %d orphaned running jobs, %d jobs re-published",
            len(rescued),
            requeued,
        )
        return RelayPass(len(rescued), requeued, published, failed)
