"""Keeps documents and the index in step with their jobs, inside each transition's transaction.

Registered with the job store as its `TransitionListener`: when a job completes, its generation
becomes the document's searchable one in the same transaction (docs/architecture.md: Exactly-once
effects and generations); when it fails or is
cancelled, its partial generation is dropped and the previous one stays searchable; when an
attempt starts, whatever an earlier attempt wrote of its generation is dropped first.

A job completing with no chunk at all is refused (the transaction rolls back): only a PDF split
into parts gets that far, each part having found no text on its pages, and the whole document
then fails as a PDF without text does.

A job on a whole dataset (a re-embed) switches each document itself as it goes; when it fails or
is cancelled, the generation it left unfinished is dropped (reembed.py).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update

from knowledgeops.clock import utcnow
from knowledgeops.db.engine import Tx
from knowledgeops.db.schema import datasets, documents
from knowledgeops.errors import PermanentError
from knowledgeops.ingest.index.base import ChunkIndex
from knowledgeops.ingest.parsers.pdf import NO_TEXT_MESSAGE
from knowledgeops.ingest.reembed import drop_unfinished
from knowledgeops.jobs.model import Job
from knowledgeops.jobs.states import JobStatus

DOCUMENT_STATUS = {
    JobStatus.PENDING: "pending",
    JobStatus.RUNNING: "processing",
    JobStatus.RETRYING: "processing",
    JobStatus.COMPLETED: "ready",
    JobStatus.FAILED: "failed",
    JobStatus.CANCELLED: "cancelled",
}


class DocumentLifecycle:
    def __init__(self, index: ChunkIndex) -> None:
        self.index = index

    def on_transition(self, tx: Tx, job: Job, new_status: JobStatus) -> None:
        if job.document_id is None:  # a job on a whole dataset: a re-embed (reembed.py)
            if new_status in (JobStatus.FAILED, JobStatus.CANCELLED):
                drop_unfinished(tx, self.index, job.dataset_id)
            return
        document_id = job.document_id
        values: dict[str, Any] = {"status": DOCUMENT_STATUS[new_status], "updated_at": utcnow()}
        if new_status is JobStatus.RUNNING:
            # Every attempt writes its generation from scratch: rows an earlier attempt left
            # (chunked with settings that may have changed since) must not survive into it.
            self.index.discard(tx, document_id, job.generation)
        elif new_status is JobStatus.COMPLETED:
            if not self.index.activate(tx, document_id, job.generation):
                raise PermanentError(NO_TEXT_MESSAGE, code="no_text_layer")
            # the pipeline embedded with the dataset's model, and checked that it still is
            # (IngestPipeline: a model changed meanwhile makes it embed again)
            values["embedding_model"] = (
                select(datasets.c.embedding_model)
                .where(datasets.c.id == documents.c.dataset_id)
                .scalar_subquery()
            )
        elif new_status in (JobStatus.FAILED, JobStatus.CANCELLED):
            self.index.discard(tx, document_id, job.generation)
        tx.execute(update(documents).where(documents.c.id == document_id).values(**values))
