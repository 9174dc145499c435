"""The embedder every caller uses: texts in, L2-normalised float32 vectors out, one row per text.

`Embedder` declares everything the pipeline, search and the wiring call. Only `embed` must be
written; every other member is a documented default on this class, so a caller never asks
whether a method exists:

    Embedder                      the defaults: nothing to load or close, always loaded, queries
    │                             embedded by the embedder itself, every text embedded afresh
    ├── LocalMiniLM, OnnxMiniLM   the model on this machine's CPU (`local_model`)
    ├── OpenAIEmbedder            a provider over HTTP (its own embedder for queries)
    ├── Fronting                  in front of another embedder: its capabilities are that one's
    │   ├── CachedEmbedder        the embedding cache in front of a model (cache.py)
    │   └── ModelScheduler        one model thread for every worker of a process (scheduler.py)
    └── HashingEmbedder, NullEmbedder   for tests and benchmarks (lab/embedders.py)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

Vectors = npt.NDArray[np.float32]


class Embedder(ABC):
    model_id: str
    dimension: int
    # runs on this machine's CPU: the wiring puts it behind one model thread that every worker
    # of the process shares (ModelScheduler), so batches form across documents
    local_model: bool = False

    @abstractmethod
    def embed(self, texts: Sequence[str]) -> Vectors:
        """Vectors for `texts`, shape (len(texts), dimension), each of unit length."""

    def embed_counted(self, texts: Sequence[str]) -> tuple[Vectors, int]:
        """The vectors, and how many of the texts the model itself was given for them (fewer
        than all when a cache answered for some)."""
        return self.embed(texts), len(texts)

    def load(self) -> None:  # noqa: B027 (a no-op by default, like every hook here)
        """Load the model now, so that the first job or query does not wait for it."""

    @property
    def load_before_ready(self) -> bool:
        """A model that must prove itself before the process is ready (the int8 build and its
        check): loaded at start-up, and its failure stops the start instead of failing every
        job."""
        return False

    @property
    def loaded(self) -> bool:
        """Whether the model is ready (what /readyz shows)."""
        return True

    def for_queries(self) -> Embedder:
        """The embedder a search embeds its query with: past caches (caching every query would
        cost a write per search) and past the model thread (a query must not queue behind
        ingestion's batches)."""
        return self

    def token_lengths(self, texts: Sequence[str]) -> list[int]:
        """A length per text, the order batches are sorted in (padding wastes least when texts
        of like length share a batch); characters unless the model counts tokens."""
        return [len(text) for text in texts]

    def close(self) -> None:  # noqa: B027 (a no-op by default)
        """Give back what the embedder holds (a thread, connections); called at shutdown."""


class Fronting(Embedder):
    """An embedder in front of another (`inner`): every capability is the inner one's unless the
    subclass says otherwise."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dimension = inner.dimension

    @property
    def load_before_ready(self) -> bool:
        return self.inner.load_before_ready

    def load(self) -> None:
        self.inner.load()

    @property
    def loaded(self) -> bool:
        return self.inner.loaded

    def for_queries(self) -> Embedder:
        return self.inner.for_queries()

    def token_lengths(self, texts: Sequence[str]) -> list[int]:
        return self.inner.token_lengths(texts)

    def close(self) -> None:
        self.inner.close()
