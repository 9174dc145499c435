"""The Celery side of `kops worker`: the one task, and a `WorkerRuntime` per worker process.

The task only calls the shared `run_job(job_id)`; everything it needs is reloaded from the
database. Each prefork child builds its own runtime after the fork (database pools, the heartbeat
thread and the model must not be shared across a fork) and gives back the leases it still holds
when it shuts down.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery import Celery
from celery.exceptions import Reject, SoftTimeLimitExceeded
from celery.signals import worker_process_init, worker_process_shutdown

from knowledgeops.errors import PermanentError
from knowledgeops.jobs.celery_dispatch import TASK_NAME, make_celery
from knowledgeops.jobs.runner import Handler, JobContext
from knowledgeops.runtime import WorkerRuntime
from knowledgeops.settings import Settings

log = logging.getLogger(__name__)

REQUEUE_PAUSE_S = 2.0  # s: before a message whose job could not be run goes back


class _Process:
    """What this worker process holds: the settings (set before the fork) and its runtime."""

    settings: Settings | None = None
    runtime: WorkerRuntime | None = None
    lock = threading.Lock()  # the threads pool may run the first tasks at once


def _time_limited(limit_s: float) -> Any:
    def wrap(handler: Handler) -> Handler:
        def run(ctx: JobContext) -> None:
            try:
                handler(ctx)
            except Exception as exc:
                if not _caused_by_time_limit(exc):
                    raise
                raise PermanentError(
                    f"the job ran longer than {limit_s:g} s (KOPS_JOB_TIME_LIMIT_S) "
                    "and was stopped",
                    code="time_limit",
                ) from None

        return run

    return wrap


def _caused_by_time_limit(exc: BaseException) -> bool:
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


def runtime() -> WorkerRuntime:
    """This process's runtime, built on first use (after the fork)."""
    with _Process.lock:
        if _Process.runtime is None:
            settings = _Process.settings
            if settings is None:
                raise RuntimeError("create_worker_app() was not called in this process")
            limited = _time_limited(settings.job_time_limit_s)
            built = WorkerRuntime(settings, handler_wrapper=limited)
            built.start()
            _Process.runtime = built
        return _Process.runtime


def _on_process_init(**_: Any) -> None:
    runtime()


def _on_process_shutdown(**_: Any) -> None:
    with _Process.lock:
        if _Process.runtime is not None:
            _Process.runtime.stop()
            _Process.runtime = None


def create_worker_app(settings: Settings) -> Celery:
    _Process.settings = settings
    assert settings.broker_url is not None
    app = make_celery(
        settings.broker_url.get_secret_value(),
        job_time_limit_s=settings.job_time_limit_s,
        visibility_timeout_s=settings.visibility_timeout_s,
    )

    @app.task(name=TASK_NAME, ignore_result=True)  # type: ignore[untyped-decorator]
    def run_job(job_id: str) -> str:
        try:
            return runtime().runner.run_job(job_id).value
        except Exception as exc:  # the database failed before the job's fate was recorded
            log.warning(
                "job %s: could not be run (%s: %s); its message goes back to the broker",
                job_id,
                type(exc).__name__,
                exc,
            )
            time.sleep(REQUEUE_PAUSE_S)  # do not spin on a database that is down
            raise Reject(requeue=True) from exc

    worker_process_init.connect(_on_process_init, weak=False)
    worker_process_shutdown.connect(_on_process_shutdown, weak=False)
    return app
