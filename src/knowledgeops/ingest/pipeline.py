"""The ingest job handler: parse → clean → chunk → embed in batches → index, with honest progress.

Registered as the handler the jobs runner calls. Every batch of vectors is written in the same
transaction as the progress count that includes it, fenced by the worker's lease, so
`processedChunks` is always the number of chunks really written, and a worker that lost its job
can write nothing more. Chunk ids are stable per (document, generation, ordinal): a retry
overwrites its own partial writes instead of adding to them.

A PDF of more than `part_pages` pages is split (JobStore.split; its plan in ingest/pdf_parts.py):
its job hands page ranges to part jobs that any worker runs, each writing its pages' chunks
into the job's generation with ordinals from its own base (so ids stay stable and distinct); the
last part to complete makes the generation searchable, all at once. Chunks do not span two
parts.

A job of the other kind, "reembed", embeds a whole dataset again with its new model
(reembed.py).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from sqlalchemy import select, update

from knowledgeops.db.blobs import LocalBlobStore
from knowledgeops.db.engine import Database, Tx
from knowledgeops.db.schema import datasets, documents
from knowledgeops.errors import PermanentError, TransientError
from knowledgeops.ingest import pdf_parts
from knowledgeops.ingest.chunker import ChunkDraft
from knowledgeops.ingest.embedders.base import Embedder
from knowledgeops.ingest.embedders.models import Models
from knowledgeops.ingest.index.base import ChunkIndex, IndexedChunk, chunk_id
from knowledgeops.ingest.ocr_record import OcrTracker
from knowledgeops.ingest.parsers.base import ContentType
from knowledgeops.ingest.parsers.isolated import InlineParsing, Parsing
from knowledgeops.ingest.parsers.limits import DEFAULT_LIMITS, ParseLimits
from knowledgeops.ingest.parsers.ocr import DEFAULT_LANGUAGES as DEFAULT_OCR_LANGUAGES
from knowledgeops.ingest.prepare import ChunkSpec, ChunkStream
from knowledgeops.ingest.reembed import REEMBED_KIND, Reembedder
from knowledgeops.jobs.model import Job
from knowledgeops.jobs.parts import PART_KIND
from knowledgeops.jobs.runner import JobContext
from knowledgeops.jobs.states import Stage

log = logging.getLogger(__name__)

WINDOW = 512  # chunks: a document's chunks in memory at once (embedded, then written)


@dataclass(frozen=True, slots=True)
class _Source:
    blob_key: str
    content_type: str
    file_name: str
    chunk_size: int
    chunk_overlap: int
    model: str  # the dataset's embedding model
    ocr_languages: tuple[str, ...]  # the dataset's: what OCR reads its scans in


@dataclass(eq=False)
class IngestPipeline:
    db: Database
    blobs: LocalBlobStore
    index: ChunkIndex
    models: Models  # each dataset's chunks are cut by its model's tokenizer and embedded by it
    _: KW_ONLY
    batch_size: int
    parsing: Parsing = field(default_factory=lambda: InlineParsing(DEFAULT_LIMITS))
    window: int = WINDOW  # at least one batch
    part_pages: int = 0  # a PDF of more pages is split into parts of this many (0: never)

    reembed: Reembedder = field(init=False)  # the other kind of job: a dataset's new model

    def __post_init__(self) -> None:
        self.window = max(self.window, self.batch_size)
        self.reembed = Reembedder(self.db, self.index, self.models, self.batch_size)

    @property
    def limits(self) -> ParseLimits:
        return self.parsing.limits

    def __call__(self, ctx: JobContext) -> None:
        if ctx.job.kind == REEMBED_KIND:
            self.reembed(ctx)
            return
        if ctx.job.kind == PART_KIND:
            self._run_part(ctx)
            return
        ctx.report(stage=Stage.PARSING)
        source = self._source(_document(ctx.job))
        path = self._stored(source)
        if self._split(ctx, source, path):
            return
        spec = self._spec(source)
        # parsed, cleaned and chunked where the parser runs (its own process by default), so
        # the next chunks are made while this thread waits for the model
        ocr = OcrTracker(ctx)
        stream = self._stream(path, source, spec, ocr)
        with closing(stream):
            total = self._embed_and_index(ctx, _announce(stream, ctx, ocr), source.model, ocr)
        if not total:
            raise PermanentError(
                f"no text was found in {source.file_name}; check that the file has text "
                "(a scanned document needs OCR first)",
                code="no_text",
            )
        pages = stream.pages

        def finish(tx: Tx) -> None:
            _check_model(tx, ctx.job.dataset_id, source.model)
            self._record_pages(tx, ctx, pages)

        ctx.report(stage=Stage.INDEXING, work=finish)

    def _stored(self, source: _Source) -> Any:
        path = self.blobs.path(source.blob_key)
        if not path.is_file():
            raise PermanentError(
                "the stored file is missing; upload the document again", code="file_missing"
            )
        return path

    def _spec(self, source: _Source, part: pdf_parts.PartPlan | None = None) -> ChunkSpec:
        return ChunkSpec(
            size=source.chunk_size,
            overlap=source.chunk_overlap,
            max_text_chars=self.limits.max_text_chars,
            max_chunks=self.limits.max_chunks if part is None else part.max_chunks,
            first_page=None if part is None else part.first_page,
            last_page=None if part is None else part.last_page,
            ocr_languages=source.ocr_languages,
        )

    # --- a large PDF, in parts --------------------------------------------------------------------
    def _split(self, ctx: JobContext, source: _Source, path: Any) -> bool:
        """Split a PDF of more than `part_pages` pages into page-range parts; False if it is
        to be ingested whole. Its page count is read in the parser process."""
        if not self.part_pages or source.content_type != ContentType.PDF:
            return False
        pages = self.parsing.page_count(path, source.content_type)
        if pages is None or pages <= self.part_pages:
            return False
        plans = pdf_parts.plan(
            pages,
            self.part_pages,
            max_chunks=self.limits.max_chunks,
            chunk_size=source.chunk_size,
            chunk_overlap=source.chunk_overlap,
        )
        if plans is None:
            log.warning("job %s: its parts' chunks would not fit 32-bit ordinals", ctx.job.id)
            return False
        document_id = _document(ctx.job)

        def record(tx: Tx, ids: list[str]) -> None:
            pdf_parts.record(tx, ids, plans)
            tx.execute(
                update(documents).where(documents.c.id == document_id).values(page_count=pages)
            )

        ctx.split(len(plans), record)
        log.info("job %s: %d pages split into %d parts", ctx.job.id, pages, len(plans))
        return True

    def _run_part(self, ctx: JobContext) -> None:
        """One page range of a split PDF: its chunks go into the job's generation, from the
        part's ordinal base. A range without text is no error (the document as a whole is
        checked when it completes: DocumentLifecycle). It chunks with the settings the job had
        when it split, so its parts agree; whatever an earlier attempt of it wrote is dropped
        first; and the document's chunk limit counts the chunks of all its parts."""
        part = pdf_parts.load(self.db, ctx.job.id)
        job = ctx.job
        document_id = _document(job)
        ordinals = (part.ordinal_base, part.ordinal_base + part.max_chunks)
        ctx.report(
            stage=Stage.PARSING,
            work=lambda tx: self.index.discard(tx, document_id, job.generation, ordinals),
        )
        source = dataclasses.replace(
            self._source(document_id),
            chunk_size=part.chunk_size,
            chunk_overlap=part.chunk_overlap,
        )
        path = self._stored(source)
        spec = self._spec(source, part)
        ocr = OcrTracker(ctx)
        stream = self._stream(path, source, spec, ocr)
        with closing(stream):
            total = self._embed_and_index(
                ctx, _announce(stream, ctx, ocr), source.model, ocr, base=part.ordinal_base
            )
        ctx.report(
            stage=Stage.INDEXING,
            total=total,
            processed=total,
            work=lambda tx: _check_model(tx, job.dataset_id, source.model),
        )

    def _stream(self, path: Any, source: _Source, spec: ChunkSpec, ocr: OcrTracker) -> ChunkStream:
        tokenizer = self.models.tokenizer(source.model)
        return ChunkStream(self.parsing.chunks(path, source.content_type, spec, tokenizer, ocr))

    def _source(self, document_id: str) -> _Source:
        with self.db.read() as conn:
            row = conn.execute(
                select(
                    documents.c.blob_key,
                    documents.c.content_type,
                    documents.c.file_name,
                    datasets.c.chunk_size,
                    datasets.c.chunk_overlap,
                    datasets.c.embedding_model,
                    datasets.c.ocr_languages,
                )
                .join(datasets, datasets.c.id == documents.c.dataset_id)
                .where(documents.c.id == document_id)
            ).first()
        if row is None:
            raise PermanentError("the document was deleted", code="document_deleted")
        m = row._mapping
        return _Source(
            blob_key=m["blob_key"],
            content_type=m["content_type"],
            file_name=m["file_name"],
            chunk_size=m["chunk_size"],
            chunk_overlap=m["chunk_overlap"],
            model=m["embedding_model"],
            ocr_languages=tuple(m["ocr_languages"] or DEFAULT_OCR_LANGUAGES),
        )

    def _embed_and_index(
        self,
        ctx: JobContext,
        drafts: Iterable[ChunkDraft],
        model: str,
        ocr: OcrTracker,
        *,
        base: int = 0,
    ) -> int:
        """Embed and write the drafts as they stream from the chunker, a window at a time, so a
        document's text is never all in memory. Returns how many chunks were written.

        A document of up to one window (most) is chunked whole first, so its total is known
        when embedding starts; a longer one starts embedding at its first full window and its
        total is reported once the chunker has finished (until then it is unknown, not guessed).
        """
        counts = _Counts()
        embedder = self.models.embedder(model)
        window: list[ChunkDraft] = []
        streaming = False
        for draft in drafts:
            window.append(draft)
            if len(window) == self.window:
                if not streaming:
                    ctx.report(stage=ocr.stage(Stage.EMBEDDING), processed=0)
                    streaming = True
                self._embed_window(ctx, embedder, window, counts, base)
                window = []
        total = counts.processed + len(window)
        if total:
            if streaming:
                ctx.report(total=total)
            else:
                ctx.report(stage=Stage.EMBEDDING, total=total, processed=0)
            self._embed_window(ctx, embedder, window, counts, base)
        log.info(
            "job %s: %d chunks; cache: %d texts embedded, %d reused",
            ctx.job.id,
            total,
            counts.embedded,
            total - counts.embedded,
        )
        return total

    def _embed_window(
        self,
        ctx: JobContext,
        embedder: Embedder,
        window: list[ChunkDraft],
        counts: _Counts,
        base: int,
    ) -> None:
        # Batches of similar length waste no model time on padding; order does not matter
        # because every chunk's id and ordinal are fixed already.
        order = sorted(window, key=lambda d: d.token_count)
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            texts = [d.text for d in batch]
            vectors, fresh = embedder.embed_counted(texts)
            counts.embedded += fresh
            rows = [self._indexed(ctx, d, v, base) for d, v in zip(batch, vectors, strict=True)]
            counts.processed += len(batch)
            ctx.report(processed=counts.processed, work=self._writer(rows, ctx.job.parent_id))

    def _writer(self, rows: list[IndexedChunk], parent_id: str | None) -> Callable[[Tx], None]:
        most = self.limits.max_chunks

        def write(tx: Tx) -> None:
            self.index.upsert(tx, rows)
            if parent_id is not None:  # a part: the limit is the whole document's
                pdf_parts.check_document_chunks(tx, parent_id, most)

        return write

    @staticmethod
    def _indexed(ctx: JobContext, draft: ChunkDraft, vector: Any, base: int) -> IndexedChunk:
        job = ctx.job
        document_id = _document(job)
        ordinal = base + draft.ordinal
        return IndexedChunk(
            id=chunk_id(document_id, job.generation, ordinal),
            document_id=document_id,
            dataset_id=job.dataset_id,
            generation=job.generation,
            ordinal=ordinal,
            text=draft.text,
            content_hash=draft.content_hash,
            token_count=draft.token_count,
            page_start=draft.page_start,
            page_end=draft.page_end,
            section=draft.section,
            vector=vector,
        )

    @staticmethod
    def _record_pages(tx: Tx, ctx: JobContext, pages: int | None) -> None:
        if pages is not None:
            tx.execute(
                update(documents)
                .where(documents.c.id == ctx.job.document_id)
                .values(page_count=pages)
            )


def _document(job: Job) -> str:
    if job.document_id is None:
        raise PermanentError(f"a {job.kind} job names no document", code="internal_error")
    return job.document_id


def _check_model(tx: Tx, dataset_id: str, used: str) -> None:
    """Before the generation is complete: the dataset's model is still the one that embedded
    it (a model changed meanwhile makes the job embed again with the new one, never record old
    vectors under the new model's name)."""
    current = tx.scalar(select(datasets.c.embedding_model).where(datasets.c.id == dataset_id))
    if current is not None and current != used:
        raise TransientError(
            f"the dataset's embedding model changed to {current} while this document was "
            "embedded; it is embedded again with the new model",
            code="model_changed",
        )


@dataclass(slots=True)
class _Counts:
    processed: int = 0  # chunks written
    embedded: int = 0  # texts the model was given (the rest came from the cache)


def _announce(
    drafts: Iterable[ChunkDraft], ctx: JobContext, ocr: OcrTracker
) -> Iterator[ChunkDraft]:
    """Move to the chunking stage once the parser's text has made a first chunk (parsing and
    chunking then stream on together), or once OCR has read its last page."""
    announced = False
    for draft in drafts:
        if not announced:
            ctx.report(stage=ocr.stage(Stage.CHUNKING))
            announced = True
        yield draft
