"""Accepting an upload: the file is stored and the intent recorded in one transaction; no parsing.

The document row, the job row and its outbox row commit together (or not at all), then the relay
is woken to publish. The same bytes uploaded again to the same dataset give back the existing
document and job (re-queued if it had failed or was cancelled); an `Idempotency-Key` seen before
gives back the first answer.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
import uuid
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

from sqlalchemy import Connection, func, insert, select
from sqlalchemy.exc import IntegrityError

from knowledgeops.clock import utcnow
from knowledgeops.db.blobs import LocalBlobStore, StagedFile
from knowledgeops.db.engine import Database
from knowledgeops.db.schema import documents, ingest_jobs
from knowledgeops.errors import Conflict, InvalidRequest, TooManyRequests, UnsupportedMediaType
from knowledgeops.ingest.parsers.base import ContentType
from knowledgeops.ingest.parsers.sniff import describe_unsupported, is_zip, read_tail, sniff
from knowledgeops.jobs.model import NewJob
from knowledgeops.jobs.states import JobStatus
from knowledgeops.jobs.store import JobStore
from knowledgeops.service.blob_refs import lock_blob
from knowledgeops.service.datasets import Datasets
from knowledgeops.service.jobs import USER_JOBS, Jobs
from knowledgeops.service.metadata import check_metadata
from knowledgeops.service.views import Accepted
from knowledgeops.webhooks import WEBHOOK_KIND

__all__ = [  # StagedFile too: what the API streams an upload's bytes into
    "StagedFile",
    "Uploads",
    "check_idempotency_key",
    "display_name",
    "scoped_idempotency_key",
]

MAX_NAME = 255
BACKLOG_RETRY_AFTER_S = 30  # s: what a refused upload is told to wait
# Unicode categories never shown in a name: controls, format characters (bidi overrides, zero
# widths), surrogates, private use, unassigned.
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn"})
_IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,200}$")
_EXTENSIONS = {
    ContentType.PDF: ".pdf",
    ContentType.DOCX: ".docx",
    ContentType.HTML: ".html",
    ContentType.MARKDOWN: ".md",
    ContentType.TEXT: ".txt",
    ContentType.PPTX: ".pptx",
    ContentType.XLSX: ".xlsx",
    ContentType.CSV: ".csv",
    ContentType.EPUB: ".epub",
    ContentType.EMAIL: ".eml",
    ContentType.MBOX: ".mbox",
    ContentType.PNG: ".png",
    ContentType.JPEG: ".jpg",
    ContentType.TIFF: ".tiff",
    ContentType.WEBP: ".webp",
    ContentType.BMP: ".bmp",
}
SUPPORTED = (
    "PDF (scanned too), Word (.docx), PowerPoint (.pptx), Excel (.xlsx), CSV, EPUB, e-mail "
    "(.eml, .mbox), HTML, Markdown, plain text, and images (PNG, JPEG, TIFF, WebP, BMP)"
)


def display_name(raw: str | None, content_type: str | None = None) -> str:
    """A file name safe to store and show: no path parts, no control characters, at most 255
    characters with its extension kept. The stored file itself is named by its hash."""
    name = unicodedata.normalize("NFC", raw or "")
    name = name.replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(c for c in name if unicodedata.category(c) not in _HIDDEN).strip()
    if set(name) <= {"."}:  # "", ".", "..": nothing left to show
        name = "upload" + _EXTENSIONS.get(content_type or "", "")
    if len(name) > MAX_NAME:
        stem, dot, ext = name.rpartition(".")
        if dot and 0 < len(ext) <= 16:
            name = stem[: MAX_NAME - len(ext) - 2] + "…." + ext
        else:
            name = name[: MAX_NAME - 1] + "…"
    return name


def check_idempotency_key(key: str | None) -> str | None:
    if key is None:
        return None
    if not _IDEMPOTENCY_KEY.match(key):
        raise InvalidRequest(
            "Idempotency-Key must be 1 to 200 visible ASCII characters", code="invalid_header"
        )
    return key


def scoped_idempotency_key(tenant: str, key: str | None) -> str | None:
    """What the job store keeps for a client's Idempotency-Key: a hash of tenant and key, so
    two tenants choosing the same key never meet (nor learn that the other used it)."""
    if key is None:
        return None
    return hashlib.sha256(f"{tenant}\n{key}".encode()).hexdigest()


@dataclass(eq=False)
class Uploads:
    db: Database
    store: JobStore
    datasets: Datasets
    jobs: Jobs
    blobs: LocalBlobStore
    _: KW_ONLY
    max_attempts: int
    notify: Callable[[], None]  # after a transaction wrote an outbox row
    max_upload_bytes: int
    max_waiting_jobs: int = 10_000  # uploads get 429 while this many jobs wait for a worker

    def stage(self) -> StagedFile:
        """A file in the store's incoming folder for an upload's bytes, refused (413) once they
        pass the upload limit; `accept` then records it or it is discarded."""
        return self.blobs.stage(self.max_upload_bytes)

    def check_backlog(self) -> None:
        """Backpressure: refuse new uploads (429) while too many jobs wait for a worker, before
        a byte of the file is stored. Jobs being worked on do not count, only those waiting;
        the waiting parts of a split PDF count each (they are the work the workers face)."""
        with self.db.read() as conn:
            waiting = conn.scalar(
                select(func.count()).where(
                    ingest_jobs.c.status.in_([JobStatus.PENDING.value, JobStatus.RETRYING.value]),
                    ingest_jobs.c.kind != WEBHOOK_KIND,  # a receiver that is down holds no upload
                )
            )
        if waiting is not None and waiting >= self.max_waiting_jobs:
            # no count in the message: it would tell one tenant how busy the others are
            raise TooManyRequests(
                "too many jobs are waiting for a worker (KOPS_MAX_WAITING_JOBS); try again in a "
                "minute",
                code="backlog_full",
                retry_after_s=BACKLOG_RETRY_AFTER_S,
            )

    def accept(
        self,
        tenant: str,
        staged: StagedFile,
        *,
        file_name: str | None,
        declared_type: str | None,
        dataset_id: str | None,
        idempotency_key: str | None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Accepted:
        """Store the file and its job. `metadata` (checked: metadata.py) is the new document's;
        an upload of bytes the dataset holds already answers with that document, unchanged."""
        with staged:  # discarded on the way out unless it was committed into the store
            if staged.size == 0:
                raise InvalidRequest("the file is empty", code="empty_file")
            staged.seal()  # the fsync happens here, not while the database write lock is held
            scoped_key = scoped_idempotency_key(tenant, idempotency_key)
            replayed = self._replay(tenant, scoped_key, staged.sha256, dataset_id)
            accepted = replayed or self._record_new(
                tenant,
                staged,
                file_name,
                declared_type,
                dataset_id,
                scoped_key,
                check_metadata(metadata or {}),
            )
        if accepted.created:
            self.notify()
        return accepted

    def _record_new(
        self,
        tenant: str,
        staged: StagedFile,
        file_name: str | None,
        declared_type: str | None,
        dataset_id: str | None,
        idempotency_key: str | None,
        metadata: dict[str, Any],
    ) -> Accepted:
        tail = read_tail(staged.path) if is_zip(staged.head) else b""
        content_type = sniff(staged.head, file_name or "", declared_type, tail)
        if content_type is None:
            what = describe_unsupported(staged.head, file_name or "")
            raise UnsupportedMediaType(
                f"this file looks like {what}, which cannot be parsed; supported: {SUPPORTED}",
            )
        dataset = self.datasets.resolve(tenant, dataset_id)
        name = display_name(file_name, content_type)
        for _ in range(2):
            try:
                return self._record(
                    tenant, staged, dataset.id, name, content_type, idempotency_key, metadata
                )
            except IntegrityError:
                # a concurrent upload of the same bytes won the insert (the next try finds its
                # document), or the dataset was deleted meanwhile (404 here)
                self.datasets.get(tenant, dataset.id)
        raise Conflict("the same file is being uploaded concurrently; try again", code="busy")

    def _replay(
        self, tenant: str, key: str | None, sha256: str, dataset_id: str | None
    ) -> Accepted | None:
        """The first answer again, for a key seen before (409 if it came with other content)."""
        job = self.store.find_by_idempotency_key(key) if key is not None else None
        if job is None:
            return None
        view = self.jobs.get(tenant, job.id)
        with self.db.read() as conn:
            sha = conn.scalar(select(documents.c.sha256).where(documents.c.id == job.document_id))
        if sha != sha256 or job.document_id is None:  # (only uploads carry a key)
            raise Conflict(
                "this Idempotency-Key was used for a different file; use a new key",
                code="idempotency_key_reused",
            )
        if self.datasets.resolve(tenant, dataset_id).id != job.dataset_id:
            raise Conflict(
                "this Idempotency-Key was used for an upload to another dataset; use a new key",
                code="idempotency_key_reused",
            )
        return Accepted(view, job.document_id, created=False, replayed=True)

    def _record(
        self,
        tenant: str,
        staged: StagedFile,
        dataset_id: str,
        name: str,
        content_type: str,
        idempotency_key: str | None,
        metadata: dict[str, Any],
    ) -> Accepted:
        requeue: str | None = None
        with self.db.write() as conn:
            lock_blob(conn, staged.sha256)  # a delete of the last other user waits, or went first
            existing = conn.execute(
                select(documents.c.id).where(
                    documents.c.dataset_id == dataset_id, documents.c.sha256 == staged.sha256
                )
            ).first()
            if existing is None:
                document_id, job_id = self._insert(
                    conn, staged, dataset_id, name, content_type, idempotency_key, metadata
                )
                staged.commit()  # inside the transaction: see blob_refs.py
                created = True
            else:
                document_id, job_id, status = self._latest_job(conn, existing.id)
                created = False
                if status in (JobStatus.FAILED, JobStatus.CANCELLED):
                    requeue = job_id
        if requeue is not None:
            try:
                return Accepted(self.jobs.retry(tenant, requeue), document_id, created=True)
            except Conflict:  # a concurrent upload of the same bytes re-queued it first
                pass
        return Accepted(self.jobs.get(tenant, job_id), document_id, created)

    def _insert(
        self,
        conn: Connection,
        staged: StagedFile,
        dataset_id: str,
        name: str,
        content_type: str,
        idempotency_key: str | None,
        metadata: dict[str, Any],
    ) -> tuple[str, str]:
        now = utcnow()
        document_id = str(uuid.uuid4())
        conn.execute(
            insert(documents).values(
                id=document_id,
                dataset_id=dataset_id,
                file_name=name,
                file_size=staged.size,
                content_type=content_type,
                sha256=staged.sha256,
                blob_key=staged.sha256,
                status="pending",
                latest_generation=1,
                chunk_count=0,
                meta=metadata,
                created_at=now,
                updated_at=now,
            )
        )
        job = self.store.add(
            NewJob(
                id=str(uuid.uuid4()),
                document_id=document_id,
                dataset_id=dataset_id,
                generation=1,
                max_attempts=self.max_attempts,
                idempotency_key=idempotency_key,
            ),
            now=now,
            tx=conn,
        )
        return document_id, job.id

    @staticmethod
    def _latest_job(conn: Connection, document_id: str) -> tuple[str, str, JobStatus]:
        row = conn.execute(
            select(ingest_jobs.c.id, ingest_jobs.c.status)
            .where(ingest_jobs.c.document_id == document_id, USER_JOBS)
            .order_by(ingest_jobs.c.created_at.desc(), ingest_jobs.c.generation.desc())
            .limit(1)
        ).one()
        return document_id, row.id, JobStatus(row.status)
