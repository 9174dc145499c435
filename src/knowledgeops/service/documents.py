"""Documents: list per dataset, read, delete (their chunks leave the index at once), reindex.

Scoped by tenant: a document of another tenant's dataset is "not found"."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import Any

from sqlalchemy import Connection, and_, func, or_, select, update

from knowledgeops.clock import utcnow
from knowledgeops.db.blobs import LocalBlobStore
from knowledgeops.db.engine import Database
from knowledgeops.db.schema import chunks, documents, ingest_jobs
from knowledgeops.errors import Conflict, NotFound
from knowledgeops.ingest.index.base import ChunkIndex
from knowledgeops.jobs.model import NewJob
from knowledgeops.jobs.states import OPEN
from knowledgeops.jobs.store import JobStore
from knowledgeops.service.blob_refs import unlink_unreferenced
from knowledgeops.service.datasets import owned_datasets
from knowledgeops.service.jobs import USER_JOBS
from knowledgeops.service.metadata import TYPE_NAMES
from knowledgeops.service.views import ChunkView, DocumentView, Page, from_row
from knowledgeops.webhooks import WEBHOOK_KIND

DOCUMENT_STATUSES = ("pending", "processing", "ready", "failed", "cancelled")


def _latest_job() -> Any:
    return (
        select(ingest_jobs.c.id)
        .where(ingest_jobs.c.document_id == documents.c.id, USER_JOBS)
        .order_by(ingest_jobs.c.created_at.desc(), ingest_jobs.c.generation.desc())
        .limit(1)
        .scalar_subquery()
        .label("latest_job_id")
    )


def _view(row: Any) -> DocumentView:
    m = row._mapping
    return from_row(
        DocumentView,
        row,
        searchable=m["active_generation"] is not None,
        metadata=dict(m["meta"] or {}),
        file_type=TYPE_NAMES.get(m["content_type"], m["content_type"]),
    )


def load_document(conn: Connection, tenant: str, document_id: str) -> DocumentView:
    row = conn.execute(
        select(documents, _latest_job()).where(
            documents.c.id == document_id, documents.c.dataset_id.in_(owned_datasets(tenant))
        )
    ).first()
    if row is None:
        raise NotFound("document not found", code="document_not_found")
    return _view(row)


@dataclass(eq=False)
class Documents:
    db: Database
    store: JobStore
    index: ChunkIndex
    blobs: LocalBlobStore
    _: KW_ONLY
    max_attempts: int
    notify: Callable[[], None]  # after a transaction wrote an outbox row

    def get(self, tenant: str, document_id: str) -> DocumentView:
        with self.db.read() as conn:
            return load_document(conn, tenant, document_id)

    def list(
        self, tenant: str, dataset_id: str, *, status: str | None, page: int, limit: int
    ) -> Page[DocumentView]:
        conditions = [
            documents.c.dataset_id == dataset_id,
            documents.c.dataset_id.in_(owned_datasets(tenant)),
        ]
        if status is not None:
            conditions.append(documents.c.status == status)
        with self.db.read() as conn:
            total = conn.scalar(select(func.count()).select_from(documents).where(*conditions))
            # the page's ids first: the latest-job subquery then runs for its rows only, not
            # for every row an OFFSET skips (a deep page of a large dataset)
            ids = (
                select(documents.c.id)
                .where(*conditions)
                .order_by(documents.c.created_at.desc(), documents.c.id)
                .offset((page - 1) * limit)
                .limit(limit)
            )
            rows = conn.execute(
                select(documents, _latest_job())
                .where(documents.c.id.in_(ids))
                .order_by(documents.c.created_at.desc(), documents.c.id)
            ).all()
        return Page([_view(r) for r in rows], int(total or 0), page, limit)

    def chunks(self, tenant: str, document_id: str, *, page: int, limit: int) -> Page[ChunkView]:
        """The chunks search reads (the searchable generation), in document order; none while
        the document has no searchable generation yet."""
        with self.db.read() as conn:
            doc = load_document(conn, tenant, document_id)
            if doc.active_generation is None:
                return Page([], 0, page, limit)
            where = (
                chunks.c.document_id == document_id,
                chunks.c.generation == doc.active_generation,
            )
            total = conn.scalar(select(func.count()).select_from(chunks).where(*where))
            rows = conn.execute(
                select(
                    chunks.c.id,
                    chunks.c.ordinal,
                    chunks.c.text,
                    chunks.c.token_count,
                    chunks.c.page_start,
                    chunks.c.page_end,
                    chunks.c.section,
                )
                .where(*where)
                .order_by(chunks.c.ordinal)
                .offset((page - 1) * limit)
                .limit(limit)
            ).all()
        return Page([from_row(ChunkView, r) for r in rows], int(total or 0), page, limit)

    def delete(self, tenant: str, document_id: str) -> None:
        """Remove the document, its jobs and its chunks in one transaction. A worker still
        processing it finds its lease gone at its next write and stops."""
        with self.db.write() as conn:
            doc = load_document(conn, tenant, document_id)
            # rows in the order a completing job takes them (job, chunks, document), so that a
            # delete and a completion never wait on each other in a cycle (PostgreSQL)
            # … and a re-embed of its dataset, which writes to the document under its own job
            conn.execute(
                select(ingest_jobs.c.id)
                .where(
                    or_(
                        ingest_jobs.c.document_id == document_id,
                        and_(
                            ingest_jobs.c.dataset_id == doc.dataset_id,
                            ingest_jobs.c.document_id.is_(None),
                            ingest_jobs.c.kind != WEBHOOK_KIND,
                            ingest_jobs.c.status.in_([s.value for s in OPEN]),
                        ),
                    )
                )
                .order_by(ingest_jobs.c.parent_id.is_not(None), ingest_jobs.c.id)  # parents first
                .with_for_update()
            ).all()
            self.index.delete_document(conn, document_id)
            conn.execute(documents.delete().where(documents.c.id == document_id))
            unlink_unreferenced(conn, self.blobs, {doc.sha256})  # blobs are keyed by sha256

    def reindex(self, tenant: str, document_id: str) -> str:
        """Start a new generation of the document; returns the new job's id. The current
        generation stays searchable until the new one is complete."""
        with self.db.write() as conn:
            doc = load_document(conn, tenant, document_id)
            # the generation number is taken under the row's lock: a re-embed of the dataset
            # takes the next one too (ingest/reembed.py), and two must never share one
            conn.execute(
                select(documents.c.id).where(documents.c.id == document_id).with_for_update()
            )
            open_job = conn.scalar(
                select(ingest_jobs.c.id).where(
                    ingest_jobs.c.document_id == document_id,
                    ingest_jobs.c.status.in_([s.value for s in OPEN]),
                    USER_JOBS,
                )
            )
            if open_job is not None:
                raise Conflict(
                    f"the document already has a job in progress ({open_job}); wait for it "
                    "or cancel it first",
                    code="job_in_progress",
                )
            latest = conn.execute(
                select(documents.c.latest_generation).where(documents.c.id == document_id)
            ).scalar_one()
            generation = int(latest) + 1
            conn.execute(
                update(documents)
                .where(documents.c.id == document_id)
                .values(latest_generation=generation, status="pending", updated_at=utcnow())
            )
            job = self.store.add(
                NewJob(
                    id=str(uuid.uuid4()),
                    document_id=doc.id,
                    dataset_id=doc.dataset_id,
                    generation=generation,
                    max_attempts=self.max_attempts,
                    kind="reindex",
                ),
                now=utcnow(),
                tx=conn,
            )
        self.notify()
        return job.id
