from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from knowledgeops.errors import PermanentError, TransientError, UserActionRequired
from knowledgeops.jobs.retry import RetryPolicy, backoff_delay

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_backoff_grows_exponentially_within_full_jitter() -> None:
    rand = random.Random(1)
    for attempt, ceiling in [(1, 2.0), (2, 4.0), (3, 8.0), (4, 16.0)]:
        delays = [backoff_delay(attempt, base=2.0, cap=300.0, rand=rand) for _ in range(500)]
        assert all(0.0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling * 0.9  # the whole range is used: full jitter
        assert min(delays) < ceiling * 0.1


def test_backoff_is_capped() -> None:
    rand = random.Random(2)
    delays = [backoff_delay(40, base=2.0, cap=30.0, rand=rand) for _ in range(200)]
    assert max(delays) <= 30.0
    assert max(delays) > 25.0


def test_huge_attempt_numbers_do_not_overflow() -> None:
    assert 0 <= backoff_delay(10_000, base=1.0, cap=5.0) <= 5.0


def test_backoff_is_deterministic_for_a_seeded_random() -> None:
    a = [backoff_delay(3, base=1.0, cap=60.0, rand=random.Random(7)) for _ in range(3)]
    assert a[0] == a[1] == a[2]


def test_attempts_count_from_one() -> None:
    with pytest.raises(ValueError, match="from 1"):
        backoff_delay(0, base=1.0, cap=2.0)


def test_transient_errors_retry_until_attempts_are_spent() -> None:
    policy = RetryPolicy(base_s=1.0, cap_s=10.0)
    error = TransientError("timeout")
    first = policy.next_run_after(error, attempt=1, max_attempts=3, now=NOW)
    second = policy.next_run_after(error, attempt=2, max_attempts=3, now=NOW)
    assert first is not None
    assert NOW <= first <= NOW + timedelta(seconds=1)
    assert second is not None
    assert NOW <= second <= NOW + timedelta(seconds=2)
    assert policy.next_run_after(error, attempt=3, max_attempts=3, now=NOW) is None


@pytest.mark.parametrize("error", [PermanentError("corrupt"), UserActionRequired("encrypted")])
def test_other_categories_never_retry(error: Exception) -> None:
    policy = RetryPolicy()
    assert policy.next_run_after(error, attempt=1, max_attempts=5, now=NOW) is None  # type: ignore[arg-type]


def test_retry_after_from_the_provider_is_honoured_within_the_cap() -> None:
    policy = RetryPolicy(base_s=1.0, cap_s=60.0)
    slow = TransientError("429", retry_after_s=30)
    at = policy.next_run_after(slow, attempt=1, max_attempts=3, now=NOW)
    assert at is not None
    assert at >= NOW + timedelta(seconds=30)
    absurd = TransientError("429", retry_after_s=86_400)
    at = policy.next_run_after(absurd, attempt=1, max_attempts=3, now=NOW)
    assert at == NOW + timedelta(seconds=60)
