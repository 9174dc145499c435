"""The embedder protocol: texts in, L2-normalised float32 vectors out, one row per text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

Vectors = npt.NDArray[np.float32]


class Embedder(Protocol):
    model_id: str
    dimension: int

    def embed(self, texts: Sequence[str]) -> Vectors:
        """Vectors for `texts`, shape (len(texts), dimension), each of unit length."""
        ...
