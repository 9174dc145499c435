"""The real all-MiniLM-L6-v2, loaded offline from its pip package."""

from __future__ import annotations

import numpy as np
import pytest

from knowledgeops.ingest.embedders.local import DIMENSION, LocalMiniLM

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
