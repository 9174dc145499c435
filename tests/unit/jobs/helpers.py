"""A controllable clock and small handlers for jobs-core tests (no document pipeline here)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from knowledgeops.jobs.heartbeat import Heartbeat
from knowledgeops.jobs.memory_store import MemoryJobStore
from knowledgeops.jobs.model import Job, NewJob
from knowledgeops.jobs.retry import RetryPolicy
from knowledgeops.jobs.runner import Handler, JobContext, Runner
from knowledgeops.jobs.states import Stage


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += timedelta(seconds=seconds)


def add_job(store: MemoryJobStore, clock: Clock, max_attempts: int = 3) -> Job:
    return store.add(
        NewJob(str(uuid.uuid4()), str(uuid.uuid4()), "ds", 1, max_attempts), now=clock()
    )


def make_runner(store: MemoryJobStore, handler: Handler, clock: Clock, name: str = "w") -> Runner:
    return Runner(
        store,
        handler,
        policy=RetryPolicy(base_s=1.0, cap_s=10.0),
        heartbeat=Heartbeat(store, 60.0, clock),
        clock=clock,
        owner_prefix=name,
    )


def counting_handler(total: int = 10, step: int = 5) -> Callable[[JobContext], None]:
    def handle(ctx: JobContext) -> None:
        ctx.report(stage=Stage.PARSING)
        ctx.report(stage=Stage.EMBEDDING, total=total, processed=0)
        for done in range(step, total + 1, step):
            ctx.report(processed=done)

    return handle


def failing_handler(errors: list[Exception]) -> Callable[[JobContext], None]:
    """Raises the given errors in turn, one per attempt, then succeeds."""

    def handle(ctx: JobContext) -> None:
        if errors:
            raise errors.pop(0)
        counting_handler()(ctx)

    return handle
