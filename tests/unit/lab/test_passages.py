"""The search bench's corpus: chunks of real text whose vectors, computed a batch at once, are
exactly what the HashingEmbedder gives for each text, and the same seed gives the same chunks."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from knowledgeops.lab.bench.passages import PIECE_WORDS, PIECES, Passages, faq_pages
from knowledgeops.lab.embedders import HashingEmbedder

EVAL = Path(__file__).resolve().parents[3] / "eval"


def test_batch_vectors_are_the_hashing_embedders() -> None:
    pages = faq_pages(EVAL)
    assert len(pages) > 50  # every language's pages
    passages = Passages(pages, 64, salt="s")
    embedder = HashingEmbedder(64, salt="s")
    (batch,) = list(passages.batches(300, seed=3, size=300))
    assert len(batch.texts) == 300
    for body, vector in zip(batch.texts, batch.vectors, strict=True):
        assert len(body.split()) == PIECES * PIECE_WORDS
        np.testing.assert_allclose(vector, embedder.vector(body), atol=1e-6)


def test_the_same_seed_gives_the_same_chunks_and_chunks_differ() -> None:
    passages = Passages(faq_pages(EVAL), 32)
    first = [t for b in passages.batches(500, seed=5, size=200) for t in b.texts]
    again = [t for b in passages.batches(500, seed=5, size=200) for t in b.texts]
    assert first == again
    assert len(first) == 500
    assert len(set(first)) == 500
    other = [t for b in passages.batches(500, seed=6) for t in b.texts]
    assert not set(first) & set(other)
