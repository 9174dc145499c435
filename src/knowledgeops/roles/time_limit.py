"""A scale-out job's time limit (`KOPS_JOB_TIME_LIMIT_S`): Celery's soft limit, made to hold
where its signal alone does not (docs/architecture.md: Failure handling).

Celery's prefork pool sends `SIGUSR1` to a child whose task is past its soft limit, and
billiard's handler raises `SoftTimeLimitExceeded` wherever the task is. Two places where that
goes wrong, both seen in the time-limit test:

- the signal lands where Python ignores exceptions (a weakref's callback: "Exception ignored
  in …") and is lost, and the job runs on: the same limit is checked at each progress report
  (`JobContext.deadline`), so it stops at its next one;
- the signal lands after the job's work is done, inside the transaction that records it
  completed: the connection is left mid-command, the pool's reset of it fails, and the attempt
  was retried as `database_unavailable` (a job that kept finishing at its limit would have used
  up its attempts for a reason that was not the real one). Once the handler has returned, the
  signal is noted in the log and ignored: the job's work finished within its limit, so it
  completes. The hard limit, `HARD_LIMIT_GRACE_S` later, still ends a commit that hangs.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType

from billiard.pool import SIG_SOFT_TIMEOUT, soft_timeout_sighandler
from celery.exceptions import SoftTimeLimitExceeded

from knowledgeops.errors import PermanentError
from knowledgeops.jobs.runner import Handler, JobContext

log = logging.getLogger(__name__)


class TimeLimit:
    """One worker process's time limit for its jobs, `limit_s` each. Call `started()` as each
    task starts and `wrap()` the job handler once."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self._finishing = False  # the handler has returned: the job's work is done
        self.ignored = 0  # soft-limit signals that arrived while a job's completion was written

    def over(self) -> PermanentError:
        return PermanentError(
            f"the job ran longer than {self.limit_s:g} s (KOPS_JOB_TIME_LIMIT_S) and was stopped",
            code="time_limit",
        )

    def started(self) -> None:
        """A task starts: the soft limit strikes again. The first call takes billiard's signal
        handler over (billiard installs it after Celery's process initialiser has run, so this
        cannot be done earlier); a process without it (a threads pool, a test) is left alone."""
        self._finishing = False
        if (
            SIG_SOFT_TIMEOUT is not None
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(SIG_SOFT_TIMEOUT) is soft_timeout_sighandler
        ):
            signal.signal(SIG_SOFT_TIMEOUT, self._on_soft_limit)

    def wrap(self, handler: Handler) -> Handler:
        def run(ctx: JobContext) -> None:
            ctx.deadline = time.monotonic() + self.limit_s
            ctx.past_deadline = self.over
            try:
                handler(ctx)
            except Exception as exc:
                if not caused_by_time_limit(exc):
                    raise
                raise self.over() from None
            self._finishing = True  # until the next task starts

        return run

    def _on_soft_limit(self, signum: int, frame: FrameType | None) -> None:
        if self._finishing:
            self.ignored += 1
            log.warning(
                "the job's soft time limit (%g s) passed while its completion was being "
                "recorded: its work is done, so it completes",
                self.limit_s,
            )
            return
        raise SoftTimeLimitExceeded()


def caused_by_time_limit(exc: BaseException) -> bool:
    """The soft limit fires wherever the job is; a parser may have wrapped it (as a corrupt
    file, say), so the whole chain of causes is looked at."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, SoftTimeLimitExceeded):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False
