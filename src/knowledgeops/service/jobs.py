"""Jobs as users see them: read, list, cancel, retry; scoped by tenant (through the job's
dataset), so another tenant's job is "not found". The parts of a split job (jobs/parts.py) are
the system's own: users see, cancel and retry the job they uploaded, which shows their progress."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any

from sqlalchemy import ColumnElement, and_, func, select

from knowledgeops.clock import utcnow
from knowledgeops.db.engine import Database, Tx
from knowledgeops.db.schema import documents, ingest_jobs
from knowledgeops.errors import Conflict, JobNotFound, NotFound
from knowledgeops.ingest.ocr_record import summaries as ocr_summaries
from knowledgeops.jobs.model import Job
from knowledgeops.jobs.states import OPEN, JobStatus
from knowledgeops.jobs.store import JobStore
from knowledgeops.service.datasets import owned_datasets
from knowledgeops.service.views import JobView, Page
from knowledgeops.webhooks import WEBHOOK_KIND

# not a part of a split job, nor a webhook delivery (listed under its webhook)
USER_JOBS = and_(ingest_jobs.c.parent_id.is_(None), ingest_jobs.c.kind != WEBHOOK_KIND)


def job_select(tenant: str) -> Any:
    return (
        select(ingest_jobs, documents.c.file_name, documents.c.file_size)
        .outerjoin(documents, documents.c.id == ingest_jobs.c.document_id)
        .where(ingest_jobs.c.dataset_id.in_(owned_datasets(tenant)), USER_JOBS)
    )


@dataclass(eq=False)
class Jobs:
    db: Database
    store: JobStore
    _: KW_ONLY
    retry_attempts: int  # attempts a manual retry allows
    notify: Callable[[], None]  # after a transaction wrote an outbox row

    def get(self, tenant: str, job_id: str) -> JobView:
        with self.db.read() as conn:
            row = conn.execute(job_select(tenant).where(ingest_jobs.c.id == job_id)).first()
            ocr = ocr_summaries(conn, [job_id]) if row is not None else {}
        if row is None:
            raise NotFound("job not found", code="job_not_found")
        return JobView.from_row(row, ocr.get(job_id))

    def list(
        self,
        tenant: str,
        *,
        status: JobStatus | None,
        dataset_id: str | None,
        document_id: str | None = None,
        page: int,
        limit: int,
    ) -> Page[JobView]:
        conditions: list[ColumnElement[bool]] = [
            ingest_jobs.c.dataset_id.in_(owned_datasets(tenant)),
            USER_JOBS,
        ]
        if status is not None:
            conditions.append(ingest_jobs.c.status == status.value)
        if dataset_id is not None:
            conditions.append(ingest_jobs.c.dataset_id == dataset_id)
        if document_id is not None:
            conditions.append(ingest_jobs.c.document_id == document_id)
        with self.db.read() as conn:
            total = conn.scalar(select(func.count()).select_from(ingest_jobs).where(*conditions))
            rows = conn.execute(
                job_select(tenant)
                .where(*conditions)
                .order_by(ingest_jobs.c.created_at.desc(), ingest_jobs.c.id)
                .offset((page - 1) * limit)
                .limit(limit)
            ).all()
            ocr = ocr_summaries(conn, [r.id for r in rows])
        views = [JobView.from_row(r, ocr.get(r.id)) for r in rows]
        return Page(views, int(total or 0), page, limit)

    def views(self, tenant: str, job_ids: Sequence[str]) -> dict[str, JobView]:
        """The tenant's jobs among `job_ids`, by id (one query: a page of documents' jobs)."""
        wanted = sorted(set(job_ids))
        if not wanted:
            return {}
        with self.db.read() as conn:
            rows = conn.execute(job_select(tenant).where(ingest_jobs.c.id.in_(wanted))).all()
            ocr = ocr_summaries(conn, [r.id for r in rows])
        return {r.id: JobView.from_row(r, ocr.get(r.id)) for r in rows}

    def ocr_pages(self, job_ids: Sequence[str]) -> dict[str, tuple[int, int]]:
        """(pages read, pages to read) of the jobs among `job_ids` that have OCR under way or
        done (for event streams; the caller checked the tenant)."""
        with self.db.read() as conn:
            found = ocr_summaries(conn, list(job_ids))
        return {job_id: (o.pages_done, o.pages_total) for job_id, o in found.items()}

    def cancel(self, tenant: str, job_id: str) -> JobView:
        self.get(tenant, job_id)  # 404 unless the job is the tenant's
        try:
            self.store.cancel(job_id, now=utcnow())
        except JobNotFound:
            raise NotFound("job not found", code="job_not_found") from None
        return self.get(tenant, job_id)

    def retry(self, tenant: str, job_id: str) -> JobView:
        self.get(tenant, job_id)  # 404 unless the job is the tenant's
        try:
            self.store.requeue(
                job_id,
                now=utcnow(),
                extra_attempts=self.retry_attempts,
                guard=_latest_and_alone,
            )
        except JobNotFound:
            raise NotFound("job not found", code="job_not_found") from None
        requeued = self.get(tenant, job_id)  # the state as accepted, before a worker can take it
        self.notify()
        return requeued


def _latest_and_alone(tx: Tx, job: Job) -> None:
    """Only the document's newest job may run again, and only when no other job of it is open:
    an older generation completing later would replace newer content (docs/architecture.md:
    Exactly-once effects and generations). A dataset's re-embed likewise: its latest, alone."""
    if job.document_id is None:
        _latest_reembed_and_alone(tx, job)
        return
    latest = tx.execute(
        select(documents.c.latest_generation).where(documents.c.id == job.document_id)
    ).scalar_one_or_none()
    if latest is None:
        raise NotFound("job not found", code="job_not_found")
    if latest != job.generation:
        raise Conflict(
            "a newer job of this document exists; retry that one, or reindex the document",
            code="superseded",
        )
    _alone(tx, job, ingest_jobs.c.document_id == job.document_id, "document")


def _latest_reembed_and_alone(tx: Tx, job: Job) -> None:
    newest = tx.scalar(
        select(ingest_jobs.c.id)
        .where(ingest_jobs.c.dataset_id == job.dataset_id, ingest_jobs.c.kind == job.kind)
        .order_by(ingest_jobs.c.created_at.desc(), ingest_jobs.c.id)
        .limit(1)
    )
    if newest != job.id:
        raise Conflict(
            f"a newer {job.kind} job of this dataset exists ({newest}); retry that one",
            code="superseded",
        )
    _alone(tx, job, ingest_jobs.c.dataset_id == job.dataset_id, "dataset")


def _alone(tx: Tx, job: Job, scope: ColumnElement[bool], what: str) -> None:
    """No other job in `scope` (the job's document, or dataset) is pending or running."""
    other = tx.scalar(
        select(ingest_jobs.c.id).where(
            scope,
            ingest_jobs.c.id != job.id,
            ingest_jobs.c.status.in_([s.value for s in OPEN]),
            USER_JOBS,
        )
    )
    if other is not None:
        raise Conflict(
            f"another job of this {what} is in progress ({other}); wait for it or cancel it",
            code="job_in_progress",
        )
