"""The model's own limit: the embedder alone on exactly the chunks the pipeline produced.

Same model, same threads, same batch size as the service, all chunks sorted by token length at
once and cut into batches of like length (the model's best case: the service only ever sees the
chunks of the documents in work), no parsing, no database, no HTTP. End-to-end chunks/s divided
by this is the share of the model's best the service achieves.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from knowledgeops.ingest.embedders.local import MODEL_ID, LocalMiniLM
from knowledgeops.ingest.embedders.onnx_int8 import OnnxMiniLM
from knowledgeops.ingest.embedders.scheduler import length_batches


@dataclass
class RawFigures:
    chunks: int
    distinct_texts: int
    tokens: int
    seconds: float
    chunks_per_s: float
    model_threads: int
    batch_size: int
    model: str
    vectors: Any = field(default=None, repr=False)  # kept for the int8 comparison, not reported


@dataclass
class Int8Figures:
    chunks: int
    seconds: float
    chunks_per_s: float
    speedup_vs_fp32: float
    mean_cosine_to_fp32: float  # over exactly the pipeline's chunks
    min_cosine_to_fp32: float
    build: dict[str, object]


def run_int8(
    chunks: list[tuple[str, int]], fp32: RawFigures, *, threads: int, batch_size: int
) -> Int8Figures:
    """The int8 variant on the same chunks, batched the same way: speed, and how close its
    vectors are to the fp32 model's on these real chunks."""

    with tempfile.TemporaryDirectory(prefix="kops-bench-int8-") as folder:
        model = OnnxMiniLM(Path(folder), threads=threads)
        model.load()  # warms up too, as the service's does before it reports the model loaded
        texts = [text for text, _ in chunks]
        batches = length_batches(model.token_lengths(texts), batch_size)
        vectors = np.zeros((len(texts), model.dimension), dtype=np.float32)
        began = time.perf_counter()
        for batch in batches:
            vectors[batch] = model.embed([texts[i] for i in batch])
        seconds = time.perf_counter() - began
        cosine = (vectors * fp32.vectors).sum(axis=1)
        return Int8Figures(
            chunks=len(texts),
            seconds=round(seconds, 2),
            chunks_per_s=round(len(texts) / seconds, 1),
            speedup_vs_fp32=round(fp32.seconds / seconds, 2),
            mean_cosine_to_fp32=round(float(cosine.mean()), 4),
            min_cosine_to_fp32=round(float(cosine.min()), 4),
            build=dict(model.check),
        )


def run_raw(chunks: list[tuple[str, int]], *, threads: int, batch_size: int) -> RawFigures:

    model = LocalMiniLM(threads=threads)
    model.load()
    batches = length_batches(model.token_lengths([text for text, _ in chunks]), batch_size)
    vectors = np.zeros((len(chunks), model.dimension), dtype=np.float32)
    began = time.perf_counter()
    for batch in batches:
        vectors[batch] = model.embed([chunks[i][0] for i in batch])
    seconds = time.perf_counter() - began
    return RawFigures(
        chunks=len(chunks),
        distinct_texts=len({text for text, _ in chunks}),
        tokens=sum(tokens for _, tokens in chunks),
        seconds=round(seconds, 2),
        chunks_per_s=round(len(chunks) / seconds, 1) if seconds else 0.0,
        model_threads=model.threads,
        batch_size=batch_size,
        model=MODEL_ID,
        vectors=vectors,
    )
