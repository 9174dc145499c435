"""The declared schema (docs/architecture.md: Data model). Migrations are generated from it and
tested against it.

Index structures that belong to one engine (sqlite-vec and FTS5 virtual tables, pgvector columns)
are owned by that engine's index adapter, not declared here.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from knowledgeops.clock import utcnow

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes on every engine (SQLite keeps no zone, so store naive UTC)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given; use datetime.now(UTC)")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Timestamps:
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class Dataset(Timestamps, Base):
    __tablename__ = "datasets"
    __table_args__ = (UniqueConstraint("tenant_id", "name"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64), default="default")
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(Text, default="")
    embedding_model: Mapped[str] = mapped_column(String(200))
    chunk_size: Mapped[int] = mapped_column(Integer)
    chunk_overlap: Mapped[int] = mapped_column(Integer)
    # what OCR reads the dataset's scans in (ISO 639-1 codes; ingest/parsers/ocr.py)
    ocr_languages: Mapped[list[str]] = mapped_column(
        JSON, default=lambda: ["en", "zh"], server_default='["en", "zh"]'
    )
    is_default: Mapped[bool] = mapped_column(Boolean, default=False)


class Document(Timestamps, Base):
    __tablename__ = "documents"
    __table_args__ = (
        UniqueConstraint("dataset_id", "sha256"),
        Index(None, "dataset_id", "status"),
        Index(None, "dataset_id", "embedding_model"),
        # covers the sum of a dataset's searchable chunks (counts.ActiveCounts)
        Index(None, "dataset_id", "active_generation", "chunk_count"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"))
    file_name: Mapped[str] = mapped_column(String(255))
    file_size: Mapped[int] = mapped_column(BigInteger)
    content_type: Mapped[str] = mapped_column(String(100))
    sha256: Mapped[str] = mapped_column(String(64))
    blob_key: Mapped[str] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(20), default="pending")
    active_generation: Mapped[int | None] = mapped_column(Integer, nullable=True)
    latest_generation: Mapped[int] = mapped_column(Integer, default=1)
    chunk_count: Mapped[int] = mapped_column(Integer, default=0)
    page_count: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # the model that embedded the searchable generation (None while there is none); it differs
    # from the dataset's while a re-embed is on its way (ingest/reembed.py)
    embedding_model: Mapped[str | None] = mapped_column(String(200), nullable=True)
    # metadata given at upload: a JSON object of scalars (search filters on it; jsonb on PG)
    meta: Mapped[dict[str, Any]] = mapped_column(
        JSON().with_variant(JSONB(), "postgresql"), default=dict, server_default="{}"
    )


class IngestJob(Timestamps, Base):
    __tablename__ = "ingest_jobs"
    __table_args__ = (
        Index(None, "status", "run_after"),
        Index(None, "document_id"),
        Index(None, "dataset_id", "status"),
        Index(None, "parent_id"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    # None for a job on a whole dataset (kind "reembed")
    document_id: Mapped[str | None] = mapped_column(
        ForeignKey("documents.id", ondelete="CASCADE"), nullable=True
    )
    dataset_id: Mapped[str] = mapped_column(String(36))
    kind: Mapped[str] = mapped_column(String(20), default="ingest")
    # a part of a job split for parallel work (kind "part"); hidden from users, who see the parent
    parent_id: Mapped[str | None] = mapped_column(
        ForeignKey("ingest_jobs.id", ondelete="CASCADE"), nullable=True
    )
    generation: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(20), default="pending")
    stage: Mapped[str] = mapped_column(String(20), default="queued")
    total_chunks: Mapped[int | None] = mapped_column(Integer, nullable=True)
    processed_chunks: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    error_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error_category: Mapped[str | None] = mapped_column(String(32), nullable=True)
    retryable: Mapped[bool] = mapped_column(Boolean, default=False)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer)
    run_after: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    lease_owner: Mapped[str | None] = mapped_column(String(100), nullable=True)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    version: Mapped[int] = mapped_column(Integer, default=1)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True, unique=True)
    stage_started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class JobPart(Base):
    """The pages one part job of a split PDF ingests (the ingest pipeline's own record of the
    split; the jobs core knows only that the part has a parent). Its chunks take ordinals from
    `ordinal_base` on, so every part's chunk ids are stable and distinct within the generation.
    The chunk settings are the dataset's when the job split: every part of one generation, and
    every attempt of a part, chunks alike (a retry overwrites exactly what it wrote before)."""

    __tablename__ = "job_parts"

    job_id: Mapped[str] = mapped_column(
        ForeignKey("ingest_jobs.id", ondelete="CASCADE"), primary_key=True
    )
    part_index: Mapped[int] = mapped_column(Integer)
    first_page: Mapped[int] = mapped_column(Integer)
    last_page: Mapped[int] = mapped_column(Integer)
    ordinal_base: Mapped[int] = mapped_column(Integer)
    max_chunks: Mapped[int] = mapped_column(Integer)  # its ordinals: [base, base + max_chunks)
    chunk_size: Mapped[int] = mapped_column(Integer)
    chunk_overlap: Mapped[int] = mapped_column(Integer)


class JobOcr(Base):
    """What OCR read for one job (or one part of a split PDF), kept by the ingest pipeline in
    the transactions of the job's progress reports: pages read of the pages to read, and the
    pages read with a confidence below KOPS_OCR_MIN_CONFIDENCE (left out of the index). A new
    attempt starts its row again."""

    __tablename__ = "job_ocr"

    job_id: Mapped[str] = mapped_column(
        ForeignKey("ingest_jobs.id", ondelete="CASCADE"), primary_key=True
    )
    pages_done: Mapped[int] = mapped_column(Integer, default=0)
    pages_total: Mapped[int] = mapped_column(Integer, default=0)
    low_confidence_pages: Mapped[list[int]] = mapped_column(JSON, default=list)
    # [page, confidence] of every page read (confidence null: no text on it)
    page_confidences: Mapped[list[list[float | None]]] = mapped_column(JSON, default=list)


class JobEvent(Base):
    """What happened to jobs. For metrics: each stage's duration, each retry and failure with
    its error category, each completion. For live progress (kind `change`): each change a user
    can see (status, stage, counts, attempt, error) as the job stood after it, which the event
    streams follow by id (docs/architecture.md: Live progress). Not keyed to the job row, so
    that deleting a document does not make counters go backwards."""

    __tablename__ = "job_events"
    __table_args__ = (
        Index(None, "kind", "category"),
        Index(None, "kind", "stage"),
        Index(None, "job_id", "id"),
        Index(None, "dataset_id", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(36))
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    kind: Mapped[str] = mapped_column(String(20))
    stage: Mapped[str | None] = mapped_column(String(20), nullable=True)
    category: Mapped[str | None] = mapped_column(String(32), nullable=True)
    code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    # the job after a change (kind `change`; null on the metrics rows)
    dataset_id: Mapped[str | None] = mapped_column(String(36), nullable=True)
    document_id: Mapped[str | None] = mapped_column(String(36), nullable=True)
    status: Mapped[str | None] = mapped_column(String(20), nullable=True)
    total: Mapped[int | None] = mapped_column(Integer, nullable=True)
    processed: Mapped[int | None] = mapped_column(Integer, nullable=True)
    attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_attempts: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    retryable: Mapped[bool | None] = mapped_column(Boolean, nullable=True)


class Outbox(Base):
    __tablename__ = "outbox"
    __table_args__ = (Index(None, "published_at", "available_at"), Index(None, "job_id"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("ingest_jobs.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    available_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    published_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    publish_attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)


class Chunk(Base):
    """A chunk's `id` is stable (derived from document, generation and ordinal). `seq` is the
    integer key engine-specific index rows point at: an INTEGER PRIMARY KEY is SQLite's rowid,
    which VACUUM keeps, whereas the implicit rowid of a table keyed by text may be renumbered."""

    __tablename__ = "chunks"
    __table_args__ = (
        UniqueConstraint("id"),
        UniqueConstraint("document_id", "generation", "ordinal"),
        Index(None, "dataset_id"),
    )

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64))
    document_id: Mapped[str] = mapped_column(ForeignKey("documents.id", ondelete="CASCADE"))
    dataset_id: Mapped[str] = mapped_column(String(36))
    generation: Mapped[int] = mapped_column(Integer)
    ordinal: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    content_hash: Mapped[str] = mapped_column(String(64))
    token_count: Mapped[int] = mapped_column(Integer)
    page_start: Mapped[int | None] = mapped_column(Integer, nullable=True)
    page_end: Mapped[int | None] = mapped_column(Integer, nullable=True)
    section: Mapped[str | None] = mapped_column(Text, nullable=True)


class EmbeddingCacheEntry(Base):
    """One cached vector (docs/architecture.md: Embedding and search). `model_id` holds the cache
    version and the model id (`v1:<model id>`, see ingest/embedders/cache.py); `vector` is
    little-endian float32 bytes."""

    __tablename__ = "embedding_cache"

    model_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    text_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    vector: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ApiKey(Base):
    """An API key: only the sha256 of the secret is kept (keys are 256-bit random strings, so a
    fast hash is enough: nothing can be guessed from it). `prefix` is the key's first characters,
    shown in listings so a person can tell keys apart."""

    __tablename__ = "api_keys"
    __table_args__ = (UniqueConstraint("key_hash"), Index(None, "tenant_id"))

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(200))
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


datasets = cast(Table, Dataset.__table__)
documents = cast(Table, Document.__table__)
ingest_jobs = cast(Table, IngestJob.__table__)
outbox = cast(Table, Outbox.__table__)
chunks = cast(Table, Chunk.__table__)
job_events = cast(Table, JobEvent.__table__)
job_parts = cast(Table, JobPart.__table__)
job_ocr = cast(Table, JobOcr.__table__)
embedding_cache = cast(Table, EmbeddingCacheEntry.__table__)
api_keys = cast(Table, ApiKey.__table__)


class Webhook(Base):
    """A subscription: `url` gets each of `events` (job.completed, …) of the tenant's jobs, or
    of one dataset's. `secret` signs every delivery; the API shows it once, when it is made."""

    __tablename__ = "webhooks"
    __table_args__ = (Index(None, "tenant_id"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(64))
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list[str]] = mapped_column(JSON)
    dataset_id: Mapped[str | None] = mapped_column(
        ForeignKey("datasets.id", ondelete="CASCADE"), nullable=True
    )
    description: Mapped[str] = mapped_column(Text, default="")
    secret: Mapped[str] = mapped_column(String(80))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class WebhookDelivery(Base):
    """One event for one webhook: its id is the event id the receiver dedupes on, `body` the
    exact bytes every attempt sends, `job_id` the delivery's own job (kind `webhook`)."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (UniqueConstraint("job_id"), Index(None, "webhook_id", "created_at"))

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    webhook_id: Mapped[str] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"))
    job_id: Mapped[str] = mapped_column(String(36))
    subject_job_id: Mapped[str] = mapped_column(String(36))
    event: Mapped[str] = mapped_column(String(40))
    body: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class WebhookAttempt(Base):
    """One attempt of a delivery: what the receiver answered, or why nothing counted."""

    __tablename__ = "webhook_attempts"
    __table_args__ = (Index(None, "delivery_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    delivery_id: Mapped[str] = mapped_column(
        ForeignKey("webhook_deliveries.id", ondelete="CASCADE")
    )
    attempt: Mapped[int] = mapped_column(Integer)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    duration_ms: Mapped[int] = mapped_column(Integer)


webhooks = cast(Table, Webhook.__table__)
webhook_deliveries = cast(Table, WebhookDelivery.__table__)
webhook_attempts = cast(Table, WebhookAttempt.__table__)
