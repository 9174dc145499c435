"""The embedded broker: a queue in this process, fed by the relay, drained by worker threads.

It forgets everything when the process dies; that is fine, because the outbox and the relay's
start-up scan put every open job back in it.
"""

from __future__ import annotations

import queue
import threading


class InProcessQueue:
    """FIFO of job ids; publishing an id that is already waiting is a no-op."""

    def __init__(self) -> None:
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._waiting: set[str] = set()
        self._lock = threading.Lock()

    def publish(self, job_id: str, kind: str = "ingest") -> None:
        with self._lock:
            if job_id in self._waiting:
                return
            self._waiting.add(job_id)
        self._queue.put(job_id)

    def get(self, timeout: float) -> str | None:
        """The next job id, or None after `timeout` seconds without one (or when woken)."""
        try:
            job_id = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if job_id is None:
            return None
        with self._lock:
            self._waiting.discard(job_id)
        return job_id

    def wake(self, waiters: int) -> None:
        """Make `waiters` blocked `get` calls return None now (used to stop idle workers)."""
        for _ in range(waiters):
            self._queue.put(None)

    def backlog(self) -> int:
        with self._lock:
            return len(self._waiting)

    def __len__(self) -> int:
        return self._queue.qsize()
