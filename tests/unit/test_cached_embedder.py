"""CachedEmbedder: known texts cost no model calls, new texts are embedded once, in one call."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from sqlalchemy import func, select

from knowledgeops.db.schema import embedding_cache
from knowledgeops.ingest.embedders.base import Vectors
from knowledgeops.ingest.embedders.cache import (
    CachedEmbedder,
    MemoryEmbeddingCache,
    SqlEmbeddingCache,
)
from knowledgeops.lab.embedders import HashingEmbedder
from knowledgeops.roles.embedded import EmbeddedRole
from knowledgeops.service.search import SearchMode

from ..conftest import wait_for

TEXTS = [
    "ownership rules in rust move values between variables",
    "borrowing lets you refer to a value without taking ownership",
    "the cargo build tool compiles crates and fetches dependencies",
]


class Counting(HashingEmbedder):
    """Remembers every batch it was given."""

    def __init__(self, dimension: int = 64) -> None:
        super().__init__(dimension)
        self.given: list[list[str]] = []

    def embed(self, texts: Sequence[str]) -> Vectors:
        with self._lock:
            self.given.append(list(texts))
        return super().embed(texts)


def cached(dimension: int = 64) -> tuple[CachedEmbedder, Counting]:
    inner = Counting(dimension)
    return CachedEmbedder(inner, MemoryEmbeddingCache()), inner


def test_it_looks_like_its_inner_embedder() -> None:
    embedder, inner = cached(48)
    assert (embedder.model_id, embedder.dimension) == (inner.model_id, 48)
    assert embedder.loaded
    embedder.load()  # the hashing embedder has nothing to load


def test_the_second_embed_of_the_same_texts_makes_no_model_calls() -> None:
    embedder, inner = cached()
    first = embedder.embed(TEXTS)
    assert inner.calls == 1
    second = embedder.embed(TEXTS)
    assert inner.calls == 1
    np.testing.assert_array_equal(first, second)
    assert (embedder.hits, embedder.misses) == (3, 3)


def test_only_new_texts_are_embedded_in_one_call() -> None:
    embedder, inner = cached()
    embedder.embed(TEXTS[:2])
    mixed = [TEXTS[1], "traits define shared behaviour", TEXTS[0], TEXTS[2]]
    embedder.embed(mixed)
    assert inner.given == [TEXTS[:2], ["traits define shared behaviour", TEXTS[2]]]
    assert inner.texts == 4
    assert (embedder.hits, embedder.misses) == (2, 4)


def test_a_text_repeated_within_one_call_is_embedded_once() -> None:
    embedder, inner = cached()
    vectors = embedder.embed([TEXTS[0], TEXTS[1], TEXTS[0], TEXTS[0]])
    assert inner.given == [[TEXTS[0], TEXTS[1]]]
    np.testing.assert_array_equal(vectors[0], vectors[2])
    np.testing.assert_array_equal(vectors[0], vectors[3])


def test_order_shape_and_values_equal_the_uncached_embedder() -> None:
    embedder, _ = cached()
    plain = HashingEmbedder(64)
    embedder.embed([TEXTS[2], "closures capture their environment"])  # some hits, some misses
    texts = ["iterators are lazy", *TEXTS, "closures capture their environment", TEXTS[0]]
    vectors = embedder.embed(texts)
    expected = plain.embed(texts)
    assert vectors.shape == expected.shape == (len(texts), 64)
    assert vectors.dtype == expected.dtype == np.float32
    np.testing.assert_array_equal(vectors, expected)


def test_no_texts_make_no_calls() -> None:
    embedder, inner = cached()
    vectors = embedder.embed([])
    assert vectors.shape == (0, 64)
    assert vectors.dtype == np.float32
    assert inner.calls == 0


def _ingest_then_reindex(runtime: EmbeddedRole, inner: Counting) -> None:
    body = " ".join(f"Sentence {n} explains caching with example {n}." for n in range(120))
    staged = runtime.blobs.stage(10_000_000)
    staged.write(body.encode())
    accepted = runtime.service.uploads.accept(
        "default",
        staged,
        file_name="cache.txt",
        declared_type=None,
        dataset_id=None,
        idempotency_key=None,
    )

    def finished(job_id: str) -> bool:
        return runtime.service.jobs.get("default", job_id).status == "completed"

    wait_for(lambda: finished(accepted.job.id), what="the first ingestion")
    first_calls, first_texts = inner.calls, inner.texts
    assert first_calls > 1  # several batches, so the second run has several chances to call
    reindex_id = runtime.service.documents.reindex("default", accepted.job.document_id)
    wait_for(lambda: finished(reindex_id), what="the reindex")
    assert runtime.service.jobs.get("default", reindex_id).total_chunks == first_texts
    assert (inner.calls, inner.texts) == (first_calls, first_texts)


def test_reindexing_a_document_makes_no_model_calls(
    make_runtime: Callable[..., EmbeddedRole],
) -> None:
    inner = Counting(384)
    runtime = make_runtime(
        embedder=CachedEmbedder(inner, MemoryEmbeddingCache()), workers=1, embed_cache=False
    )
    _ingest_then_reindex(runtime, inner)


def test_the_runtime_caches_in_its_database_by_default(
    make_runtime: Callable[..., EmbeddedRole],
) -> None:
    """Wiring: with the default settings the runtime puts the model behind the SQL cache."""
    inner = Counting(384)
    runtime = make_runtime(embedder=inner, workers=1, embed_cache=True)
    assert isinstance(runtime.embedder, CachedEmbedder)
    assert isinstance(runtime.embedder.cache, SqlEmbeddingCache)
    _ingest_then_reindex(runtime, inner)

    def cached() -> int:
        with runtime.db.read() as conn:
            return int(conn.execute(select(func.count()).select_from(embedding_cache)).scalar_one())

    assert cached() == inner.texts
    # a search embeds its query with the model itself: no cache write per query
    dataset_id = runtime.service.datasets.ensure_default("default").id
    calls = inner.calls
    assert runtime.service.search.search(
        "default", dataset_id, "caching example", top_k=3, mode=SearchMode.VECTOR
    )
    assert inner.calls == calls + 1
    assert cached() == inner.texts - 1
