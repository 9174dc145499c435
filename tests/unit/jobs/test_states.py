from __future__ import annotations

import pytest

from knowledgeops.jobs.states import (
    OPEN,
    TERMINAL,
    TRANSITIONS,
    Event,
    InvalidTransition,
    JobStatus,
    sources,
    target,
)

S = JobStatus


def test_the_happy_path() -> None:
    assert target(S.PENDING, Event.CLAIM) is S.RUNNING
    assert target(S.RUNNING, Event.COMPLETE) is S.COMPLETED


def test_retry_loop() -> None:
    assert target(S.RUNNING, Event.RETRY_LATER) is S.RETRYING
    assert target(S.RETRYING, Event.CLAIM) is S.RUNNING


@pytest.mark.parametrize("status", [S.PENDING, S.RETRYING, S.RUNNING])
def test_open_jobs_can_be_cancelled(status: JobStatus) -> None:
    assert target(status, Event.CANCEL) is S.CANCELLED


@pytest.mark.parametrize("status", [S.FAILED, S.CANCELLED])
def test_failed_and_cancelled_jobs_can_be_retried_by_hand(status: JobStatus) -> None:
    assert target(status, Event.REQUEUE) is S.PENDING


def test_completed_is_final() -> None:
    for event in Event:
        with pytest.raises(InvalidTransition):
            target(S.COMPLETED, event)


def test_no_transition_outside_the_table() -> None:
    allowed = set(TRANSITIONS)
    for status in JobStatus:
        for event in Event:
            if (status, event) in allowed:
                continue
            with pytest.raises(InvalidTransition) as raised:
                target(status, event)
            assert str(status) in str(raised.value)


def test_unknown_status_is_refused() -> None:
    with pytest.raises(InvalidTransition):
        target("paused", Event.CLAIM)


def test_sources() -> None:
    assert sources(Event.CLAIM) == {S.PENDING, S.RETRYING}
    assert sources(Event.CANCEL) == OPEN
    assert sources(Event.REQUEUE) == {S.FAILED, S.CANCELLED}
    assert set(JobStatus) == OPEN | TERMINAL
    assert not OPEN & TERMINAL
