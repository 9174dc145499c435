"""Retry policy: exponential backoff with full jitter, bounded by attempts (docs/architecture.md:
Failure classes)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from knowledgeops.errors import ErrorCategory, JobError


def backoff_delay(
    attempt: int, *, base: float, cap: float, rand: random.Random | None = None
) -> float:
    """Seconds to wait before attempt `attempt + 1`: uniform in [0, min(cap, base·2^(attempt-1))].

    Full jitter (AWS architecture blog, "Exponential Backoff And Jitter") spreads retries of jobs
    that failed together, so a provider that recovers is not hit by all of them at once.
    """
    if attempt < 1:
        raise ValueError("attempt counts from 1")
    ceiling = min(cap, base * 2 ** min(attempt - 1, 62))
    return (rand or random).uniform(0, ceiling)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    base_s: float = 2.0  # s
    cap_s: float = 300.0  # s

    def next_run_after(
        self,
        error: JobError,
        *,
        attempt: int,
        max_attempts: int,
        now: datetime,
        rand: random.Random | None = None,
    ) -> datetime | None:
        """When to try again, or None when the job must fail now."""
        if error.category is not ErrorCategory.TRANSIENT or attempt >= max_attempts:
            return None
        delay = backoff_delay(attempt, base=self.base_s, cap=self.cap_s, rand=rand)
        if error.retry_after_s is not None:  # the provider said how long; never retry sooner
            delay = max(delay, min(error.retry_after_s, self.cap_s))
        return now + timedelta(seconds=delay)
