"""The real all-MiniLM-L6-v2, loaded offline from its pip package."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from knowledgeops.ingest.embedders.local import DIMENSION, LocalMiniLM
from knowledgeops.ingest.embedders.scheduler import ModelScheduler

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def model() -> LocalMiniLM:
    embedder = LocalMiniLM(threads=2)
    embedder.load()
    return embedder


def test_vectors_have_the_model_shape_and_unit_length(model: LocalMiniLM) -> None:
    vectors = model.embed(["The cat sits on the mat.", "Ownership in Rust."])
    assert vectors.shape == (2, DIMENSION)
    assert vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert model.embed([]).shape == (0, DIMENSION)


def test_meaning_is_closer_than_words(model: LocalMiniLM) -> None:
    query, paraphrase, unrelated = model.embed(
        [
            "How do I stop a background job that is running?",
            "Cancelling a task that is currently executing in the worker.",
            "The recipe needs two cups of flour and an egg.",
        ]
    )
    assert float(query @ paraphrase) > float(query @ unrelated) + 0.2


def test_batching_does_not_change_vectors(model: LocalMiniLM) -> None:
    texts = ["short", "a somewhat longer sentence about embeddings and batching"]
    together = model.embed(texts)
    alone = np.stack([model.embed([t])[0] for t in texts])
    assert np.allclose(together, alone, atol=1e-5)
    assert model.calls >= 3


def test_the_scheduler_gives_each_document_the_vectors_of_its_texts_alone(
    model: LocalMiniLM,
) -> None:
    """Chunks of several documents merged into length-sorted batches get the same vectors as each
    document embedded on its own (the model masks padding), and token counts order them."""

    documents = [
        ["Ownership rules in Rust.", "Each value has an owner; when it goes out of scope, drop."],
        ["Borrowing lets code use a value without taking it. " * 6],
        ["Lifetimes.", "A reference must not outlive its referent.", "Generic lifetimes."],
    ]
    scheduler = ModelScheduler(model, batch_size=4, nice=0)
    try:
        with ThreadPoolExecutor(3) as pool:
            merged = list(pool.map(scheduler.embed, documents))
    finally:
        scheduler.close()
    for texts, vectors in zip(documents, merged, strict=True):
        assert np.allclose(vectors, model.embed(texts), atol=1e-5)
    assert model.token_lengths(["a", "a b c d"]) == [3, 6]  # with [CLS] and [SEP]
