"""The clock every layer reads: aware UTC datetimes, and the type of a clock a component is given
(tests hand in a fake one to move time on their own)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    return datetime.now(UTC)
