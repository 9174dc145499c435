"""The job state machine (docs/architecture.md: The job state machine): every status, every stage,
and every allowed transition.

    pending ──claim──▶ running ──complete──▶ completed
       │                 │ retry_later (transient, attempts left; worker lost) ──▶ retrying
       │                 │ fail (permanent, user action, attempts spent) ──▶ failed
       │             retrying ──claim (run_after due)──▶ running
       │  pending | retrying | running ──cancel──▶ cancelled
       └──── requeue (manual retry) ◀── failed | cancelled

Stores never write a status that this table does not give them.
"""

from __future__ import annotations

from enum import StrEnum

from knowledgeops.errors import InvalidTransition


class JobStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    RETRYING = "retrying"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Stage(StrEnum):
    QUEUED = "queued"
    PARSING = "parsing"
    OCR = "ocr"  # reading scanned pages (a document without a text layer)
    CHUNKING = "chunking"
    EMBEDDING = "embedding"
    INDEXING = "indexing"
    DONE = "done"


class Event(StrEnum):
    CLAIM = "claim"
    COMPLETE = "complete"
    RETRY_LATER = "retry_later"
    FAIL = "fail"
    CANCEL = "cancel"
    REQUEUE = "requeue"


S = JobStatus
TRANSITIONS: dict[tuple[JobStatus, Event], JobStatus] = {
    (S.PENDING, Event.CLAIM): S.RUNNING,
    (S.RETRYING, Event.CLAIM): S.RUNNING,
    (S.RUNNING, Event.COMPLETE): S.COMPLETED,
    (S.RUNNING, Event.RETRY_LATER): S.RETRYING,
    (S.RUNNING, Event.FAIL): S.FAILED,
    (S.PENDING, Event.CANCEL): S.CANCELLED,
    (S.RETRYING, Event.CANCEL): S.CANCELLED,
    (S.RUNNING, Event.CANCEL): S.CANCELLED,
    (S.FAILED, Event.REQUEUE): S.PENDING,
    (S.CANCELLED, Event.REQUEUE): S.PENDING,
}

TERMINAL = frozenset({S.COMPLETED, S.FAILED, S.CANCELLED})
OPEN = frozenset({S.PENDING, S.RUNNING, S.RETRYING})


def sources(event: Event) -> frozenset[JobStatus]:
    """The statuses from which `event` is allowed."""
    return frozenset(status for status, ev in TRANSITIONS if ev is event)


def target(status: JobStatus | str, event: Event) -> JobStatus:
    """The status `event` leads to from `status`, or InvalidTransition."""
    try:
        return TRANSITIONS[(JobStatus(status), event)]
    except (KeyError, ValueError):
        raise InvalidTransition(f"a {status} job cannot {_VERBS[event]}") from None


_VERBS = {
    Event.CLAIM: "be started",
    Event.COMPLETE: "be completed",
    Event.RETRY_LATER: "be scheduled for retry",
    Event.FAIL: "be failed",
    Event.CANCEL: "be cancelled",
    Event.REQUEUE: "be retried",
}
