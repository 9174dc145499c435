"""`ChunkIndex` in memory: brute-force cosine and a small BM25, the twin for unit tests.

Held to `SqliteIndex`'s behaviour by the shared contract suite (tests/contract/test_index.py).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from knowledgeops.db.engine import Tx
from knowledgeops.ingest.index.base import Hit, IndexedChunk
from knowledgeops.ingest.index.filters import SearchFilter
from knowledgeops.ingest.index.terms import index_text, query_terms

BM25_K1 = 1.2
BM25_B = 0.75
_WORDS = re.compile(r"\w+")


class MemoryIndex:
    """`tx` is ignored: there is no database (the in-memory job store hands None). What a
    search filter asks of a document (its type and metadata) is told with `describe`, as the
    documents table tells the SQL engines."""

    def __init__(self) -> None:
        self.chunks: dict[str, IndexedChunk] = {}
        self.active: dict[str, int] = {}  # document id → its searchable generation
        # id → (type, metadata, model of its searchable generation)
        self.documents: dict[str, tuple[str, dict[str, Any], str | None]] = {}
        self._lock = threading.RLock()

    def describe(
        self,
        document_id: str,
        content_type: str,
        metadata: dict[str, Any],
        model: str | None = None,
    ) -> None:
        with self._lock:
            self.documents[document_id] = (content_type, metadata, model)

    def ensure(self) -> None:
        """Nothing to create: the dictionaries are the index."""

    def verify(self) -> None:
        """Nothing to check: the dictionaries are the index."""

    def close(self) -> None:
        """Nothing to release: the chunks live as long as the object."""

    def upsert(self, tx: Tx | None, chunks: Sequence[IndexedChunk]) -> None:
        with self._lock:
            for chunk in chunks:
                self.chunks[chunk.id] = chunk

    def activate(self, tx: Tx | None, document_id: str, generation: int) -> int:
        with self._lock:
            self._drop(lambda c: c.document_id == document_id and c.generation != generation)
            self.active[document_id] = generation
            return sum(
                1
                for c in self.chunks.values()
                if c.document_id == document_id and c.generation == generation
            )

    def discard(
        self,
        tx: Tx | None,
        document_id: str,
        generation: int,
        ordinals: tuple[int, int] | None = None,
    ) -> None:
        first, end = ordinals if ordinals is not None else (0, 2**31)
        with self._lock:
            self._drop(
                lambda c: (
                    c.document_id == document_id
                    and c.generation == generation
                    and first <= c.ordinal < end
                )
            )

    def delete_document(self, tx: Tx | None, document_id: str) -> None:
        with self._lock:
            self._drop(lambda c: c.document_id == document_id)
            self.active.pop(document_id, None)

    def delete_dataset(self, tx: Tx | None, dataset_id: str) -> None:
        with self._lock:
            gone = {c.document_id for c in self.chunks.values() if c.dataset_id == dataset_id}
            self._drop(lambda c: c.dataset_id == dataset_id)
            for document_id in gone:
                self.active.pop(document_id, None)

    def _drop(self, doomed: Any) -> None:
        for chunk_id in [cid for cid, c in self.chunks.items() if doomed(c)]:
            del self.chunks[chunk_id]

    def _live(self, dataset_id: str, where: SearchFilter | None = None) -> list[IndexedChunk]:
        return [
            c
            for c in self.chunks.values()
            if c.dataset_id == dataset_id
            and self.active.get(c.document_id) == c.generation
            and self._admits(c.document_id, where)
        ]

    def _admits(self, document_id: str, where: SearchFilter | None) -> bool:
        if where is None or where.empty:
            return True
        content_type, metadata, model = self.documents.get(document_id, ("", {}, None))
        return where.admits(document_id, content_type, metadata, model)

    def scans_every_core(self, dataset_id: str, where: SearchFilter | None = None) -> bool:
        """Never: a search scores its dataset's chunks on the calling thread."""
        return False

    def search_vector(
        self,
        dataset_id: str,
        vector: npt.NDArray[np.float32],
        k: int,
        where: SearchFilter | None = None,
        *,
        fused: bool = False,  # exact either way
    ) -> list[Hit]:
        with self._lock:
            live = self._live(dataset_id, where)
        scored = [(float(np.dot(c.vector, vector)), c) for c in live]
        scored.sort(key=lambda pair: -pair[0])
        return [_hit(c, score) for score, c in scored[:k]]

    def search_keyword(
        self, dataset_id: str, query: str, k: int, where: SearchFilter | None = None
    ) -> list[Hit]:
        terms = query_terms(query)
        with self._lock:
            live = self._live(dataset_id, where)
        if not terms or not live:
            return []
        words = [_WORDS.findall(index_text(c.text).lower()) for c in live]
        tfs = [{term: _occurrences(term.split(), w) for term in terms} for w in words]
        df = {term: sum(1 for tf in tfs if tf[term]) for term in terms}
        average = sum(len(w) for w in words) / len(words)
        scored = []
        for chunk, w, tf in zip(live, words, tfs, strict=True):
            score = 0.0
            for term in terms:
                if not tf[term]:
                    continue
                idf = math.log(1 + (len(live) - df[term] + 0.5) / (df[term] + 0.5))
                norm = tf[term] + BM25_K1 * (1 - BM25_B + BM25_B * len(w) / average)
                score += idf * tf[term] * (BM25_K1 + 1) / norm
            if score > 0:
                scored.append((score, chunk))
        scored.sort(key=lambda pair: -pair[0])
        return [_hit(c, score) for score, c in scored[:k]]


def _occurrences(phrase: list[str], words: list[str]) -> int:
    n = len(phrase)
    return sum(1 for i in range(len(words) - n + 1) if words[i : i + n] == phrase)


def _hit(chunk: IndexedChunk, score: float) -> Hit:
    return Hit(
        chunk.id,
        chunk.document_id,
        chunk.ordinal,
        chunk.text,
        chunk.page_start,
        chunk.page_end,
        chunk.section,
        score,
    )
