"""Datasets: create, read, update, delete, list; and the default dataset uploads fall back to.

Every method takes the caller's tenant and sees only that tenant's datasets: another tenant's
dataset id answers "not found", exactly like an id that does not exist.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any

from sqlalchemy import Connection, func, insert, select, text, update
from sqlalchemy.exc import IntegrityError

from knowledgeops.clock import utcnow
from knowledgeops.db.blobs import LocalBlobStore
from knowledgeops.db.engine import Database
from knowledgeops.db.schema import datasets, documents, ingest_jobs
from knowledgeops.errors import Conflict, InvalidField, InvalidRequest, NotFound
from knowledgeops.ingest.embedders.models import Models
from knowledgeops.ingest.index.base import ChunkIndex
from knowledgeops.ingest.parsers.ocr import DEFAULT_LANGUAGES as DEFAULT_OCR_LANGUAGES
from knowledgeops.ingest.parsers.ocr import available_languages as ocr_languages_available
from knowledgeops.ingest.reembed import REEMBED_KIND
from knowledgeops.jobs.model import NewJob
from knowledgeops.jobs.states import OPEN
from knowledgeops.jobs.store import JobStore
from knowledgeops.service.blob_refs import unlink_unreferenced
from knowledgeops.service.views import DatasetView, Page, from_row
from knowledgeops.settings import MODEL_MAX_TOKENS
from knowledgeops.webhooks import WEBHOOK_KIND

DEFAULT_NAME = "default"


@dataclass(frozen=True, slots=True)
class DatasetDefaults:
    chunk_size: int
    chunk_overlap: int


def owned_datasets(tenant: str) -> Any:
    """The ids of the tenant's datasets, for scoping documents, jobs and chunks (they belong to
    a tenant through their dataset)."""
    return select(datasets.c.id).where(datasets.c.tenant_id == tenant)


def check_chunking(size: int, overlap: int, max_tokens: int = MODEL_MAX_TOKENS) -> None:
    """`max_tokens`: what the dataset's model reads, its two special tokens included."""
    if not 16 <= size <= max_tokens - 2:
        raise InvalidField(
            f"chunkSize must be between 16 and {max_tokens - 2} tokens (what the dataset's "
            "model reads)",
            code="invalid_field",
        )
    if not 0 <= overlap < size // 2:
        raise InvalidRequest(
            "chunkOverlap must be at least 0 and less than half of chunkSize", code="invalid_field"
        )


def check_ocr_languages(languages: list[str]) -> list[str]:
    """The languages, without repeats, if OCR can read each here; else 422 naming what it can
    (the bundled engine's, and those of an installed Tesseract)."""
    available = ocr_languages_available()
    unknown = [language for language in languages if language not in available]
    if unknown:
        raise InvalidField(
            f"ocrLanguages: OCR here cannot read {', '.join(unknown)}; it reads "
            f"{', '.join(sorted(available))} (more with Tesseract's language data: "
            "docs/formats.md)",
            code="unknown_ocr_language",
        )
    return list(dict.fromkeys(languages))


@dataclass(eq=False)
class Datasets:
    db: Database
    index: ChunkIndex
    blobs: LocalBlobStore
    defaults: DatasetDefaults
    models: Models  # the models a dataset may be created with, and the default
    store: JobStore  # a model change adds a re-embed job (ingest/reembed.py)
    _: KW_ONLY
    max_attempts: int
    notify: Callable[[], None]  # after a transaction wrote an outbox row

    def _select(self, tenant: str) -> Any:
        docs = (
            select(
                documents.c.dataset_id,
                func.count().label("n"),
                func.coalesce(func.sum(documents.c.chunk_count), 0).label("chunks"),
            )
            .group_by(documents.c.dataset_id)
            .subquery()
        )
        reembed = (
            select(ingest_jobs.c.id)
            .where(ingest_jobs.c.dataset_id == datasets.c.id, ingest_jobs.c.kind == REEMBED_KIND)
            .order_by(ingest_jobs.c.created_at.desc(), ingest_jobs.c.id)
            .limit(1)
            .scalar_subquery()
        )
        return (
            select(
                datasets,
                func.coalesce(docs.c.n, 0).label("document_count"),
                func.coalesce(docs.c.chunks, 0).label("chunk_count"),
                reembed.label("reembed_job_id"),
            )
            .outerjoin(docs, docs.c.dataset_id == datasets.c.id)
            .where(datasets.c.tenant_id == tenant)
        )

    @staticmethod
    def _views(conn: Connection, rows: Sequence[Any]) -> list[DatasetView]:
        ids = [row._mapping["id"] for row in rows]
        held: dict[str, dict[str, int]] = {dataset_id: {} for dataset_id in ids}
        if ids:
            for dataset_id, model, n in conn.execute(
                select(documents.c.dataset_id, documents.c.embedding_model, func.count())
                .where(documents.c.dataset_id.in_(ids), documents.c.embedding_model.is_not(None))
                .group_by(documents.c.dataset_id, documents.c.embedding_model)
            ):
                held[dataset_id][model] = int(n)
        views = []
        for row in rows:
            m = row._mapping
            computed = {
                "document_count": int(m["document_count"]),
                "chunk_count": int(m["chunk_count"]),
                "document_models": held[m["id"]],
            }
            views.append(from_row(DatasetView, row, **computed))
        return views

    def _get(self, conn: Connection, tenant: str, dataset_id: str) -> DatasetView:
        row = conn.execute(self._select(tenant).where(datasets.c.id == dataset_id)).first()
        if row is None:
            raise NotFound("dataset not found", code="dataset_not_found")
        return self._views(conn, [row])[0]

    def get(self, tenant: str, dataset_id: str) -> DatasetView:
        with self.db.read() as conn:
            return self._get(conn, tenant, dataset_id)

    def model_of(self, tenant: str, dataset_id: str) -> str:
        """The dataset's embedding model, 404 like `get` (a search needs no counts: this is
        one row by its key, on every query's path)."""
        with self.db.read() as conn:
            model = conn.scalar(
                select(datasets.c.embedding_model).where(
                    datasets.c.id == dataset_id, datasets.c.tenant_id == tenant
                )
            )
        if model is None:
            raise NotFound("dataset not found", code="dataset_not_found")
        return str(model)

    def resolve(self, tenant: str, dataset_id: str | None) -> DatasetView:
        """The dataset an upload goes to: the given one, or the tenant's default (created on
        the tenant's first upload)."""
        if dataset_id is not None:
            return self.get(tenant, dataset_id)
        with self.db.read() as conn:
            row = conn.execute(self._select(tenant).where(datasets.c.is_default.is_(True))).first()
            if row is not None:
                return self._views(conn, [row])[0]
        return self.ensure_default(tenant)

    def ensure_default(self, tenant: str) -> DatasetView:
        with self.db.write() as conn:
            if not self.db.is_sqlite:  # several API processes may start at once
                conn.execute(
                    text("SELECT pg_advisory_xact_lock(hashtext(:name))"),
                    {"name": f"kops.default_dataset.{tenant}"},
                )
            row = conn.execute(self._select(tenant).where(datasets.c.is_default.is_(True))).first()
            if row is not None:
                return self._views(conn, [row])[0]
            name = DEFAULT_NAME
            taken = conn.scalar(
                select(func.count()).where(datasets.c.tenant_id == tenant, datasets.c.name == name)
            )
            if taken:
                name = f"{DEFAULT_NAME}-{uuid.uuid4().hex[:6]}"
            return self._insert(
                conn, tenant, name, "Uploads without a datasetId land here.", None, None, True
            )

    def create(
        self,
        tenant: str,
        name: str,
        description: str = "",
        chunk_size: int | None = None,
        chunk_overlap: int | None = None,
        embedding_model: str | None = None,
        ocr_languages: list[str] | None = None,
    ) -> DatasetView:
        """A dataset embedded by `embedding_model` (the deployment's default if None): 422
        naming the available models for one this deployment does not run; likewise for OCR
        languages it cannot read."""
        try:
            with self.db.write() as conn:
                return self._insert(
                    conn,
                    tenant,
                    name,
                    description,
                    chunk_size,
                    chunk_overlap,
                    False,
                    embedding_model=embedding_model,
                    ocr_languages=ocr_languages,
                )
        except IntegrityError:
            raise Conflict(
                f"a dataset named {name!r} exists already", code="dataset_exists"
            ) from None

    def _insert(
        self,
        conn: Connection,
        tenant: str,
        name: str,
        description: str,
        chunk_size: int | None,
        chunk_overlap: int | None,
        is_default: bool,
        *,
        embedding_model: str | None = None,
        ocr_languages: list[str] | None = None,
    ) -> DatasetView:
        model = self.models.spec(embedding_model or self.models.default)
        languages = check_ocr_languages(ocr_languages or list(DEFAULT_OCR_LANGUAGES))
        size = chunk_size if chunk_size is not None else self.defaults.chunk_size
        overlap = (
            chunk_overlap
            if chunk_overlap is not None
            else min(self.defaults.chunk_overlap, max(size // 2 - 1, 0))
        )
        check_chunking(size, overlap, model.max_tokens)
        dataset_id = str(uuid.uuid4())
        now = utcnow()
        conn.execute(
            insert(datasets).values(
                id=dataset_id,
                tenant_id=tenant,
                name=name,
                description=description,
                embedding_model=model.model_id,
                chunk_size=size,
                chunk_overlap=overlap,
                ocr_languages=languages,
                is_default=is_default,
                created_at=now,
                updated_at=now,
            )
        )
        return self._get(conn, tenant, dataset_id)

    def update(self, tenant: str, dataset_id: str, changes: dict[str, Any]) -> DatasetView:
        """Change name, description, chunk_size, chunk_overlap (new settings apply to documents
        ingested or reindexed from now on) or embedding_model: a new model is the dataset's at
        once (uploads from now on are embedded by it) and a re-embed job takes its searchable
        documents to it (ingest/reembed.py). A model change waits for the dataset's jobs:
        409 while one is pending or running."""
        allowed = {
            "name",
            "description",
            "chunk_size",
            "chunk_overlap",
            "embedding_model",
            "ocr_languages",
        }
        values = {k: v for k, v in changes.items() if k in allowed and v is not None}
        if "ocr_languages" in values:
            values["ocr_languages"] = check_ocr_languages(values["ocr_languages"])
        started = False
        try:
            with self.db.write() as conn:
                # one change at a time (two PATCHes at once must not both start a re-embed)
                conn.execute(
                    select(datasets.c.id)
                    .where(datasets.c.id == dataset_id, datasets.c.tenant_id == tenant)
                    .with_for_update()
                )
                current = self._get(conn, tenant, dataset_id)
                model = values.get("embedding_model", current.embedding_model)
                spec = self.models.spec(model) if "embedding_model" in values else None
                check_chunking(
                    values.get("chunk_size", current.chunk_size),
                    values.get("chunk_overlap", current.chunk_overlap),
                    spec.max_tokens if spec is not None else self._max_tokens(model),
                )
                if spec is not None:
                    started = self._change_model(conn, current, spec.model_id)
                if values:
                    conn.execute(
                        update(datasets)
                        .where(datasets.c.id == dataset_id, datasets.c.tenant_id == tenant)
                        .values(updated_at=utcnow(), **values)
                    )
                updated = self._get(conn, tenant, dataset_id)
        except IntegrityError:
            raise Conflict(
                f"a dataset named {values.get('name')!r} exists already", code="dataset_exists"
            ) from None
        if started:
            self.notify()
        return updated

    def _change_model(self, conn: Connection, current: DatasetView, model: str) -> bool:
        """Add the re-embed job a model change needs (in the caller's transaction); False when
        there is nothing to re-embed (no searchable document is on another model, or a
        re-embed to this model is on its way already)."""
        dataset_id = current.id
        open_jobs = conn.execute(
            select(ingest_jobs.c.id, ingest_jobs.c.kind)
            .where(
                ingest_jobs.c.dataset_id == dataset_id,
                ingest_jobs.c.parent_id.is_(None),
                ingest_jobs.c.kind != WEBHOOK_KIND,  # a delivery holds up no model change
                ingest_jobs.c.status.in_([s.value for s in OPEN]),
            )
            .order_by(ingest_jobs.c.created_at, ingest_jobs.c.id)
        ).all()
        if model == current.embedding_model and any(j.kind == REEMBED_KIND for j in open_jobs):
            return False  # the same change again, while its re-embed runs: nothing to do
        behind = conn.scalar(
            select(func.count())
            .select_from(documents)
            .where(
                documents.c.dataset_id == dataset_id,
                documents.c.active_generation.is_not(None),
                documents.c.embedding_model.is_distinct_from(model),
            )
        )
        if model == current.embedding_model and not behind:
            return False
        if open_jobs:
            first = open_jobs[0]
            raise Conflict(
                f"the dataset has {len(open_jobs)} job(s) pending or running (the first: "
                f"{first.kind} job {first.id}); its model can change once they have finished: "
                f"wait for them (GET /docs/jobs?datasetId={dataset_id}&status=running) or "
                "cancel them, then try again",
                code="jobs_in_progress",
            )
        if not behind:
            return False
        self.store.add(
            NewJob(
                id=str(uuid.uuid4()),
                document_id=None,
                dataset_id=dataset_id,
                generation=0,  # each document gets its own new generation (ingest/reembed.py)
                max_attempts=self.max_attempts,
                kind=REEMBED_KIND,
            ),
            now=utcnow(),
            tx=conn,
        )
        return True

    def _max_tokens(self, model: str) -> int:
        spec = self.models.specs.get(model)
        return spec.max_tokens if spec is not None else MODEL_MAX_TOKENS

    def delete(self, tenant: str, dataset_id: str) -> None:
        """Delete the dataset, its documents, jobs and chunks; stop its running jobs."""
        with self.db.write() as conn:
            current = self._get(conn, tenant, dataset_id)
            if current.is_default:
                raise Conflict(
                    "the default dataset cannot be deleted; delete its documents instead",
                    code="default_dataset",
                )
            keys = conn.scalars(
                select(documents.c.blob_key).where(documents.c.dataset_id == dataset_id)
            ).all()
            # its jobs first, parents before parts (the order every job writer takes them), so
            # that the cascade below never waits on a worker that waits on it (PostgreSQL)
            conn.execute(
                select(ingest_jobs.c.id)
                .where(ingest_jobs.c.dataset_id == dataset_id, ingest_jobs.c.kind != WEBHOOK_KIND)
                .order_by(ingest_jobs.c.parent_id.is_not(None), ingest_jobs.c.id)
                .with_for_update()
            ).all()
            self.index.delete_dataset(conn, dataset_id)
            # a job on the whole dataset (a re-embed) belongs to no document, whose delete
            # would take it along: its worker finds it gone at its next write and stops. A
            # webhook delivery stays: the event it carries happened (a webhook of this dataset
            # goes with it, and its deliveries with that)
            conn.execute(
                ingest_jobs.delete().where(
                    ingest_jobs.c.dataset_id == dataset_id,
                    ingest_jobs.c.document_id.is_(None),
                    ingest_jobs.c.kind != WEBHOOK_KIND,
                )
            )
            conn.execute(
                datasets.delete().where(datasets.c.id == dataset_id, datasets.c.tenant_id == tenant)
            )
            unlink_unreferenced(conn, self.blobs, set(keys))

    def list(self, tenant: str, *, page: int, limit: int) -> Page[DatasetView]:
        with self.db.read() as conn:
            total = conn.scalar(
                select(func.count()).select_from(datasets).where(datasets.c.tenant_id == tenant)
            )
            rows = conn.execute(
                self._select(tenant)
                .order_by(datasets.c.created_at, datasets.c.id)
                .offset((page - 1) * limit)
                .limit(limit)
            ).all()
            views = self._views(conn, rows)
        return Page(views, int(total or 0), page, limit)
