"""The model's own limit: the embedder alone on exactly the chunks the pipeline produced.

Same model, same threads, same batch size as the service, all chunks sorted by token length at
once and cut into batches of like length (the model's best case: the service only ever sees the
chunks of the documents in work), no parsing, no database, no HTTP. End-to-end chunks/s divided
by this is the share of the model's best the service achieves.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


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


def run_raw(chunks: list[tuple[str, int]], *, threads: int, batch_size: int) -> RawFigures:
    from knowledgeops.ingest.embedders.local import MODEL_ID, LocalMiniLM
    from knowledgeops.ingest.embedders.scheduler import length_batches

    model = LocalMiniLM(threads=threads)
    model.load()
    model.embed(["warm-up"])  # the first call pays one-off costs the service paid before ready
    batches = length_batches(model.token_lengths([text for text, _ in chunks]), batch_size)
    began = time.perf_counter()
    for batch in batches:
        model.embed([chunks[i][0] for i in batch])
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
    )
