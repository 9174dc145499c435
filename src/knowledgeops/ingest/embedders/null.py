"""An embedder that costs nothing: the same unit vector for every text.

`kops bench` runs the whole service with it to measure everything except the model (the
pipeline's own ceiling). It is never selectable in settings: search over its vectors means nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from knowledgeops.ingest.embedders.base import Vectors


class NullEmbedder:
    model_id = "bench/null-embedder"

    def __init__(self, dimension: int = 384) -> None:
        self.dimension = dimension
        self._unit = np.zeros(dimension, dtype=np.float32)
        self._unit[0] = 1.0

    def embed(self, texts: Sequence[str]) -> Vectors:
        return np.tile(self._unit, (len(texts), 1))
