"""What the use cases return: plain records the API and the CLI both present."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: Sequence[T]
    total: int
    page: int
    limit: int

    @property
    def has_more(self) -> bool:
        return self.page * self.limit < self.total


@dataclass(frozen=True, slots=True)
class DatasetView:
    id: str
    name: str
    description: str
    embedding_model: str
    chunk_size: int
    chunk_overlap: int
    is_default: bool
    document_count: int
    chunk_count: int
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class DocumentView:
    id: str
    dataset_id: str
    file_name: str
    file_size: int
    content_type: str
    sha256: str
    status: str
    searchable: bool
    chunk_count: int
    page_count: int | None
    active_generation: int | None
    latest_job_id: str | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class JobView:
    id: str
    kind: str
    status: str
    stage: str
    file_name: str
    file_size: int
    total_chunks: int | None
    processed_chunks: int
    error: str | None
    error_code: str | None
    error_category: str | None
    retryable: bool
    retries: int
    attempt: int
    max_attempts: int
    run_after: datetime | None
    heartbeat_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    created_at: datetime
    updated_at: datetime
    document_id: str
    dataset_id: str

    @classmethod
    def from_row(cls, row: Any) -> JobView:
        m = row._mapping
        return cls(
            id=m["id"],
            kind=m["kind"],
            status=m["status"],
            stage=m["stage"],
            file_name=m["file_name"],
            file_size=m["file_size"],
            total_chunks=m["total_chunks"],
            processed_chunks=m["processed_chunks"],
            error=m["error"],
            error_code=m["error_code"],
            error_category=m["error_category"],
            retryable=m["retryable"],
            retries=max(m["attempt"] - 1, 0),
            attempt=m["attempt"],
            max_attempts=m["max_attempts"],
            run_after=m["run_after"],
            heartbeat_at=m["heartbeat_at"],
            started_at=m["started_at"],
            finished_at=m["finished_at"],
            created_at=m["created_at"],
            updated_at=m["updated_at"],
            document_id=m["document_id"],
            dataset_id=m["dataset_id"],
        )


@dataclass(frozen=True, slots=True)
class Accepted:
    """The answer to an upload: which job and document; whether this request created them, or
    repeats an earlier request with the same Idempotency-Key (which gets the first answer again)."""

    job: JobView
    document_id: str
    created: bool
    replayed: bool = False

    @property
    def duplicate(self) -> bool:
        """The same bytes were uploaded before, by another request."""
        return not (self.created or self.replayed)


@dataclass(frozen=True, slots=True)
class SearchHit:
    chunk_id: str
    document_id: str
    file_name: str
    ordinal: int
    text: str
    score: float
    page_start: int | None
    page_end: int | None
    section: str | None
