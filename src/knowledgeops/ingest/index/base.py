"""The chunk index protocol: write a generation, make it searchable, search by vector or words.

A document's chunks are written as a generation that stays invisible to search until `activate`
switches the document to it (in the transaction that completes the job) and drops the others.
Three implementations share one contract suite (tests/contract/test_index.py): `SqliteIndex`
(sqlite-vec + FTS5), `PgVectorIndex` (pgvector + tsvector) and `MemoryIndex`. How a query becomes
terms (CJK, stop words) is in terms.py.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from knowledgeops.db.engine import Tx
from knowledgeops.ingest.index.filters import SearchFilter


@dataclass(frozen=True, slots=True)
class IndexedChunk:
    id: str
    document_id: str
    dataset_id: str
    generation: int
    ordinal: int
    text: str
    content_hash: str
    token_count: int
    page_start: int | None
    page_end: int | None
    section: str | None
    vector: npt.NDArray[np.float32]


def chunk_row(chunk: IndexedChunk) -> dict[str, Any]:
    """The `chunks` table row of an indexed chunk (its vector goes to the engine's own table)."""
    return {
        "id": chunk.id,
        "document_id": chunk.document_id,
        "dataset_id": chunk.dataset_id,
        "generation": chunk.generation,
        "ordinal": chunk.ordinal,
        "text": chunk.text,
        "content_hash": chunk.content_hash,
        "token_count": chunk.token_count,
        "page_start": chunk.page_start,
        "page_end": chunk.page_end,
        "section": chunk.section,
    }


@dataclass(frozen=True, slots=True)
class Hit:
    chunk_id: str
    document_id: str
    ordinal: int
    text: str
    page_start: int | None
    page_end: int | None
    section: str | None
    score: float


class ChunkIndex(Protocol):
    def scans_every_core(self, dataset_id: str, where: SearchFilter | None = None) -> bool:
        """A vector search of the dataset (through `where`) will take every core of this
        process (the embedded index scans a large dataset's lists on all of them): a hybrid
        search then looks its words up before it, never beside it, where the two would only
        take turns on the cores and the scan waits for its slowest thread."""
        ...

    def ensure(self) -> None:
        """Create the index's tables (and what they need) if missing; idempotent (every
        embedded start and `kops migrate` run it). Raises IndexUnavailable with what to do."""
        ...

    def verify(self) -> None:
        """Check, without creating anything, that the index's tables exist (a scale-out process
        starts only then). Raises IndexUnavailable with what to do."""
        ...

    def close(self) -> None:
        """Release what the index keeps in this process (the embedded one snapshots its
        graphs); the process stops using it."""
        ...

    def upsert(self, tx: Tx, chunks: Sequence[IndexedChunk]) -> None:
        """Insert or overwrite chunks by id (a retried batch replaces its own rows)."""
        ...

    def activate(self, tx: Tx, document_id: str, generation: int) -> int:
        """Make `generation` the document's searchable one, drop all others; returns its size."""
        ...

    def discard(
        self, tx: Tx, document_id: str, generation: int, ordinals: tuple[int, int] | None = None
    ) -> None:
        """Drop a generation that will never be activated (its job failed or was cancelled);
        with `ordinals` (first, end), only its chunks in that range (what an earlier attempt of
        one part of a split job wrote)."""
        ...

    def delete_document(self, tx: Tx, document_id: str) -> None: ...

    def delete_dataset(self, tx: Tx, dataset_id: str) -> None: ...

    def search_vector(
        self,
        dataset_id: str,
        vector: npt.NDArray[np.float32],
        k: int,
        where: SearchFilter | None = None,
        *,
        fused: bool = False,
    ) -> list[Hit]:
        """The k nearest active chunks by cosine similarity (score in [-1, 1], higher is nearer),
        among the documents `where` admits (filters.py). `fused`: the list is one of the two a
        hybrid search fuses, where what must be right is the fused top k, not this list's
        order: an approximate index may walk a shorter way for it (docs/architecture.md)."""
        ...

    def search_keyword(
        self, dataset_id: str, query: str, k: int, where: SearchFilter | None = None
    ) -> list[Hit]:
        """The k best active chunks by BM25 over the query's words (score: higher is better),
        among the documents `where` admits."""
        ...


_NAMESPACE = uuid.UUID("5f1d0c52-8f7e-4c3a-9a51-7d0e8f1b2c3d")


def chunk_id(document_id: str, generation: int, ordinal: int) -> str:
    """Stable: the same (document, generation, ordinal) always gets the same id
    (docs/architecture.md: Exactly-once effects and generations)."""
    return str(uuid.uuid5(_NAMESPACE, f"{document_id}/{generation}/{ordinal}"))


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
