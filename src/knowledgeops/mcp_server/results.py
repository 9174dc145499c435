"""What the MCP tools answer: small snake_case models read off the SDK's (the API's camelCase
schemas), holding what an agent acts on and no more, so an answer costs few tokens. Each is a
JSON object: a tool returning one publishes its schema as the tool's `outputSchema` and sends it
as `structuredContent` (older MCP clients accept only objects there, never a bare list)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _FromSdk(BaseModel):
    """Built with `model_validate(sdk_model)`: the SDK model's attributes of the same names."""

    model_config = ConfigDict(from_attributes=True)


class Hit(_FromSdk):
    chunk_id: str
    document_id: str
    file_name: str
    page: int | None = Field(description="The chunk's first page (paged formats), else null.")
    page_end: int | None = Field(description="Its last page, else null.")
    section: str | None = Field(description="The headings it sits under, outermost first.")
    text: str
    score: float = Field(description="Higher is better; comparable within one answer only.")


class SearchAnswer(BaseModel):
    dataset_id: str
    dataset_name: str
    query: str
    mode: str
    hits: list[Hit] = Field(description="Best first.")


class Dataset(_FromSdk):
    id: str
    name: str
    description: str
    is_default: bool
    embedding_model: str
    document_count: int
    chunk_count: int
    created_at: datetime
    updated_at: datetime


class Datasets(BaseModel):
    datasets: list[Dataset]


class Document(_FromSdk):
    id: str
    dataset_id: str
    file_name: str
    file_type: str
    file_size: int
    status: str = Field(description="pending, processing, ready, failed or cancelled.")
    searchable: bool = Field(description="Whether search can find it now.")
    chunk_count: int
    page_count: int | None
    latest_job_id: str | None
    metadata: dict[str, Any]
    created_at: datetime
    updated_at: datetime


class Documents(BaseModel):
    documents: list[Document]
    total: int
    page: int
    limit: int
    has_more: bool = Field(description="True when a next page has more.")


class Job(_FromSdk):
    id: str
    kind: str = Field(description="ingest (an upload), reindex or reembed (a dataset's model).")
    status: str = Field(description="pending, running, retrying, completed, failed or cancelled.")
    stage: str
    dataset_id: str
    document_id: str | None
    file_name: str | None
    unit: str = Field(description="What the counts count: chunks, or a re-embed's documents.")
    processed_chunks: int
    total_chunks: int | None
    error: str | None = Field(description="Why it failed, for a person.")
    error_code: str | None
    error_category: str | None
    retryable: bool
    attempt: int
    max_attempts: int
    low_confidence_pages: list[int] = Field(
        description="Pages OCR could not read with confidence: left out of the index."
    )
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class Upload(BaseModel):
    job_id: str = Field(description="The ingest job: get_job tells how it goes.")
    document_id: str
    dataset_id: str
    file_name: str
    status: str
    duplicate: bool = Field(description="True when these bytes were already uploaded.")
