"""The columns each ending of a job writes, shared by both stores (the SQL store writes an enum's
value)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from knowledgeops.jobs.model import Failure
from knowledgeops.jobs.states import Stage


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
