"""`kops worker`: Celery worker processes that run jobs, one `WorkerRole` in each.

The one task only calls the shared `run_job(job_id)`; everything it needs is reloaded from the
database. Each prefork child builds its own role after the fork (database pools, the heartbeat
thread and the model must not be shared across a fork) and gives back the leases it still holds
when it shuts down.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from celery import Celery
from celery.exceptions import Reject
from celery.signals import worker_process_init, worker_process_shutdown

from knowledgeops.clock import Clock, utcnow
from knowledgeops.ingest.embedders.base import Embedder
from knowledgeops.jobs.celery_dispatch import TASK_NAME, make_celery
from knowledgeops.jobs.heartbeat import Heartbeat
from knowledgeops.jobs.runner import Handler, Runner
from knowledgeops.roles import wiring
from knowledgeops.roles.base import DataRole
from knowledgeops.roles.time_limit import TimeLimit
from knowledgeops.settings import Settings

log = logging.getLogger(__name__)

REQUEUE_PAUSE_S = 2.0  # s: before a message whose job could not be run goes back


class WorkerRole(DataRole):
    """One Celery worker process: the pipeline behind the shared `Runner`, with its heartbeat."""

    def __init__(
        self,
        settings: Settings,
        *,
        embedder: Embedder | None = None,
        handler_wrapper: Callable[[Handler], Handler] | None = None,
        clock: Clock = utcnow,
    ) -> None:
        super().__init__(settings, embedder=embedder, clock=clock)
        self.heartbeat = Heartbeat(self.store, settings.heartbeat_interval_s, clock)
        self.pipeline = wiring.make_pipeline(settings, self.db, self.blobs, self.index, self.models)
        handler = wiring.make_handler(settings, self.db, self.pipeline, clock)
        if handler_wrapper is not None:
            handler = handler_wrapper(handler)
        self.runner = Runner(
            self.store,
            handler,
            policy=wiring.retry_policy(settings),
            heartbeat=self.heartbeat,
            clock=clock,
            owner_prefix=f"worker-{os.uname().nodename}-{os.getpid()}",
        )

    def start(self) -> None:
        self.heartbeat.start()
        wiring.preload(self.embedder)
        self.pipeline.parsing.prestart()  # Celery runs this process's jobs on this thread

    def stop(self) -> None:
        """Stop taking jobs; leases still held go back to the queue without using an attempt."""
        self.runner.stopping.set()
        self.heartbeat.release_held()
        self.heartbeat.stop()
        self.pipeline.parsing.close()
        self.models.close()
        self.db.dispose()


class _Process:
    """What this worker process holds: the settings (set before the fork) and its role."""

    settings: Settings | None = None
    role: WorkerRole | None = None
    time_limit: TimeLimit | None = None
    lock = threading.Lock()  # the threads pool may run the first tasks at once


def role() -> WorkerRole:
    """This process's role, built on first use (after the fork)."""
    with _Process.lock:
        if _Process.role is None:
            settings = _Process.settings
            if settings is None:
                raise RuntimeError("create_worker_app() was not called in this process")
            _Process.time_limit = TimeLimit(settings.job_time_limit_s)
            built = WorkerRole(settings, handler_wrapper=_Process.time_limit.wrap)
            built.start()
            _Process.role = built
        return _Process.role


def _on_process_init(**_: Any) -> None:
    role()


def _on_process_shutdown(**_: Any) -> None:
    with _Process.lock:
        if _Process.role is not None:
            _Process.role.stop()
            _Process.role = None


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
            worker = role()
            if _Process.time_limit is not None:
                _Process.time_limit.started()
            return worker.runner.run_job(job_id).value
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
