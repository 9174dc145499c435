"""What the use cases return: plain records the API and the CLI both present."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, Generic, TypeVar

from knowledgeops.ingest.ocr_record import OcrSummary

T = TypeVar("T")
V = TypeVar("V")


def from_row(view: type[V], row: Any, **computed: Any) -> V:
    """A view filled from a result row field by field, by name; `computed` holds the fields the
    row has no column for."""
    m = row._mapping
    names = [f.name for f in fields(view) if f.name not in computed]  # type: ignore[arg-type]
    return view(**{name: m[name] for name in names}, **computed)


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
    ocr_languages: list[str]
    is_default: bool
    document_count: int
    chunk_count: int
    # searchable documents by the model that embedded them: one model, but while a re-embed
    # is on its way (or after one was cancelled)
    document_models: dict[str, int]
    reembed_job_id: str | None  # the dataset's latest re-embed job
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class DocumentView:
    id: str
    dataset_id: str
    file_name: str
    file_size: int
    content_type: str
    file_type: str  # what a search filter's fileTypes calls it: pdf, docx, html, md, txt
    sha256: str
    status: str
    searchable: bool
    chunk_count: int
    page_count: int | None
    active_generation: int | None
    latest_job_id: str | None
    metadata: dict[str, Any]
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class ChunkView:
    """A chunk of a document's searchable generation, as it is indexed."""

    id: str
    ordinal: int
    text: str
    token_count: int
    page_start: int | None
    page_end: int | None
    section: str | None


@dataclass(frozen=True, slots=True)
class JobView:
    id: str
    kind: str
    status: str
    stage: str
    file_name: str | None  # None: a job on a whole dataset (a re-embed)
    file_size: int | None
    unit: str  # what total_chunks and processed_chunks count: chunks, or documents (re-embed)
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
    document_id: str | None
    dataset_id: str
    ocr_pages_done: int | None  # pages OCR has read (None: the document needs no OCR)
    ocr_pages_total: int | None  # … of the pages without a text layer
    low_confidence_pages: list[int]  # OCR'd too unsurely: flagged, not indexed
    ocr_mean_confidence: float | None  # of the pages OCR read text on

    @classmethod
    def from_row(cls, row: Any, ocr: OcrSummary | None = None) -> JobView:
        """A job row joined with its document's name and size (none for a dataset's job), with
        what OCR read for it (ingest/ocr_record.py)."""
        m = row._mapping
        unit = "chunks" if m["document_id"] is not None else "documents"
        return from_row(
            cls,
            row,
            retries=max(m["attempt"] - 1, 0),
            unit=unit,
            ocr_pages_done=None if ocr is None else ocr.pages_done,
            ocr_pages_total=None if ocr is None else ocr.pages_total,
            low_confidence_pages=[] if ocr is None else ocr.low_confidence_pages,
            ocr_mean_confidence=None if ocr is None else ocr.mean_confidence,
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
