"""Dispatch: how a job id reaches a worker. The relay publishes; a broker delivers at least once.

The message is only the job id: a worker reloads everything else from the database, and no
credential ever travels in a message (docs/architecture.md: Configuration and secrets).
"""

from __future__ import annotations

from typing import Protocol

from knowledgeops.errors import PublishError

__all__ = ["Dispatcher", "PublishError"]


class Dispatcher(Protocol):
    def publish(self, job_id: str, kind: str = "ingest") -> None:
        """Hand `job_id` to the broker, or raise PublishError. `kind` is the job's: a
        dispatcher may send each kind to its own queue (jobs/lanes.py)."""
        ...

    def backlog(self) -> int | None:
        """Messages waiting in the broker for a worker, or None when it cannot tell now."""
        ...
