"""Embedders for tests and benchmarks, never selectable in settings (`kops serve` always runs a
real model).

- `HashingEmbedder`: a small deterministic embedder for tests whose subject is not embedding
  quality. Vectors come from hashed word features, so texts sharing words are near each other and
  search results can be asserted exactly. It counts calls and texts, so batching is testable.
- `NullEmbedder`: costs nothing, the same unit vector for every text. `kops bench` runs the whole
  service with it to measure everything except the model (the pipeline's own ceiling); search over
  its vectors means nothing.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Sequence

import numpy as np

from knowledgeops.ingest.embedders.base import Embedder, Vectors

_WORD = re.compile(r"\w+", re.UNICODE)


class HashingEmbedder(Embedder):
    """`model_id` and `salt` make another "model": the same kind of vectors, hashed otherwise
    (a dataset changing its model, in tests)."""

    model_id = "test/hashing-embedder"

    def __init__(
        self, dimension: int = 384, *, model_id: str | None = None, salt: str = ""
    ) -> None:
        self.dimension = dimension
        if model_id is not None:
            self.model_id = model_id
        self.salt = salt
        self.calls = 0
        self.texts = 0
        self.batch_sizes: list[int] = []
        self._lock = threading.Lock()

    def vector(self, text: str) -> Vectors:
        v = np.zeros(self.dimension, dtype=np.float32)
        for word in _WORD.findall(text.lower()):
            digest = hashlib.blake2b((self.salt + word).encode(), digest_size=8).digest()
            index = int.from_bytes(digest[:4], "little") % self.dimension
            v[index] += 1.0 if digest[4] & 1 else -1.0
        norm = float(np.linalg.norm(v))
        if norm == 0.0:
            v[0] = 1.0
            return v
        return v / norm

    def embed(self, texts: Sequence[str]) -> Vectors:
        with self._lock:
            self.calls += 1
            self.texts += len(texts)
            self.batch_sizes.append(len(texts))
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return np.stack([self.vector(t) for t in texts])


class NullEmbedder(Embedder):
    model_id = "bench/null-embedder"

    def __init__(self, dimension: int = 384) -> None:
        self.dimension = dimension
        self._unit = np.zeros(dimension, dtype=np.float32)
        self._unit[0] = 1.0

    def embed(self, texts: Sequence[str]) -> Vectors:
        return np.tile(self._unit, (len(texts), 1))
