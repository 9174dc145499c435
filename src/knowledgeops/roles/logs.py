"""One log format for every `kops` process (stderr), set once at its start."""

from __future__ import annotations

import logging
import sys

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    """The format and level of every log line; Alembic's start-up chatter left out."""
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=sys.stderr, force=True)
    logging.getLogger("alembic").setLevel(logging.WARNING)
