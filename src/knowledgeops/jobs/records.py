"""What a job's change records: the columns each ending writes on the job, and the rows of the
`job_events` record (a finished stage's duration; each retry, failure, cancel and completion with
its error category; and, kind `change`, the job as it stands after each change a user can see),
written in the transaction of the change they describe. `/metrics` counts outcomes and stage
times from that record; the event streams follow its `change` rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from knowledgeops.jobs.model import Change, Failure, Job
from knowledgeops.jobs.states import Stage

OUTCOMES = frozenset({"completed", "retry", "failed", "cancelled"})  # the kinds /metrics counts
CHANGE = "change"

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


def change_event(job: Job, now: datetime) -> dict[str, Any]:
    """The job as it stands after a change, as the event streams show it."""
    return _event_row(
        job.id,
        CHANGE,
        now,
        stage=job.stage.value,
        category=job.error_category,
        code=job.error_code,
        dataset_id=job.dataset_id,
        document_id=job.document_id,
        status=job.status.value,
        total=job.total_chunks,
        processed=job.processed_chunks,
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        error=job.error,
        retryable=job.retryable,
    )


def shown(row: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """What a `change` row shows, to tell a change from a write that changed nothing seen."""
    if row is None:
        return None
    return tuple(row[name] for name in _SHOWN)


_SHOWN = ("status", "stage", "total", "processed", "attempt", "max_attempts", "code", "error")
_COLUMNS = (
    "stage",
    "category",
    "code",
    "seconds",
    "dataset_id",
    "document_id",
    "status",
    "total",
    "processed",
    "attempt",
    "max_attempts",
    "error",
    "retryable",
)


def _event_row(job_id: str, kind: str, at: datetime, **values: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(_COLUMNS)  # every row has every column (one INSERT)
    row.update(values)
    return {"job_id": job_id, "kind": kind, "at": at, **row}


def change_of(row: Any) -> Change:
    """A `change` row (a mapping or a SQL row with the table's columns) as a `Change`."""
    m: Mapping[str, Any] = row if isinstance(row, dict) else row._mapping
    return Change(
        id=m["id"],
        at=m["at"],
        job_id=m["job_id"],
        dataset_id=m["dataset_id"] or "",
        document_id=m["document_id"],
        status=m["status"] or "",
        stage=m["stage"] or "",
        total=m["total"],
        processed=m["processed"] or 0,
        attempt=m["attempt"] or 0,
        max_attempts=m["max_attempts"] or 0,
        error=m["error"],
        error_code=m["code"],
        error_category=m["category"],
        retryable=bool(m["retryable"]),
    )


# A part's own end is not an outcome users see: its parent's is. Its retries and stages count.
_PART_HIDDEN = frozenset({"completed", "failed", "cancelled"})


def counted(job: Job, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The event rows of `job` that the record keeps."""
    if job.parent_id is None:
        return list(rows)
    return [row for row in rows if row["kind"] not in _PART_HIDDEN]


def age(since: datetime | None, now: datetime) -> float:
    return 0.0 if since is None else max(0.0, (now - since).total_seconds())
