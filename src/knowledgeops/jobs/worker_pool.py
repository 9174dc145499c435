"""Worker threads of the embedded default: each takes a job id from the in-process queue and
runs it through the shared `Runner`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from knowledgeops.jobs.inprocess import InProcessQueue
from knowledgeops.jobs.priority import lower_priority
from knowledgeops.jobs.runner import Runner

log = logging.getLogger(__name__)

POLL_S = 1.0  # s: how long an idle worker waits on the queue before checking again


class WorkerPool:
    def __init__(
        self,
        queue: InProcessQueue,
        runner: Runner,
        size: int,
        *,
        nice: int = 0,
        on_start: Callable[[], None] | None = None,
    ) -> None:
        self.queue = queue
        self.runner = runner
        self.size = size
        self.nice = nice  # lower CPU priority than the API threads of this process
        self.on_start = on_start  # run in each worker thread before its first job
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for n in range(self.size):
            thread = threading.Thread(target=self._work, name=f"kops-worker-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop taking jobs; running jobs give themselves back at their next progress write."""
        self.runner.stopping.set()
        self.queue.wake(len(self._threads))
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def alive(self) -> int:
        return sum(thread.is_alive() for thread in self._threads)

    def _work(self) -> None:
        lower_priority(self.nice)  # the parser child started from this thread inherits it
        if self.on_start is not None:
            self.on_start()
        while not self.runner.stopping.is_set():
            job_id = self.queue.get(timeout=POLL_S)
            if job_id is None:
                continue
            try:
                self.runner.run_job(job_id)
            except Exception:  # run_job classifies job errors; this is the database failing
                log.exception("job %s: could not be run; the relay will offer it again", job_id)
