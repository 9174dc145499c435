"""What a job's change records: the columns each ending writes on the job, and the rows of the
`job_events` record (a finished stage's duration; each retry, failure, cancel and completion with
its error category), written in the transaction of the change they describe. `/metrics` counts
outcomes and stage times from that record."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from knowledgeops.jobs.model import Failure, Job
from knowledgeops.jobs.states import Stage

# --- the columns an ending writes ---------------------------------------------------------------


def completed_values(now: datetime) -> dict[str, Any]:
    return {
        "stage": Stage.DONE,
        "finished_at": now,
        "lease_owner": None,
        "error": None,
        "error_code": None,
        "error_category": None,
        "retryable": False,
    }


def cancel_values(now: datetime) -> dict[str, Any]:
    return {
        "finished_at": now,
        "lease_owner": None,
        "run_after": None,
        "error": "cancelled on request",
        "error_code": "cancelled",
        "error_category": None,
        "retryable": True,
    }


def failure_values(failure: Failure, now: datetime, retry_at: datetime | None) -> dict[str, Any]:
    """Retrying (when `retry_at` is given) or failed for good, with the failure's record."""
    return {
        "error": failure.message,
        "error_code": failure.code,
        "error_category": failure.category,
        "retryable": failure.retryable,
        "lease_owner": None,
        "run_after": retry_at,
        "finished_at": None if retry_at is not None else now,
    }


# --- the job_events rows ------------------------------------------------------------------------
def stage_event(
    job_id: str, stage: str, started: datetime | None, now: datetime
) -> list[dict[str, Any]]:
    """A finished stage's duration (nothing when its start is unknown)."""
    if started is None:
        return []
    seconds = max(0.0, (now - started).total_seconds())
    return [_event_row(job_id, "stage", now, stage=stage, seconds=seconds)]


def outcome_event(
    job: Job, kind: str, now: datetime, category: str | None = None, code: str | None = None
) -> dict[str, Any]:
    seconds = None if job.started_at is None else max(0.0, (now - job.started_at).total_seconds())
    return _event_row(
        job.id, kind, now, stage=job.stage.value, category=category, code=code, seconds=seconds
    )


def failure_event(
    job: Job, failure: Failure, now: datetime, retry_at: datetime | None
) -> dict[str, Any]:
    kind = "failed" if retry_at is None else "retry"
    return outcome_event(job, kind, now, failure.category, failure.code)


def _event_row(job_id: str, kind: str, at: datetime, **values: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"stage": None, "category": None, "code": None, "seconds": None}
    row.update(values)
    return {"job_id": job_id, "kind": kind, "at": at, **row}


# A part's own end is not an outcome users see: its parent's is. Its retries and stages count.
_PART_HIDDEN = frozenset({"completed", "failed", "cancelled"})


def counted(job: Job, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The event rows of `job` that the record keeps."""
    if job.parent_id is None:
        return list(rows)
    return [row for row in rows if row["kind"] not in _PART_HIDDEN]


def age(since: datetime | None, now: datetime) -> float:
    return 0.0 if since is None else max(0.0, (now - since).total_seconds())
