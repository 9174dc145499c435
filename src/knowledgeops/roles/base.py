"""What every process role shares: its settings, its clock, its database, start and stop, and
the log format of every `kops` process."""

from __future__ import annotations

import logging
import sys
from abc import ABC, abstractmethod

from knowledgeops.clock import Clock, utcnow
from knowledgeops.db.engine import Database
from knowledgeops.settings import Settings

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    """One log format for every process (stderr); Alembic's start-up chatter left out."""
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=sys.stderr, force=True)
    logging.getLogger("alembic").setLevel(logging.WARNING)


class Role(ABC):
    """One process role, built from `settings`; `start()` then `stop()`."""

    def __init__(self, settings: Settings, *, clock: Clock = utcnow) -> None:
        self.settings = settings
        self.clock = clock
        self.db = Database(settings.resolved_database_url)

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    def database_check(self) -> str:
        """ "ok", or "unavailable: <why>" (for /readyz)."""
        try:
            self.db.ping()
        except Exception as exc:
            return f"unavailable: {type(exc).__name__}"
        return "ok"
