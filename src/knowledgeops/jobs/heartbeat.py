"""Heartbeats: one thread per process refreshes `heartbeat_at` of every job its workers hold."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime

from knowledgeops.jobs.model import Lease
from knowledgeops.jobs.store import JobStore, LeaseLost
from knowledgeops.jobs.ticker import Ticker

log = logging.getLogger(__name__)


class Heartbeat(Ticker):
    def __init__(self, store: JobStore, interval_s: float, clock: Callable[[], datetime]) -> None:
        self.store = store
        self.clock = clock
        self._leases: set[Lease] = set()
        self._lock = threading.Lock()
        # a missed beat is not fatal; the next one may get through
        super().__init__(
            "kops-heartbeat",
            interval_s,
            self.beat,
            at_once=False,
            failure="heartbeat failed",
            join_timeout_s=5,
        )

    def hold(self, lease: Lease) -> None:
        with self._lock:
            self._leases.add(lease)

    def drop(self, lease: Lease) -> None:
        with self._lock:
            self._leases.discard(lease)

    def held(self) -> list[Lease]:
        with self._lock:
            return sorted(self._leases, key=lambda lease: lease.job_id)

    def beat(self) -> list[Lease]:
        """Refresh every held lease once; returns the ones that were lost (and drops them)."""
        leases = self.held()
        if not leases:
            return []
        lost = self.store.heartbeat(leases, now=self.clock())
        for lease in lost:
            log.warning("job %s: heartbeat found the lease lost", lease.job_id)
            self.drop(lease)
        return lost

    def release_held(self) -> None:
        """Give back every lease still held (the process is stopping): each job goes back to
        the queue without spending an attempt, and its worker's next write is refused, so it
        cannot finish it."""
        for lease in self.held():
            try:
                self.store.release(lease, now=self.clock())
                log.info("job %s: released at shutdown", lease.job_id)
            except LeaseLost:
                pass
            except Exception:
                log.warning("job %s: could not be released at shutdown", lease.job_id)
