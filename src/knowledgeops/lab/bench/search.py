"""`kops bench search`: search latency of the embedded default at a given number of chunks.

Ingesting 10,000 chunks with the real model would take a quarter of an hour on 2 cores and
measure ingestion, not search; so a fresh `kops serve` is started with the real model, and its
dataset is filled directly through the service's own index (`SqliteIndex.upsert` and
`activate`, the calls a job makes) with chunks of real text (the Debian FAQ's English pages, cut
into passages and shuffled into new ones) and unit vectors of the model's dimension. Then every
FAQ question is asked over HTTP in each mode, the query embedded by the real model, and the
client's latency is reported (p50, p95, p99): what a caller of the search API waits.
"""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from sqlalchemy import insert

from knowledgeops.db.engine import Database
from knowledgeops.db.schema import documents
from knowledgeops.ingest.index.base import IndexedChunk, chunk_id, text_hash
from knowledgeops.ingest.index.sqlite import SqliteIndex
from knowledgeops.lab.bench.endtoend import EmbeddedServer, connect, percentile
from knowledgeops.lab.eval import baselines
from knowledgeops.lab.eval.collections import Collection, load

CHUNKS_PER_DOCUMENT = 100
WORDS_PER_CHUNK = 150
MODES = ("vector", "keyword", "hybrid")


@dataclass
class SearchFigures:
    chunks: int
    questions: int
    top_k: int
    seed_s: float
    latency_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # mode → p50/p95/p99


def _english(root: Path) -> Collection:
    (english,) = [c for c in load(root, only=["debian-faq-en"]) if c.name == "debian-faq-en"]
    return english


def _texts(root: Path, count: int, rng: random.Random) -> list[str]:
    english = _english(root)
    words = [w for path in english.documents for w in baselines.body_text(path).split()]
    out = []
    for _ in range(count):
        start = rng.randrange(0, max(1, len(words) - WORDS_PER_CHUNK))
        out.append(" ".join(words[start : start + WORDS_PER_CHUNK]))
    return out


def _seed(db_path: Path, dataset_id: str, texts: list[str], dimension: int, model: str) -> None:
    db = Database(f"sqlite:///{db_path}")
    index = SqliteIndex(db, dimension)
    rng = np.random.default_rng(7)
    try:
        for first in range(0, len(texts), CHUNKS_PER_DOCUMENT):
            document_id = str(uuid.uuid4())
            part = texts[first : first + CHUNKS_PER_DOCUMENT]
            vectors = rng.normal(size=(len(part), dimension)).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            with db.write() as tx:
                tx.execute(
                    insert(documents).values(
                        id=document_id,
                        dataset_id=dataset_id,
                        file_name=f"seeded-{first // CHUNKS_PER_DOCUMENT}.txt",
                        file_size=sum(len(t) for t in part),
                        content_type="text/plain",
                        sha256=document_id,
                        blob_key=document_id,
                        status="ready",
                        embedding_model=model,  # as a job's completion records it
                    )
                )
                index.upsert(
                    tx,
                    [
                        IndexedChunk(
                            id=chunk_id(document_id, 1, n),
                            document_id=document_id,
                            dataset_id=dataset_id,
                            generation=1,
                            ordinal=n,
                            text=body,
                            content_hash=text_hash(body),
                            token_count=WORDS_PER_CHUNK,
                            page_start=None,
                            page_end=None,
                            section=None,
                            vector=vectors[n],
                        )
                        for n, body in enumerate(part)
                    ],
                )
                index.activate(tx, document_id, 1)
    finally:
        db.dispose()


def run_search_bench(root: Path, *, chunks: int, top_k: int = 5, rounds: int = 2) -> SearchFigures:
    rng = random.Random(7)
    texts = _texts(root, chunks, rng)
    questions = [q.query for q in _english(root).questions]
    server = EmbeddedServer(workers=1, env={"KOPS_MODEL_VARIANT": "fp32"})
    with server, connect(server.url, server.started, server.log) as (client, _):
        created = client.post("/datasets", json={"name": "search-bench"})
        created.raise_for_status()
        dataset = created.json()
        began = time.perf_counter()
        dimension = client.get("/models").json()[0]["dimension"]
        _seed(
            server.data_dir / "kops.db", dataset["id"], texts, dimension, dataset["embeddingModel"]
        )
        figures = SearchFigures(
            chunks=chunks,
            questions=len(questions),
            top_k=top_k,
            seed_s=round(time.perf_counter() - began, 1),
        )
        for mode in MODES:  # a first pass warms the model and SQLite's page cache
            for query in questions[:10]:
                client.post(
                    f"/datasets/{dataset['id']}/search",
                    json={"query": query, "topK": top_k, "mode": mode},
                ).raise_for_status()
        for mode in MODES:
            took = []
            for _ in range(rounds):
                for query in questions:
                    t0 = time.perf_counter()
                    response = client.post(
                        f"/datasets/{dataset['id']}/search",
                        json={"query": query, "topK": top_k, "mode": mode},
                    )
                    took.append((time.perf_counter() - t0) * 1000)
                    response.raise_for_status()
            figures.latency_ms[mode] = {
                f"p{q}": round(percentile(took, q), 1) for q in (50, 95, 99)
            }
    return figures
