"""The API's request and response bodies, in camelCase (the original API's contract:
docs/architecture.md, The API contract). Plain pydantic, importing nothing else of the package:
the API validates and documents with them, and the SDK (`knowledgeops.client`) returns them.

Named for their direction: `…Create`, `…Update`, `…Public`, `…sPublic`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints
from pydantic.alias_generators import to_camel

T = TypeVar("T")

UUID_PATTERN = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"


def _not_a_bool(value: Any) -> Any:
    if isinstance(value, bool):  # pydantic would take `false` for 0
        raise ValueError("a number is expected, not true or false")
    return value


Count = Annotated[int, BeforeValidator(_not_a_bool)]
"""An integer in a request body (52 and 52.0 are; `true` is not)."""


class Camel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, from_attributes=True)


class ErrorPublic(Camel):
    error: str = Field(description="What went wrong, for a person.")
    code: str = Field(description="What went wrong, for a program.")
    fields: list[dict[str, str]] | None = None


class UploadAccepted(Camel):
    job_id: str
    document_id: str
    status: str
    duplicate: bool = Field(False, description="True when these bytes were already uploaded.")


class JobPublic(Camel):
    id: str
    kind: str = Field(
        description="ingest (an upload), reindex, or reembed (a dataset's new model: "
        "PATCH /datasets/{id})"
    )
    status: str
    stage: str
    file_name: str | None = Field(description="The document's; null for a dataset's job.")
    file_size: int | None
    unit: Literal["chunks", "documents"] = Field(
        description="What totalChunks and processedChunks count: a document's chunks, or for "
        "a re-embed the dataset's documents."
    )
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
    document_id: str | None = Field(description="Null for a job on a whole dataset (reembed).")
    dataset_id: str
    ocr_pages_done: int | None = Field(
        description="Pages OCR has read, while the stage is ocr and after; null when the "
        "document needs no OCR (every page has a text layer)."
    )
    ocr_pages_total: int | None = Field(
        description="The pages OCR reads: those without a text layer (all of an image's)."
    )
    low_confidence_pages: list[int] = Field(
        description="Pages OCR read with a confidence below KOPS_OCR_MIN_CONFIDENCE: left out "
        "of the index rather than indexed as garbage; rescan them for their text."
    )
    ocr_mean_confidence: float | None = Field(
        description="The mean OCR confidence (0–1) of the pages OCR read text on; each page's "
        "is recorded with the job."
    )


class ChunkPublic(Camel):
    id: str = Field(description="Stable: the same chunk of the same generation keeps its id.")
    ordinal: int = Field(description="Its place in the document, from 0.")
    text: str
    token_count: int
    page_start: int | None = Field(description="The first page it comes from (paged formats).")
    page_end: int | None
    section: str | None = Field(description="The headings it sits under, outermost first.")


class JobChangePublic(Camel):
    """One event of a job stream (`event: job`): the job as it stood after a change."""

    event_id: int = Field(
        description="Orders the changes; the SSE `id:` of the event, sent back as "
        "Last-Event-ID to resume after it."
    )
    job_id: str
    dataset_id: str
    document_id: str | None
    status: str
    stage: str
    unit: Literal["chunks", "documents"]
    total_chunks: int | None
    processed_chunks: int
    attempt: int
    max_attempts: int
    error: str | None
    error_code: str | None
    error_category: str | None
    retryable: bool
    ocr_pages_done: int | None = Field(
        None, description="While the stage is ocr: pages read (as of when the event was sent)."
    )
    ocr_pages_total: int | None = None
    at: datetime = Field(description="When the change was made.")


OcrLanguages = Annotated[
    list[Annotated[str, StringConstraints(pattern=r"^[a-z]{2}(-[a-z]{2})?$")]],
    Field(min_length=1, max_length=8),
]


class DatasetCreate(Camel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    description: str = Field("", max_length=10_000)
    chunk_size: Count | None = Field(
        None, ge=16, le=8190, description="Tokens per chunk (at most what the model reads)."
    )
    chunk_overlap: Count | None = Field(None, ge=0, le=4094, description="Tokens shared.")
    ocr_languages: OcrLanguages | None = Field(
        None,
        description="What OCR reads scans and images in, ISO 639-1 codes (default en, zh: the "
        "bundled engine's; others need Tesseract's data for them, and a dataset asking for one "
        "this server cannot read is refused with the list of those it can).",
    )
    embedding_model: str | None = Field(
        None,
        max_length=200,
        description="The model that embeds the dataset's chunks and queries, one of GET /models "
        "(default: the deployment's). PATCH changes it.",
    )


class DatasetUpdate(Camel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, min_length=1, max_length=200)
    description: str | None = Field(None, max_length=10_000)
    chunk_size: Count | None = Field(None, ge=16, le=8190)
    chunk_overlap: Count | None = Field(None, ge=0, le=4094)
    ocr_languages: OcrLanguages | None = Field(
        None, description="Applies to documents ingested or reindexed from now on."
    )
    embedding_model: str | None = Field(
        None,
        max_length=200,
        description="A new model, one of GET /models: uploads from now on are embedded by it, "
        "and a re-embed job (reembedJobId) takes the searchable documents to it while search "
        "goes on answering from each document's current vectors. 409 while a job of the "
        "dataset is pending or running.",
    )


class ModelPublic(Camel):
    id: str
    dimension: int
    max_tokens: int = Field(description="Tokens the model reads; a chunk holds 2 fewer.")
    summary: str
    is_default: bool


class DatasetPublic(Camel):
    id: str
    name: str
    description: str
    embedding_model: str
    chunk_size: int
    chunk_overlap: int
    ocr_languages: list[str] = Field(
        description="The languages OCR reads the dataset's scans in (ISO 639-1 codes)."
    )
    is_default: bool
    document_count: int
    chunk_count: int
    document_models: dict[str, int] = Field(
        description="Searchable documents by the model that embedded them: one model, but "
        "while a re-embed is on its way."
    )
    reembed_job_id: str | None = Field(description="The dataset's latest re-embed job.")
    created_at: datetime
    updated_at: datetime


class DocumentPublic(Camel):
    id: str
    dataset_id: str
    file_name: str
    file_size: int
    content_type: str
    file_type: str = Field(
        description="pdf, docx, pptx, xlsx, csv, epub, eml, mbox, html, md, txt, png, jpg, tiff, "
        "webp or bmp (what filter.fileTypes says)"
    )
    sha256: str
    status: str
    searchable: bool
    chunk_count: int
    page_count: int | None
    active_generation: int | None
    latest_job_id: str | None
    metadata: dict[str, Any] = Field(description="What the upload's metadata field gave.")
    created_at: datetime
    updated_at: datetime


class ReindexAccepted(Camel):
    job_id: str
    document_id: str
    status: str


MetadataValue = str | int | float | bool | None
MetadataKey = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


def _only_named_keys(schema: dict[str, Any]) -> None:
    """A key that does not match the key pattern is not allowed (pydantic writes the pattern
    as patternProperties, which on its own lets other keys through)."""
    for option in schema.get("anyOf", [schema]):
        if option.get("type") == "object":
            option["additionalProperties"] = False


class MetadataIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    in_: list[MetadataValue] = Field(alias="in", min_length=1, max_length=100)


class SearchFilterIn(Camel):
    """Which documents may answer: every part given must hold."""

    model_config = ConfigDict(extra="forbid")
    document_ids: list[Annotated[str, Field(pattern=UUID_PATTERN)]] | None = Field(
        None, max_length=1000
    )
    file_types: (
        list[
            Literal[
                "pdf", "docx", "pptx", "xlsx", "csv", "epub", "eml", "mbox", "html", "md", "txt"
            ]
        ]
        | None
    ) = Field(None, min_length=1)
    metadata: dict[MetadataKey, MetadataValue | MetadataIn] | None = Field(
        None,
        max_length=32,
        json_schema_extra=_only_named_keys,
        description='Each key equal to a value ({"team": "infra"}) or to one of some '
        '({"year": {"in": [2024, 2025]}}).',
    )


class SearchRequest(Camel):
    model_config = ConfigDict(extra="forbid")
    query: str = Field(min_length=1, max_length=2000)
    top_k: Count = Field(5, ge=1, le=100)
    mode: Literal["hybrid", "vector", "keyword"] = "hybrid"
    filter: SearchFilterIn | None = None


class SearchHitPublic(Camel):
    chunk_id: str
    document_id: str
    file_name: str
    ordinal: int
    text: str
    score: float
    page: int | None = Field(description="First page of the chunk (PDF), else null.")
    page_end: int | None
    section: str | None


class SearchResults(Camel):
    query: str
    mode: str
    results: list[SearchHitPublic]


class Listing(Camel, Generic[T]):
    items: list[T]
    total: int
    page: int
    limit: int
    has_more: bool


WebhookEvent = Literal["job.completed", "job.failed", "job.cancelled"]


def _job_ends() -> list[WebhookEvent]:
    return ["job.completed", "job.failed"]


class WebhookCreate(Camel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(
        min_length=8,
        max_length=2000,
        pattern=r"^[Hh][Tt][Tt][Pp][Ss]?://",
        description="Where each event is POSTed (http or https). An address on a private, "
        "loopback or link-local network is refused unless KOPS_WEBHOOK_ALLOW_PRIVATE is set.",
    )
    events: list[WebhookEvent] = Field(default_factory=_job_ends, min_length=1, max_length=3)
    dataset_id: str | None = Field(
        None, pattern=UUID_PATTERN, description="Only this dataset's jobs; null: all of them."
    )
    description: str = Field("", max_length=500)


class WebhookPublic(Camel):
    id: str
    url: str
    events: list[str]
    dataset_id: str | None
    description: str
    secret_hint: str = Field(description="The secret's first characters, to tell it apart.")
    created_at: datetime


class WebhookCreated(WebhookPublic):
    secret: str = Field(
        description="Signs every delivery (Kops-Signature: t=…,v1=HMAC-SHA256 of `t.body`). "
        "Shown only in this answer: keep it."
    )


class WebhookAttemptPublic(Camel):
    attempt: int
    at: datetime
    status_code: int | None = Field(description="The receiver's answer; null if none came.")
    error: str | None = Field(description="Why the attempt did not count as delivered.")
    duration_ms: int


class WebhookDeliveryPublic(Camel):
    id: str = Field(description="The event id (Kops-Event-Id): the same on every attempt.")
    event: str
    subject_job_id: str = Field(description="The job the event is about.")
    status: str = Field(
        description="pending, running, retrying (the receiver did not take it yet), completed "
        "(delivered), failed (POST …/deliveries/{id}/retry sends it again) or cancelled."
    )
    attempts: list[WebhookAttemptPublic] = Field(description="The latest attempts, newest first.")
    created_at: datetime
    delivered_at: datetime | None
