"""Re-embedding a dataset whose model changed: a job of its own kind ("reembed"), on the dataset
rather than on one document, run by the same jobs core as every ingest job (docs/architecture.md:
Re-embedding a dataset).

`PATCH /datasets/{id}` with a new `embeddingModel` records the model on the dataset (new uploads
are embedded by it from then on) and adds the job in the same transaction. The job takes the
dataset's searchable documents one at a time, and for each:

1. allocates a new generation (the document's `latest_generation` + 1), dropping one an
   earlier attempt left unfinished;
2. copies the text of the searchable generation's chunks into it, embedded by the new model in
   batches, each batch written in the transaction of a fenced progress report (a worker that lost
   the job writes nothing more). Chunks are not cut again: a chunk's text, pages and section
   stay what they were; only its vector changes. What an earlier attempt embedded comes back
   from the embedding cache, not the model;
3. makes the new generation searchable in one transaction, with the document's
   `embedding_model`, and drops the old one.

Until a document's step 3, search answers from its previous generation with its previous model:
a query is embedded by every model the dataset's documents hold, and each model's vector is
compared only with the vectors of its own documents (service/search.py). The job reports
documents done of all the dataset's searchable documents. A document with a job of its own in
progress (a reindex, an upload) is left to that job, which embeds with the dataset's new model;
a document deleted meanwhile is skipped. When the job fails or is cancelled, the unfinished
generation is dropped; the documents done so far keep the new model (PATCH the same model again
to re-embed the rest).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Select, func, select, update

from knowledgeops.db.engine import Database, Tx
from knowledgeops.db.schema import chunks, datasets, documents, ingest_jobs
from knowledgeops.errors import PermanentError
from knowledgeops.ingest.embedders.base import Embedder
from knowledgeops.ingest.embedders.models import Models, UnknownModel
from knowledgeops.ingest.index.base import ChunkIndex, IndexedChunk, chunk_id
from knowledgeops.jobs.model import Job
from knowledgeops.jobs.runner import JobContext
from knowledgeops.jobs.states import OPEN, Stage
from knowledgeops.jobs.store import Work

log = logging.getLogger(__name__)

REEMBED_KIND = "reembed"
READ_WINDOW = 512  # chunks of the source generation read at once


@dataclass(frozen=True, slots=True)
class _Step:
    """One document's re-embed: from its searchable generation to `generation`."""

    document_id: str
    source: int
    generation: int


@dataclass(eq=False)
class Reembedder:
    db: Database
    index: ChunkIndex
    models: Models
    batch_size: int
    window: int = READ_WINDOW

    def __call__(self, ctx: JobContext) -> None:
        job = ctx.job
        target = self._target(job.dataset_id)
        try:
            embedder = self.models.embedder(target)
        except UnknownModel as exc:
            raise PermanentError(
                f"the dataset's model {target!r} is not one this worker runs ({exc.message})",
                code="unknown_model",
            ) from None
        done, todo = self._plan(job.dataset_id, target)
        ctx.report(stage=Stage.EMBEDDING, total=done + len(todo), processed=done)
        embedded = 0  # texts the model itself was given (the rest came from the cache)
        for document_id in todo:
            embedded += self._document(ctx, document_id, target, embedder)
            done += 1
            ctx.report(processed=done)
        ctx.report(stage=Stage.INDEXING)
        log.info(
            "job %s: %d documents of dataset %s on %s (%d texts embedded by this attempt)",
            job.id,
            done,
            job.dataset_id,
            target,
            embedded,
        )

    def _target(self, dataset_id: str) -> str:
        with self.db.read() as conn:
            model = conn.scalar(
                select(datasets.c.embedding_model).where(datasets.c.id == dataset_id)
            )
        if model is None:
            raise PermanentError("the dataset was deleted", code="dataset_deleted")
        return str(model)

    def _plan(self, dataset_id: str, target: str) -> tuple[int, list[str]]:
        """How many searchable documents are on `target` already, and the ids of the rest."""
        with self.db.read() as conn:
            rows = conn.execute(
                select(documents.c.id, documents.c.embedding_model)
                .where(
                    documents.c.dataset_id == dataset_id,
                    documents.c.active_generation.is_not(None),
                )
                .order_by(documents.c.created_at, documents.c.id)
            ).all()
        todo = [row.id for row in rows if row.embedding_model != target]
        return len(rows) - len(todo), todo

    def _document(self, ctx: JobContext, document_id: str, target: str, embedder: Embedder) -> int:
        """Re-embed one document; returns how many texts the model itself embedded."""
        found: list[_Step] = []
        ctx.report(work=lambda tx: found.extend(self._begin(tx, document_id, target)))
        if not found:
            return 0
        step = found[0]
        gone: list[bool] = []
        embedded = 0
        for batch in self._batches(step):
            vectors, fresh = embedder.embed_counted([row.text for row in batch])
            embedded += fresh
            rows = [
                IndexedChunk(
                    id=chunk_id(step.document_id, step.generation, row.ordinal),
                    document_id=step.document_id,
                    dataset_id=ctx.job.dataset_id,
                    generation=step.generation,
                    ordinal=row.ordinal,
                    text=row.text,
                    content_hash=row.content_hash,
                    token_count=row.token_count,
                    page_start=row.page_start,
                    page_end=row.page_end,
                    section=row.section,
                    vector=vector,
                )
                for row, vector in zip(batch, vectors, strict=True)
            ]
            ctx.report(work=self._writer(step, rows, gone))
            if gone:  # the document was deleted meanwhile
                return embedded
        ctx.report(work=lambda tx: self._finish(tx, ctx.job, step, target))
        return embedded

    def _writer(self, step: _Step, rows: list[IndexedChunk], gone: list[bool]) -> Work:
        def write(tx: Tx) -> None:
            # a delete of the document waits for this transaction (it locks the dataset's open
            # re-embed with the document's jobs: service/documents.py), so it is there or gone
            if _current(tx, step.document_id) is None:
                gone.append(True)
                return
            self.index.upsert(tx, rows)

        return write

    def _begin(self, tx: Tx, document_id: str, target: str) -> list[_Step]:
        """The step for the document, or none: it is gone, not searchable, on `target` already,
        or has a job of its own in progress (which embeds it with the dataset's model).

        The new generation is always the next number: a generation left unfinished (by an
        earlier attempt of this job, or a job that failed) is dropped, never continued, since
        its number may be a failed job's, which a retry would claim back. The chunks an
        earlier attempt embedded are not embedded again by the model: the embedding cache
        answers for them (on unless KOPS_EMBED_CACHE=false). Rows are taken in the order every
        job takes them (its job, chunks, then the document: the number is claimed by an update
        that matches only the number seen), so no lock waits in a cycle on PostgreSQL."""
        doc = _current(tx, document_id)
        if doc is None or doc.active_generation is None or doc.embedding_model == target:
            return []
        if _open_job(tx, document_id):
            return []
        source, latest = int(doc.active_generation), int(doc.latest_generation)
        if latest > source:
            self.index.discard(tx, document_id, latest)
        claimed = tx.execute(
            update(documents)
            .where(documents.c.id == document_id, documents.c.latest_generation == latest)
            .values(latest_generation=latest + 1)
        )
        if claimed.rowcount != 1:  # reindexed a moment ago: its own job embeds it
            return []
        return [_Step(document_id, source, latest + 1)]

    def _batches(self, step: _Step) -> Iterator[list[Any]]:
        """The source generation's chunks, a batch at a time, read a window at a time (a
        document's text is never all in memory)."""
        last = -1
        while True:
            with self.db.read() as conn:
                rows = _source_rows(conn, step, last, self.window)
            if not rows:
                return
            last = rows[-1].ordinal
            for start in range(0, len(rows), self.batch_size):
                yield rows[start : start + self.batch_size]

    def _finish(self, tx: Tx, job: Job, step: _Step, target: str) -> None:
        """Make the new generation searchable, unless the document changed meanwhile (deleted,
        or reindexed: then its own job's generation wins and this one is dropped)."""
        doc = _current(tx, step.document_id)
        if doc is None:
            return
        if doc.latest_generation != step.generation or doc.active_generation != step.source:
            self.index.discard(tx, step.document_id, step.generation)
            return
        copied = tx.scalar(_count(step.document_id, step.generation))
        expected = tx.scalar(_count(step.document_id, step.source))
        if copied != expected:  # cannot happen unless rows were lost: never switch to fewer
            raise PermanentError(
                f"document {step.document_id}: {copied} of {expected} chunks re-embedded",
                code="reembed_incomplete",
            )
        self.index.activate(tx, step.document_id, step.generation)
        tx.execute(
            update(documents)
            .where(documents.c.id == step.document_id)
            .values(embedding_model=target)
        )
        log.debug("job %s: document %s now on %s", job.id, step.document_id, target)


def _current(tx: Tx, document_id: str) -> Any:
    """The document's generations and model; None if it is gone."""
    return tx.execute(
        select(
            documents.c.active_generation,
            documents.c.latest_generation,
            documents.c.embedding_model,
        ).where(documents.c.id == document_id)
    ).first()


def _source_rows(conn: Connection, step: _Step, after: int, limit: int) -> list[Any]:
    """The source generation's chunks after ordinal `after` (rows with a chunk's columns)."""
    rows = conn.execute(
        select(
            chunks.c.ordinal,
            chunks.c.text,
            chunks.c.content_hash,
            chunks.c.token_count,
            chunks.c.page_start,
            chunks.c.page_end,
            chunks.c.section,
        )
        .where(
            chunks.c.document_id == step.document_id,
            chunks.c.generation == step.source,
            chunks.c.ordinal > after,
        )
        .order_by(chunks.c.ordinal)
        .limit(limit)
    ).all()
    return list(rows)


def _count(document_id: str, generation: int) -> Select[Any]:
    return (
        select(func.count())
        .select_from(chunks)
        .where(chunks.c.document_id == document_id, chunks.c.generation == generation)
    )


def _open_job(tx: Tx, document_id: str) -> bool:
    return (
        tx.scalar(
            select(ingest_jobs.c.id)
            .where(
                ingest_jobs.c.document_id == document_id,
                ingest_jobs.c.parent_id.is_(None),
                ingest_jobs.c.status.in_([s.value for s in OPEN]),
            )
            .limit(1)
        )
        is not None
    )


def drop_unfinished(tx: Tx, index: ChunkIndex, dataset_id: str) -> None:
    """When a re-embed fails or is cancelled: drop the generation it left unfinished (a
    document's latest generation above its searchable one, with no job of its own open)."""
    rows = tx.execute(
        select(documents.c.id, documents.c.latest_generation).where(
            documents.c.dataset_id == dataset_id,
            documents.c.active_generation.is_not(None),
            documents.c.latest_generation > documents.c.active_generation,
        )
    ).all()
    for row in rows:
        if not _open_job(tx, row.id):
            index.discard(tx, row.id, int(row.latest_generation))
