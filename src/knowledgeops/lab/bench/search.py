"""`kops bench search --chunks N`: what searching a knowledge base of N chunks costs, in both
topologies, and how near the approximate vector search comes to exact.

The subject is the index, so the chunks are real text (passages.py: pieces of the Debian FAQ in
its seven languages) embedded by the cheap deterministic `HashingEmbedder`, written through the
index's own calls (`upsert` and `activate`, what a job does) into a fresh database: a SQLite file
(the embedded default) or a local PostgreSQL 16 with pgvector (the scale-out one, from
`pgserver`). Two datasets share the index, 90% and 10% of the chunks; every search is scoped to
one of them (as every API search is), and half of the documents carry `shelf: 0` for the
filtered runs. The questions are the FAQ's own, in every language.

Reported per topology: the time to write the chunks and to build the approximate index (the
embedded graphs, pgvector's HNSW), disk, the memory the index holds, p50/p95 of vector, keyword
and hybrid search (hybrid as the search service runs it: words and vectors at once, fused by
score) for both datasets with and without the filter (a second pass over the questions, as a
server in service answers; the first pass, which reads the index's pages in, is kept as
`first_pass_ms`), and recall@10 of vector search against
exact cosine over the same chunks (numpy; a hit counts when its exact score reaches the tenth
best's, so ties do not count as misses). Latency is the index's own, in process: the query
embedding and HTTP are left out (they do not grow with the corpus).
"""

from __future__ import annotations

import collections
import math
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
from rich.table import Table
from sqlalchemy import insert, text

from knowledgeops.cpu import other_work
from knowledgeops.db.engine import Database
from knowledgeops.db.migrate import upgrade
from knowledgeops.db.schema import datasets, documents
from knowledgeops.ingest.embedders.local import LocalMiniLM, load_tokenizer
from knowledgeops.ingest.index import graphs, lists, pgvector, rarest_first, terms, vector_rows
from knowledgeops.ingest.index.admitted import Way
from knowledgeops.ingest.index.base import ChunkIndex, Hit, IndexedChunk, chunk_id, text_hash
from knowledgeops.ingest.index.filters import SearchFilter
from knowledgeops.ingest.index.keys import dataset_key
from knowledgeops.ingest.index.pgvector import PgVectorIndex
from knowledgeops.ingest.index.sqlite import SqliteIndex
from knowledgeops.jobs.priority import lower_priority
from knowledgeops.lab.bench.endtoend import percentile
from knowledgeops.lab.bench.memory import rss_mb
from knowledgeops.lab.bench.passages import Passages, faq_pages
from knowledgeops.lab.devpg import LocalPostgres, free_port
from knowledgeops.lab.embedders import HashingEmbedder
from knowledgeops.lab.eval.collections import load
from knowledgeops.service.search import score_fusion, words_first
from knowledgeops.settings import Settings

DIMENSION = 384  # the default model's
CHUNKS_PER_DOCUMENT = 100
DOCUMENTS_PER_TX = 20
SMALL_SHARE = 0.1  # of the chunks in the second dataset
TOP_K = 10
HYBRID_CANDIDATES = 40  # what the search service asks each list for at topK 10
VECTOR_WEIGHT = 0.5
TOPOLOGIES = ("embedded", "scale-out")
MODE_BUDGET_S = 60.0  # a mode slower than this over its questions stops at MIN_QUESTIONS or more
MIN_QUESTIONS = 30
# a million chunks' graphs took 2,788 s on 2 cores with nothing else running
BUILD_LIMIT_S = 3 * 3600.0
COUNT_REPEATS = 20  # fresh counts timed per dataset and filter (_count_cost)
SHELF = SearchFilter(metadata=(("shelf", (0,)),))
# hybrid searches by the order of their lists (True: the words first, in turn; both_lists)
IN_TURN: collections.Counter[bool] = collections.Counter()
_IDS = uuid.UUID("0b9e55a4-2a43-4a7e-9c2e-5e4d3c2b1a09")  # documents and datasets: the same ids
# in every run, so a kept database (--keep) is the corpus regenerated in memory


@dataclass
class SearchFigures:
    topology: str
    chunks: int
    questions: int
    write_s: float = 0.0
    index_build_s: float = 0.0  # the graphs (embedded) or CREATE INDEX … hnsw (scale-out)
    disk_mb: float = 0.0
    index_memory_mb: float = 0.0
    # "<dataset> <mode>[ filtered]" → p50/p95 ms
    latency_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    recall_at_10: dict[str, float] = field(default_factory=dict)  # "<dataset>[ filtered]"
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class Corpus:
    """What was written: every chunk's vector, dataset and shelf, by the chunk's id."""

    vectors: npt.NDArray[np.float32]
    row_of: dict[str, int]
    dataset_of: npt.NDArray[np.int8]  # 0: the large dataset, 1: the small one
    shelf_zero: npt.NDArray[np.bool_]


def _document(tx: Any, document_id: str, dataset_id: str, size: int, shelf: int) -> None:
    """The document row a job's upload would have made."""
    tx.execute(
        insert(documents).values(
            id=document_id,
            dataset_id=dataset_id,
            file_name=f"{document_id}.txt",
            file_size=size,
            content_type="text/plain",
            sha256=document_id,
            blob_key=document_id,
            status="ready",
            meta={"shelf": shelf},
            embedding_model=HashingEmbedder.model_id,
        )
    )


def _chunk(document_id: str, dataset_id: str, n: int, body: str, vector: Any) -> IndexedChunk:
    return IndexedChunk(
        id=chunk_id(document_id, 1, n),
        document_id=document_id,
        dataset_id=dataset_id,
        generation=1,
        ordinal=n,
        text=body,
        content_hash=text_hash(body),
        token_count=len(body.split()),
        page_start=None,
        page_end=None,
        section=None,
        vector=vector,
    )


def _questions(root: Path) -> list[str]:
    return [q.query for collection in load(root) for q in collection.questions]


def _write(
    index: ChunkIndex,
    db: Database,
    passages: Passages,
    chunks: int,
    dataset_ids: Sequence[str],
    *,
    write: bool = True,
) -> Corpus:
    """Write `chunks` chunks into the two datasets (or, with `write` False, only make the
    corpus in memory: a kept database already holds it)."""
    rng = np.random.default_rng(11)
    vectors = np.zeros((chunks, DIMENSION), dtype=np.float32)
    row_of: dict[str, int] = {}
    dataset_of = np.zeros(chunks, dtype=np.int8)
    shelf_zero = np.zeros(chunks, dtype=np.bool_)
    row = 0
    pending: list[tuple[str, str, list[IndexedChunk], int]] = []

    def flush() -> None:
        if not write:
            pending.clear()
            return
        with db.write() as tx:
            for document_id, dataset_id, part, shelf in pending:
                _document(tx, document_id, dataset_id, sum(len(c.text) for c in part), shelf)
                index.upsert(tx, part)
                index.activate(tx, document_id, 1)
        pending.clear()

    for batch in passages.batches(chunks, seed=7, size=CHUNKS_PER_DOCUMENT * DOCUMENTS_PER_TX):
        for first in range(0, len(batch.texts), CHUNKS_PER_DOCUMENT):
            document_id = str(uuid.uuid5(_IDS, f"document-{row}"))
            small = rng.random() < SMALL_SHARE
            shelf = int(rng.integers(0, 2))
            dataset_id = dataset_ids[1 if small else 0]
            part = []
            for n, body in enumerate(batch.texts[first : first + CHUNKS_PER_DOCUMENT]):
                vector = batch.vectors[first + n]
                part.append(_chunk(document_id, dataset_id, n, body, vector))
                vectors[row] = vector
                row_of[part[-1].id] = row
                dataset_of[row] = 1 if small else 0
                shelf_zero[row] = shelf == 0
                row += 1
            pending.append((document_id, dataset_id, part, shelf))
        flush()
    return Corpus(vectors[:row], row_of, dataset_of[:row], shelf_zero[:row])


def _datasets(db: Database, *, write: bool = True) -> list[str]:
    ids = [str(uuid.uuid5(_IDS, f"dataset-{n}")) for n in range(2)]
    if not write:
        return ids
    with db.write() as tx:
        for n, dataset_id in enumerate(ids):
            tx.execute(
                insert(datasets).values(
                    id=dataset_id,
                    name=f"search-bench-{n}",
                    embedding_model=HashingEmbedder.model_id,
                    chunk_size=200,
                    chunk_overlap=20,
                )
            )
    return ids


def _measure(
    figures: SearchFigures,
    index: ChunkIndex,
    corpus: Corpus,
    dataset_ids: Sequence[str],
    questions: Sequence[str],
    embedder: HashingEmbedder,
) -> None:
    vectors = [embedder.vector(q) for q in questions]
    chunk_ids = _chunk_ids(corpus)
    pool = ThreadPoolExecutor(2, thread_name_prefix="bench-search")
    for n, dataset_id in enumerate(dataset_ids):
        name = "large" if n == 0 else "small"
        in_dataset = corpus.dataset_of == n
        for where in (None, SHELF):
            label = name + ("" if where is None else " filtered")
            admitted = in_dataset & (corpus.shelf_zero if where is not None else True)
            rows = np.nonzero(admitted)[0]
            # exact: the tenth best cosine of each question among the admitted chunks, and
            # the best HYBRID_CANDIDATES (the vector list an exact index would fuse)
            tenth: list[float] = []
            exact_lists: list[list[Hit]] = []
            for start in range(0, len(vectors), 50):
                block = np.stack(vectors[start : start + 50]) @ corpus.vectors[rows].T
                k = min(TOP_K, block.shape[1])
                tenth.extend((-np.partition(-block, k - 1, axis=1)[:, k - 1]).tolist())
                exact_lists.extend(_best_hits(block, rows, chunk_ids, HYBRID_CANDIDATES))
            lists: dict[int, tuple[list[Hit], list[Hit]]] = {}

            def vector_search(
                q: int, w: SearchFilter | None = where, d: str = dataset_id
            ) -> list[Hit]:
                return index.search_vector(d, vectors[q], TOP_K, w)

            def keyword(q: int, w: SearchFilter | None = where, d: str = dataset_id) -> list[Hit]:
                return index.search_keyword(d, questions[q], TOP_K, w)

            def hybrid(
                q: int,
                w: SearchFilter | None = where,
                d: str = dataset_id,
                kept: dict[int, tuple[list[Hit], list[Hit]]] = lists,
            ) -> list[Hit]:
                kept[q] = both_lists(
                    index,
                    pool,
                    lambda: index.search_keyword(d, questions[q], HYBRID_CANDIDATES, w),
                    lambda: index.search_vector(d, vectors[q], HYBRID_CANDIDATES, w, fused=True),
                    d,
                    w,
                )
                return score_fusion(questions[q], *kept[q], VECTOR_WEIGHT, TOP_K)

            modes: dict[str, Callable[[int], list[Hit]]] = {
                "vector": vector_search,
                "keyword": keyword,
                "hybrid": hybrid,
            }
            for mode, call in modes.items():
                # a first pass reads the index's pages in (after a restart, from disk or the
                # page cache into PostgreSQL's shared buffers); the second is a server's in
                # service, the figure reported; the first is kept beside it
                first, _ = _passed(call, len(questions))
                IN_TURN.clear()
                took, found = _passed(call, len(questions))
                figures.latency_ms[f"{label} {mode}"] = _figures(took)
                if mode == "hybrid":  # how many of the reported searches ran their lists in turn
                    in_turn = figures.settings.setdefault("hybrid_lists_in_turn", {})
                    in_turn[label] = f"{IN_TURN[True]}/{IN_TURN[True] + IN_TURN[False]}"
                figures.settings.setdefault("first_pass_ms", {})[f"{label} {mode}"] = _figures(
                    first
                )
                if mode == "vector":
                    recall = []
                    for q, hits in enumerate(found):
                        wanted = min(TOP_K, len(rows))
                        good = len(
                            [
                                hit
                                for hit in hits[:TOP_K]
                                if float(corpus.vectors[corpus.row_of[hit.chunk_id]] @ vectors[q])
                                >= tenth[q] - 1e-5
                                and admitted[corpus.row_of[hit.chunk_id]]
                            ]
                        )
                        recall.append(good / wanted)
                    figures.recall_at_10[label] = round(float(np.mean(recall)), 4)
                if mode == "hybrid":
                    # the fused top 10 against the one the same keyword list fuses into with
                    # the exact vector list
                    same = []
                    for q, hits in enumerate(found):
                        exact = score_fusion(
                            questions[q], exact_lists[q], lists[q][1], VECTOR_WEIGHT
                        )[:TOP_K]
                        fused = {hit.chunk_id for hit in exact}
                        if fused:
                            same.append(len(fused & {hit.chunk_id for hit in hits}) / len(fused))
                    agreement = figures.settings.setdefault("hybrid_recall_at_10", {})
                    agreement[label] = round(float(np.mean(same)), 4) if same else 0.0
    pool.shutdown()


def both_lists(
    index: ChunkIndex,
    pool: ThreadPoolExecutor,
    words: Callable[[], list[Hit]],
    nearest: Callable[[], list[Hit]],
    dataset_id: str,
    where: SearchFilter | None,
) -> tuple[list[Hit], list[Hit]]:
    """A hybrid search's two lists (vector, keyword) as the search service gets them: the
    words looked up beside the vector search, or before it where its scan takes every core and
    other processes keep cores busy (service.search.words_first; the service looks them up
    while it embeds the query, which this bench has done beforehand). Each search's order is
    counted in IN_TURN."""
    first = words_first(index, other_work(), dataset_id, where)
    IN_TURN[first] += 1
    if first:
        keyword = words()
        return nearest(), keyword
    looked_up = pool.submit(words)
    return nearest(), looked_up.result()


def _passed(
    call: Callable[[int], list[Hit]], questions: int
) -> tuple[list[float], list[list[Hit]]]:
    """One pass of a mode over the questions: each search's milliseconds and hits; a slow mode
    stops after MIN_QUESTIONS once it has taken MODE_BUDGET_S."""
    took: list[float] = []
    found: list[list[Hit]] = []
    mode_began = time.perf_counter()
    for q in range(questions):
        began = time.perf_counter()
        hits = call(q)
        took.append((time.perf_counter() - began) * 1000)
        found.append(hits)
        if len(took) >= MIN_QUESTIONS and began - mode_began > MODE_BUDGET_S:
            break
    return took, found


def _figures(took: list[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(took, 50), 2),
        "p95": round(percentile(took, 95), 2),
        "questions": len(took),
    }


def _chunk_ids(corpus: Corpus) -> list[str]:
    """The chunk id of each row of the corpus."""
    chunk_ids = [""] * len(corpus.vectors)
    for chunk, row in corpus.row_of.items():
        chunk_ids[row] = chunk
    return chunk_ids


def _best_hits(
    block: npt.NDArray[np.float32], rows: npt.NDArray[np.intp], chunk_ids: Sequence[str], k: int
) -> list[list[Hit]]:
    """Per question (a row of `block`, its cosines with the chunks `rows`), the k best chunks
    as hits, best first: what fusion reads of a vector list (the id and the score)."""
    k = min(k, block.shape[1])
    best = np.argpartition(-block, k - 1, axis=1)[:, :k]
    out = []
    for scores, columns in zip(block, best, strict=True):
        ordered = sorted(columns.tolist(), key=lambda c: (-scores[c], rows[c]))
        out.append(
            [
                Hit(chunk_ids[rows[c]], "", 0, "", None, None, None, float(scores[c]))
                for c in ordered
            ]
        )
    return out


def _folder_mb(path: Path) -> float:
    if path.is_file():
        return path.stat().st_size / 1e6
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def _kept_chunks(db: Database) -> int:
    with db.read() as conn:
        large, small = _datasets(db, write=False)
        found = conn.execute(
            text(
                "SELECT coalesce(sum(chunk_count), 0) FROM documents "
                "WHERE dataset_id IN (:large, :small)"
            ),
            {"large": large, "small": small},
        ).scalar()
    return int(found or 0)


def _forget_side_indexes(index: SqliteIndex, db: Database, folder: Path) -> None:
    """A kept database's graphs and keyword index are forgotten, so they are built again (and
    timed) as at a first start: their rows, of whichever versions, and their folders."""
    with db.write() as tx:
        names = [
            row[0]
            for row in tx.exec_driver_sql(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND (name = ? OR name LIKE ?)",
                (index.graphs.snapshots, f"{index.vec}_keywords%"),
            )
        ]
        for name in names:
            tx.exec_driver_sql(f"DELETE FROM {name}")
    shutil.rmtree(folder / "kops.db.graphs", ignore_errors=True)
    shutil.rmtree(folder / "kops.db.keywords", ignore_errors=True)


def _build_side_indexes(
    figures: SearchFigures, index: SqliteIndex, dataset_ids: Sequence[str]
) -> None:
    """Build the graphs and the keyword index from the database, as at a first start, and time
    them (on a kept database without `rebuild`: load them as kept)."""
    chunks = figures.chunks
    before = rss_mb(os.getpid())
    began = time.perf_counter()
    if chunks >= index.graph_min_chunks:
        for dataset_id in dataset_ids:
            index.graphs.want(dataset_key(dataset_id))
        if not index.graphs.caught_up(timeout=BUILD_LIMIT_S):
            raise RuntimeError(f"the graphs were not built within {BUILD_LIMIT_S:.0f} s")
    figures.index_build_s = round(time.perf_counter() - began, 1)
    figures.index_memory_mb = round(index.graphs.memory_bytes() / 1e6, 1)
    # lists built from the database (not loaded from a snapshot)
    figures.settings["graph_builds"] = index.graphs.builds
    began = time.perf_counter()
    if chunks >= index.keyword_min_chunks:
        index.keywords.want()
        if not index.keywords.caught_up(timeout=BUILD_LIMIT_S):
            raise RuntimeError(f"the keyword index was not built within {BUILD_LIMIT_S:.0f} s")
    figures.settings["keyword_build_s"] = round(time.perf_counter() - began, 1)
    figures.settings = {
        **figures.settings,
        "graph_min_chunks": index.graph_min_chunks,
        "keyword_min_chunks": index.keyword_min_chunks,
        "rss_growth_mb": round(rss_mb(os.getpid()) - before, 1),
        **_graph_settings(),
    }


def bench_embedded(
    root: Path,
    chunks: int,
    questions: list[str],
    keep: Path | None = None,
    *,
    rebuild: bool = True,
    ingest_rounds: int = 0,
) -> SearchFigures:
    """With `keep`, the database stays in that folder, and a later run of as many chunks
    measures it again without writing it: its graphs and keyword index are built again and
    timed, or, without `rebuild`, loaded as they were kept. `ingest_rounds`: the ingestion
    runs in each mode (0: INGEST_ROUNDS)."""
    figures = SearchFigures("embedded", chunks, len(questions))
    folder = keep or Path(tempfile.mkdtemp(prefix="kops-bench-search-"))
    folder.mkdir(parents=True, exist_ok=True)
    db = Database(f"sqlite:///{folder / 'kops.db'}")
    try:
        upgrade(db.engine)
        reuse = keep is not None and _kept_chunks(db) == chunks
        if keep is not None and not reuse and _kept_chunks(db):
            raise ValueError(f"{keep} holds another corpus: give an empty folder")
        index = SqliteIndex(db, DIMENSION)
        if reuse and rebuild:
            _forget_side_indexes(index, db, folder)
        began = time.perf_counter()
        index.ensure()  # on a kept database: what a start of this version does to it
        figures.settings["start_s"] = round(time.perf_counter() - began, 1)
        dataset_ids = _datasets(db, write=not reuse)
        passages = Passages(faq_pages(root), DIMENSION)
        began = time.perf_counter()
        corpus = _write(index, db, passages, chunks, dataset_ids, write=not reuse)
        figures.write_s = round(time.perf_counter() - began, 1)
        figures.settings["reused_database"] = reuse
        figures.settings["rebuilt_side_indexes"] = rebuild or not reuse
        _build_side_indexes(figures, index, dataset_ids)
        index.close()  # writes the snapshots: their size is part of the disk
        index = SqliteIndex(db, DIMENSION)
        for dataset_id in dataset_ids:
            index.graphs.want(dataset_key(dataset_id))
        began = time.perf_counter()
        index.graphs.caught_up(timeout=600)
        figures.settings["graph_load_s"] = round(time.perf_counter() - began, 1)
        if chunks >= index.keyword_min_chunks:
            began = time.perf_counter()
            index.keywords.want()
            index.keywords.caught_up(timeout=600)
            figures.settings["keyword_open_s"] = round(time.perf_counter() - began, 1)
            figures.settings["keyword_disk_mb"] = round(_folder_mb(folder / "kops.db.keywords"), 1)
        figures.disk_mb = round(_folder_mb(folder), 1)
        _measure(figures, index, corpus, dataset_ids, questions, HashingEmbedder(DIMENSION))
        # the filters' bitmaps of admitted chunks built by the searches (admitted.py)
        figures.settings["filter_bitmaps_built"] = index.admitted.builds
        # the way the filtered searches used them: the scan skipping what the filter does
        # not admit, or scanning every code with the bitmap applied after (admitted.Way)
        figures.settings["filter_bitmap_ways"] = {
            str(way): index.admitted.chosen[way] for way in Way
        }
        _measure_embedded(
            figures, index, db, corpus, passages, dataset_ids, questions, ingest_rounds
        )
        index.close()
    finally:
        db.dispose()
        if keep is None:
            shutil.rmtree(folder, ignore_errors=True)
    return figures


def _measure_embedded(
    figures: SearchFigures,
    index: SqliteIndex,
    db: Database,
    corpus: Corpus,
    passages: Passages,
    dataset_ids: Sequence[str],
    questions: Sequence[str],
    ingest_rounds: int = 0,
) -> None:
    """What only the embedded index has: the counts' cost, the keyword index against FTS5,
    the sweeps of the graphs' breadths, and the index's upkeep."""
    figures.settings["count_ms"] = _count_cost(index, dataset_ids)
    if index.keywords.ready:
        figures.settings["keyword_agreement"] = _keyword_agreement(
            index, db, dataset_ids, questions
        )
    figures.settings["probe_sweep"] = _probe_sweep(index, corpus, dataset_ids[0], questions)
    figures.settings["fused_sweep"] = _fused_sweep(index, corpus, dataset_ids[0], questions)
    if index.keywords.ready:
        figures.settings["keyword_budget_sweep"] = _keyword_budget_sweep(
            index, dataset_ids[0], questions
        )
        figures.settings["rarest_first_sweep"] = _rarest_first_sweep(
            index, dataset_ids[0], questions
        )
    if index.graphs.ready(dataset_key(dataset_ids[0])):
        figures.settings["ingestion"] = _Ingestion(
            index, db, passages, dataset_ids[0], figures.chunks, questions, ingest_rounds
        ).measure()
        figures.settings["maintenance"] = _maintenance(index, db, passages, dataset_ids[0])


def _count_cost(index: SqliteIndex, dataset_ids: Sequence[str]) -> dict[str, float]:
    """p50 ms of a search's counts taken afresh, per dataset and filter: nothing commits while
    this bench measures, so its searches use the counts kept (counts.py); a search while
    documents are being written pays this on top (a hybrid one: once per list)."""
    cost: dict[str, float] = {}
    for n, dataset_id in enumerate(dataset_ids):
        for where in (None, SHELF):
            took = []
            for _ in range(COUNT_REPEATS):
                began = time.perf_counter()
                index.counts.count(dataset_id, where)
                took.append((time.perf_counter() - began) * 1000)
            label = ("large" if n == 0 else "small") + ("" if where is None else " filtered")
            cost[label] = round(percentile(took, 50), 2)
    return cost


def _rows_cost(index: SqliteIndex, db: Database, documents_made: Sequence[str]) -> float:
    """What the plain vector table adds to a job's writes, per chunk, at most: the documents'
    vectors written again into a twin of it, one transaction per document as a job writes
    them (so this counts a commit of its own the real write shares)."""
    twin = f"{index.rows}_bench_twin"
    took = 0.0
    count = 0
    with db.write() as tx:
        tx.exec_driver_sql(f"DROP TABLE IF EXISTS {twin}")
        vector_rows.create_table(tx, twin)
    try:
        for document_id in documents_made:
            with db.read() as conn:
                rows = conn.exec_driver_sql(
                    f"SELECT v.seq, v.embedding FROM chunks c JOIN {index.rows} v "
                    "ON v.seq = c.seq WHERE c.document_id = ?",
                    (document_id,),
                ).all()
            began = time.perf_counter()
            with db.write() as tx:
                tx.exec_driver_sql(
                    f"INSERT INTO {twin} (seq, embedding) VALUES (?, ?)", [tuple(r) for r in rows]
                )
            took += time.perf_counter() - began
            count += len(rows)
    finally:
        with db.write() as tx:
            tx.exec_driver_sql(f"DROP TABLE IF EXISTS {twin}")
    return 1000 * took / max(count, 1)


AGREEMENT_QUESTIONS = 40


def _keyword_agreement(
    index: SqliteIndex, db: Database, dataset_ids: Sequence[str], questions: Sequence[str]
) -> dict[str, float]:
    """How much of FTS5's top 10 (BM25 over the same chunks, what searches used before the
    keyword index) the keyword index's top 10 holds, per dataset, on the first questions."""
    fts5 = SqliteIndex(db, DIMENSION, keyword_min_chunks=2**62)  # never through Tantivy
    agreement: dict[str, float] = {}
    for name, dataset_id in zip(("large", "small"), dataset_ids, strict=True):
        shares = []
        for question in questions[:AGREEMENT_QUESTIONS]:
            theirs = {hit.chunk_id for hit in fts5.search_keyword(dataset_id, question, TOP_K)}
            if not theirs:
                continue
            ours = {hit.chunk_id for hit in index.search_keyword(dataset_id, question, TOP_K)}
            shares.append(len(ours & theirs) / len(theirs))
        agreement[name] = round(float(np.mean(shares)), 3) if shares else 0.0
    return agreement


OVERHEAD_DOCUMENTS = 40  # written as jobs write them, to time what the graphs add to it
OVERHEAD_ROUNDS = 4
MODEL_CHUNKS = 256  # embedded by the real model to weigh the index's work against
MODEL_BATCH = 32  # the pipeline's batch (settings: embed_batch_size)


def _model_cpu_ms_per_chunk(passages: Passages) -> float:
    """What all-MiniLM-L6-v2 costs the machine per chunk: its wall time per chunk with every
    core it uses, times those cores (what the index's upkeep, done by one thread beside it,
    takes a share of). The chunks are this bench's text cut to the pipeline's default chunk
    size in the model's tokens, embedded in the pipeline's batches; process CPU time would
    also count the threads spinning while they wait for each other."""
    model = LocalMiniLM()
    model.load()
    cut = _chunk_cut()
    texts: list[str] = []
    for batch in passages.batches(MODEL_CHUNKS, seed=3, size=MODEL_BATCH):
        texts.extend(cut(body) for body in batch.texts)
    began = time.perf_counter()
    for start in range(0, len(texts), MODEL_BATCH):
        model.embed(texts[start : start + MODEL_BATCH])
    return 1000 * (time.perf_counter() - began) * model.threads / len(texts)


def _chunk_cut() -> Callable[[str], str]:
    """A passage cut to the pipeline's default chunk size in the model's tokens: the chunk a
    job would embed."""
    tokenizer = load_tokenizer()
    size = int(Settings.model_fields["chunk_size"].default)

    def cut(body: str) -> str:
        spans = [span for span in tokenizer.encode(body).offsets if span != (0, 0)]
        return body[: spans[min(size, len(spans)) - 1][1]] if spans else body

    return cut


INGEST_ROUNDS = 3  # each: a run in every mode, the modes in turn
INGEST_DOCUMENTS_MAX = 5  # documents of CHUNKS_PER_DOCUMENT per run (fewer below 200,000 chunks);
# a run logs 600 rows at most, and the kept runs' thread prunes the log (and the count of rows
# logged) every graphs.PRUNE_INTERVAL_S: under graphs.PRUNE_AFTER_ROWS, past which a write
# would start the graphs' thread again in a run without it (counted: upkeep_in_not_kept_runs)
INGEST_SEARCHES_PER_S = 2.0  # vector searches of the dataset while a run ingests
NOT_KEPT, KEPT, FULL = "not kept", "kept", "kept, stage full"
INGEST_MODES = (KEPT, FULL, NOT_KEPT)


class _Ingestion:
    """What keeping the index costs ingestion, measured as throughput: chunks embedded by the
    real model in the pipeline's batches and written a document per transaction as a job
    writes them, into the large dataset, by a thread at the workers' priority
    (`worker_nice`, as the service runs its workers and model), while the graphs' and the
    keyword index's threads take them in (kept; started from this thread, at the API's
    priority, as a search starts them in the service) or stand stopped (not kept: the log holds
    the chunks, taken in untimed before the next run). Kept, the graph's thread stages the
    chunks and adds them to the graph while a core is spare (graphs.py, stage.py): a run is a
    burst that the stage holds whole, taken in untimed before the next run. "Kept, stage full"
    is what a longer burst meets once its stage is full: the limit set to 0, each chunk goes
    into the graph as it comes. The modes take turns, each round starting with the next; the
    share is the median throughput lost. Parsing, chunking and the job's
    bookkeeping are left out: they would only add to the time the upkeep is a share of.
    One more kept run, not counted, has this thread search the dataset's vectors a few times a
    second: what a search meets while documents arrive.

    The vectors written are the corpus's own (the graph's work is that of a dataset of its
    kind); the model embeds the same chunks for its real cost. A graph snapshot (due every
    graphs.SNAPSHOT_INTERVAL_S while changes arrive) is timed apart, before the runs, and
    given as the share of the machine it takes at that interval."""

    def __init__(
        self,
        index: SqliteIndex,
        db: Database,
        passages: Passages,
        dataset_id: str,
        chunks: int,
        questions: Sequence[str],
        rounds: int = 0,
    ) -> None:
        self.index, self.db, self.passages, self.dataset_id = index, db, passages, dataset_id
        self.rounds = rounds or INGEST_ROUNDS
        self.key = dataset_key(dataset_id)
        self.keywords = index.keywords.ready
        self.per_run = max(1, min(INGEST_DOCUMENTS_MAX, chunks // 40_000))
        self.worker_nice = Settings().worker_nice
        self.pool = ThreadPoolExecutor(1, initializer=lower_priority, initargs=(self.worker_nice,))
        self.model = LocalMiniLM()
        self.pool.submit(self.model.load).result()  # its compute threads start in the pool's
        self.cut = _chunk_cut()
        embedder = HashingEmbedder(DIMENSION)
        self.vectors = [embedder.vector(q) for q in questions]
        self.made: list[str] = []

    def measure(self) -> dict[str, Any]:
        try:
            return self._measure()
        finally:  # a kept database holds the corpus alone again, its index caught up
            self.pool.shutdown()
            _delete_documents(self.index, self.db, self.made)
            self._keep()

    def _measure(self) -> dict[str, Any]:
        self._keep()
        self.index.graphs.stop()
        graph = self.index.graphs._graphs[self.key]
        snapshot_s, snapshot_cpu_s = _timed_snapshot(self.index, self.key)
        snapshot = graph.snapshot
        rates: dict[str, list[float]] = {mode: [] for mode in INGEST_MODES}
        behind = 0
        started = 0
        n = 0
        staged = 0
        for round_ in range(self.rounds):
            turn = round_ % len(INGEST_MODES)
            for mode in INGEST_MODES[turn:] + INGEST_MODES[:turn]:
                rates[mode].append(self._run(mode, n, search=False)[0])
                n += 1
                if mode == NOT_KEPT and self.index.graphs._thread is not None:
                    started += 1  # a prune started it: this run was not without upkeep
                if mode == KEPT:
                    staged = max(staged, self.index.graphs.staged(self.key))
                if mode == FULL:
                    behind = max(behind, _graph_behind(self.index, self.db, self.key))
        snapshot_in_runs = graph.snapshot != snapshot
        _, took = self._run(KEPT, n, search=True)
        plain = statistics.median(rates[NOT_KEPT])
        return {
            "chunks_per_run": self.per_run * CHUNKS_PER_DOCUMENT,
            "rounds": self.rounds,
            "worker_nice": self.worker_nice,
            "chunks_per_s": {mode: [round(r, 2) for r in rates[mode]] for mode in INGEST_MODES},
            "throughput_lost_pct": round(100 * (1 - statistics.median(rates[KEPT]) / plain), 2),
            "throughput_lost_stage_full_pct": round(
                100 * (1 - statistics.median(rates[FULL]) / plain), 2
            ),
            # chunks on the stage when a kept run ended (the run's, if no core was spare)
            "staged_at_end_max": staged,
            # log rows of the dataset its graph had not taken in when a stage-full run ended
            "graph_behind_at_end_max": behind,
            "upkeep_in_not_kept_runs": started,
            "snapshot_during_runs": snapshot_in_runs,  # one more than the one timed apart
            "snapshot_s": round(snapshot_s, 3),
            "snapshot_cpu_s": round(snapshot_cpu_s, 3),
            "snapshot_share_pct": round(
                100 * snapshot_cpu_s / (graphs.SNAPSHOT_INTERVAL_S * self.model.threads), 2
            ),
            # a run more, the index kept, searched meanwhile (not one of the timed runs: the
            # searches would cost the runs with the index stopped more, their pending chunks
            # scored one by one)
            "search_ms_while_ingesting": {
                "p50": round(percentile(took, 50), 2),
                "p95": round(percentile(took, 95), 2),
                "max": round(max(took, default=0.0), 2),
                "searches": len(took),
            },
        }

    def _run(self, mode: str, n: int, *, search: bool) -> tuple[float, list[float]]:
        """One run: its chunks per second and, with `search`, the milliseconds of the vector
        searches made meanwhile."""
        run = [
            _ingest_document(self.passages, self.cut, self.dataset_id, n, d)
            for d in range(1 + self.per_run)
        ]
        self._keep()
        # the run's first document is written before the clock starts, the index kept: its
        # upkeep falls inside the timed run as the last one's falls after it (a steady state)
        self.pool.submit(self._write, run[:1]).result()
        if mode == NOT_KEPT:
            self._stop()
        limit = self.index.graphs.stage_max
        if mode == FULL:
            self.index.graphs.stage_max = 0
        try:
            ingesting = self.pool.submit(self._write, run[1:])
            took: list[float] = []
            while search and not ingesting.done():
                began = time.perf_counter()
                self.index.search_vector(
                    self.dataset_id, self.vectors[len(took) % len(self.vectors)], TOP_K
                )
                took.append((time.perf_counter() - began) * 1000)
                wait([ingesting], timeout=max(0.0, 1 / INGEST_SEARCHES_PER_S - took[-1] / 1000))
            return self.per_run * CHUNKS_PER_DOCUMENT / ingesting.result(), took
        finally:
            self.index.graphs.stage_max = limit

    def _write(self, run: Sequence[tuple[str, list[str], list[IndexedChunk]]]) -> float:
        """A job's work on each document once parsed and chunked: embed, then one
        transaction. In the pool's thread; the seconds it took."""
        began = time.perf_counter()
        for document_id, texts, part in run:
            for start in range(0, len(texts), MODEL_BATCH):
                self.model.embed(texts[start : start + MODEL_BATCH])
            with self.db.write() as tx:
                _document(tx, document_id, self.dataset_id, 1, shelf=1)
                self.index.upsert(tx, part)
                self.index.activate(tx, document_id, 1)
            self.made.append(document_id)
        return time.perf_counter() - began

    def _keep(self) -> None:
        """Start the index's threads and wait until they hold the whole log."""
        self.index.graphs.want(self.key)
        if self.keywords:
            self.index.keywords.want()
        words = self.index.keywords.caught_up(timeout=600) if self.keywords else True
        if not (self.index.graphs.caught_up(timeout=600) and words):
            raise RuntimeError("the index did not catch up with the log within 600 s")

    def _stop(self) -> None:
        self.index.graphs.stop()
        self.index.keywords.close()


def _delete_documents(index: SqliteIndex, db: Database, made: Sequence[str]) -> None:
    """Delete the documents a measure wrote, one a transaction, as the service deletes them:
    sqlite-vec's table deletes a chunk in about 3.6 ms at a million, and the thousands of
    chunks of a measure deleted in one transaction held the write lock for 17 to 33 s, past
    the 30 s the keyword index's writer waits for it ("database is locked")."""
    for document_id in made:
        with db.write() as tx:
            index.delete_document(tx, document_id)
            tx.execute(documents.delete().where(documents.c.id == document_id))


def _timed_snapshot(index: SqliteIndex, key: int) -> tuple[float, float]:
    """Snapshot the dataset's graph as its thread would (stopped): seconds, and the process's
    CPU seconds. A snapshot is then not due for graphs.SNAPSHOT_INTERVAL_S."""
    began_cpu, began = time.process_time(), time.perf_counter()
    index.graphs._save(index.graphs._graphs[key])
    return time.perf_counter() - began, time.process_time() - began_cpu


def _graph_behind(index: SqliteIndex, db: Database, key: int) -> int:
    """The log rows of the dataset `key` its graph has not taken in."""
    graph = index.graphs._graphs[key]
    with db.read() as conn:
        found = conn.exec_driver_sql(
            f"SELECT count(*) FROM {index.graphs.log} WHERE dataset_key = ? AND id > ?",
            (key, graph.applied),
        ).scalar()
    return int(found or 0)


def _ingest_document(
    passages: Passages, cut: Callable[[str], str], dataset_id: str, run: int, n: int
) -> tuple[str, list[str], list[IndexedChunk]]:
    """The `n`th document of ingestion run `run`: its id, its chunks' texts and its rows."""
    document_id = str(uuid.uuid5(_IDS, f"ingestion-{run}-{n}"))
    seed = 5000 + 100 * run + n
    batch = next(passages.batches(CHUNKS_PER_DOCUMENT, seed, CHUNKS_PER_DOCUMENT))
    texts = [cut(body) for body in batch.texts]
    part = [
        _chunk(document_id, dataset_id, i, body, batch.vectors[i]) for i, body in enumerate(texts)
    ]
    return document_id, texts, part


def _maintenance(
    index: SqliteIndex, db: Database, passages: Passages, dataset_id: str
) -> dict[str, float | None]:
    """What keeping the graphs costs ingestion, at this size: the vector log's rows in each
    job's transaction (documents written with it and, to compare, without it), and the
    graph's work to take the new chunks in (the thread's time, one core)."""

    made: list[str] = []

    def write(count: int, seed: int) -> tuple[float, int]:
        began = time.perf_counter()
        written = 0
        for batch in passages.batches(count * CHUNKS_PER_DOCUMENT, seed, CHUNKS_PER_DOCUMENT):
            document_id = str(uuid.uuid5(_IDS, f"overhead-{seed}-{written}"))
            made.append(document_id)
            part = [
                _chunk(document_id, dataset_id, n, body, batch.vectors[n])
                for n, body in enumerate(batch.texts)
            ]
            with db.write() as tx:
                _document(tx, document_id, dataset_id, 1, shelf=1)
                index.upsert(tx, part)
                index.activate(tx, document_id, 1)
            written += len(part)
        return time.perf_counter() - began, written

    key = dataset_key(dataset_id)
    graph = index.graphs._graphs[key]
    index.graphs.close()  # the threads stop: the writes are timed alone
    index.keywords.close()
    # and stay stopped: the rows logged so far are pruned now, so the writes below do not
    # reach graphs.PRUNE_AFTER_ROWS, at which a write starts the graphs' thread for a prune
    # (which would take the chunks in before they are timed: 0 ms, after a long ingestion)
    index.graphs._prune()
    model_ms = _model_cpu_ms_per_chunk(passages)
    keep_log = index._log
    logged, plain = [], []
    written = 0
    for round_ in range(OVERHEAD_ROUNDS):  # alternated, so the page cache favours neither
        took, count = write(OVERHEAD_DOCUMENTS // OVERHEAD_ROUNDS, seed=1000 + round_)
        logged.append(took / count)
        written += count
        index._log = lambda *args, **kwargs: None  # type: ignore[method-assign]
        try:
            took, count = write(OVERHEAD_DOCUMENTS // OVERHEAD_ROUNDS, seed=2000 + round_)
        finally:
            index._log = keep_log  # type: ignore[method-assign]
        plain.append(took / count)
    logged_s, plain_s = statistics.median(logged), statistics.median(plain)
    apply_ms, per_chunk_ms, keyword_ms = _timed_apply(index, graph, written)
    rows_ms = _rows_cost(index, db, made)
    _delete_documents(index, db, made)  # a kept database holds the corpus alone again
    return {
        "chunks_written": written,
        "write_ms_per_chunk_with_log": round(1000 * logged_s, 3),
        "write_ms_per_chunk_without_log": round(1000 * plain_s, 3),
        "log_overhead_pct": round(100 * (logged_s - plain_s) / plain_s, 1),
        "graph_apply_ms_per_chunk": None if apply_ms is None else round(apply_ms, 3),
        "rows_table_ms_per_chunk": round(rows_ms, 4),
        "model_ms_per_chunk_all_cores": round(model_ms, 2),
        "rows_table_share_of_real_ingestion_pct": round(100 * rows_ms / model_ms, 3),
        # None: the graphs' thread took the chunks in before they could be timed
        "graph_apply_cpu_ms_per_chunk": None if per_chunk_ms is None else round(per_chunk_ms, 3),
        # of the CPU the real model spends per chunk, measured here
        "graph_share_of_real_ingestion_pct": (
            None if per_chunk_ms is None else round(100 * per_chunk_ms / model_ms, 2)
        ),
        **(
            {}
            if keyword_ms is None
            else {
                "keyword_apply_cpu_ms_per_chunk": round(keyword_ms, 3),
                "keyword_share_of_real_ingestion_pct": round(100 * keyword_ms / model_ms, 2),
            }
        ),
    }


def _timed_apply(
    index: SqliteIndex, graph: graphs.Graph, written: int
) -> tuple[float | None, float | None, float | None]:
    """The graph's and the keyword index's work to take in the `written` chunks, in this
    thread: the graph's wall and CPU ms per chunk, the keyword index's CPU ms per chunk (None
    when it is not kept). All None when the graphs' thread ran during the writes: it took
    the chunks in before they could be timed."""
    if index.graphs._thread is not None:
        return None, None, None
    began_cpu = time.thread_time()
    began = time.perf_counter()
    # in this thread, to time it: staged and, at once, added to the graph
    while index.graphs._catch_up(graph) or index.graphs._drain(graph, force=True):
        pass
    apply_ms = 1000 * (time.perf_counter() - began) / written
    per_chunk_ms = 1000 * (time.thread_time() - began_cpu) / written
    keyword_ms = None
    if index.keywords.ready:  # its commits run in Tantivy's threads: the process's CPU
        began_cpu = time.process_time()
        while index.keywords._apply():
            pass
        keyword_ms = 1000 * (time.process_time() - began_cpu) / written
    return apply_ms, per_chunk_ms, keyword_ms


def _sweep(
    index: ChunkIndex,
    corpus: Corpus,
    dataset_id: str,
    questions: Sequence[str],
    breadths: Sequence[Any],
    apply: Callable[[Any], None],
    where: SearchFilter | None = None,
) -> dict[str, dict[str, float]]:
    """Vector search of the large dataset at each walk breadth `apply` sets: p50, p95 and
    recall@10 (how the breadth was chosen), among the chunks `where` admits."""
    embedder = HashingEmbedder(DIMENSION)
    vectors = [embedder.vector(q) for q in questions]
    admitted = corpus.dataset_of == 0
    if where is not None:
        assert where == SHELF, "the bench knows which chunks SHELF admits, no other filter's"
        admitted &= corpus.shelf_zero
    rows = np.nonzero(admitted)[0]
    tenth: list[float] = []
    for start in range(0, len(vectors), 50):
        block = np.stack(vectors[start : start + 50]) @ corpus.vectors[rows].T
        tenth.extend((-np.partition(-block, TOP_K - 1, axis=1)[:, TOP_K - 1]).tolist())
    out = {}
    for breadth in breadths:
        apply(breadth)
        took, recall = [], []
        for q, vector in enumerate(vectors):
            began = time.perf_counter()
            hits = index.search_vector(dataset_id, vector, TOP_K, where)
            took.append((time.perf_counter() - began) * 1000)
            recall.append(len([h for h in hits if h.score >= tenth[q] - 1e-5]) / TOP_K)
        out[str(breadth)] = {
            "p50": round(percentile(took, 50), 2),
            "p95": round(percentile(took, 95), 2),
            "recall": round(float(np.mean(recall)), 4),
        }
    return out


PROBE_SWEEP = (0.25, 0.375, 0.5, 0.625, 0.75, 1.0)  # shares of a dataset's lists scanned
CANDIDATES_SWEEP = (40, 160)  # the lists' nearest scored exactly (at k 10), at each share
PG_EF_SWEEP = (40, 100, 200, 400)
PG_BUILD_EF_SWEEP = (100, 200, 400, 800)  # ef_search tried on each graph of --hnsw-sweep


def _probe_sweep(
    index: SqliteIndex, corpus: Corpus, dataset_id: str, questions: Sequence[str]
) -> dict[str, dict[str, float]]:
    """The share of the dataset's lists a search scans (lists.PROBE_SHARE) with each count of
    candidates scored exactly (CANDIDATES_MIN): keyed "<share>/<candidates>"."""
    if not index.graphs.ready(dataset_key(dataset_id)):
        return {}
    chosen = graphs.CANDIDATES_MIN, lists.PROBE_SHARE
    out = {}
    try:
        for candidates in CANDIDATES_SWEEP:
            graphs.CANDIDATES_MIN = candidates

            def apply(share: float) -> None:
                lists.PROBE_SHARE = share

            found = _sweep(index, corpus, dataset_id, questions, PROBE_SWEEP, apply)
            out.update({f"{share}/{candidates}": figures for share, figures in found.items()})
    finally:
        graphs.CANDIDATES_MIN, lists.PROBE_SHARE = chosen
    return out


FUSED_SWEEP = (0.375, 0.5, 0.5625, 0.625)
PG_FUSED_SWEEP = (100, 140, 200)


def _fused_sweep(
    index: SqliteIndex, corpus: Corpus, dataset_id: str, questions: Sequence[str]
) -> dict[str, dict[str, float]]:
    """The share of the lists a hybrid search's vector list scans (lists.PROBE_SHARE_FUSED)."""
    if not index.graphs.ready(dataset_key(dataset_id)):
        return {}
    setting = (lists, "PROBE_SHARE_FUSED")
    return _hybrid_sweep(index, corpus, dataset_id, questions, FUSED_SWEEP, setting)


def _hybrid_sweep(
    index: ChunkIndex,
    corpus: Corpus,
    dataset_id: str,
    questions: Sequence[str],
    breadths: Sequence[float],
    setting: tuple[Any, str],
) -> dict[str, dict[str, float]]:
    """Hybrid search of the large dataset at each breadth of its vector list's search (a walk's
    ef, a share of the lists), the module
    constant `setting` (module, name) set to each in turn and restored after: p50, p95 and the
    fused top 10's recall against the one the exact vector list gives."""
    module, name = setting
    chosen = getattr(module, name)
    vectors = [HashingEmbedder(DIMENSION).vector(q) for q in questions]
    chunk_ids = _chunk_ids(corpus)
    rows = np.nonzero(corpus.dataset_of == 0)[0]
    exact: list[list[Hit]] = []
    for start in range(0, len(vectors), 50):
        block = np.stack(vectors[start : start + 50]) @ corpus.vectors[rows].T
        exact.extend(_best_hits(block, rows, chunk_ids, HYBRID_CANDIDATES))
    words = [index.search_keyword(dataset_id, q, HYBRID_CANDIDATES) for q in questions]
    wanted = [
        {h.chunk_id for h in score_fusion(q, exact[n], words[n], VECTOR_WEIGHT)[:TOP_K]}
        for n, q in enumerate(questions)
    ]
    pool = ThreadPoolExecutor(1, thread_name_prefix="bench-fused")
    out = {}
    try:
        for breadth in breadths:
            setattr(module, name, breadth)
            took, recall = [], []
            for n, question in enumerate(questions):
                began = time.perf_counter()
                nearest, keyword = both_lists(
                    index,
                    pool,
                    partial(index.search_keyword, dataset_id, question, HYBRID_CANDIDATES),
                    partial(
                        index.search_vector, dataset_id, vectors[n], HYBRID_CANDIDATES, fused=True
                    ),
                    dataset_id,
                    None,
                )
                hits = score_fusion(question, nearest, keyword, VECTOR_WEIGHT, TOP_K)
                took.append((time.perf_counter() - began) * 1000)
                if wanted[n]:
                    recall.append(len(wanted[n] & {h.chunk_id for h in hits}) / len(wanted[n]))
            out[str(breadth)] = {
                "p50": round(percentile(took, 50), 2),
                "p95": round(percentile(took, 95), 2),
                "hybrid_recall": round(float(np.mean(recall)), 4) if recall else 0.0,
            }
    finally:
        setattr(module, name, chosen)
        pool.shutdown()
    return out


KEYWORD_BUDGET_SWEEP = (1.0, 2.0, 3.0, 4.0)  # terms.QUERY_POSTINGS_PER_CHUNK; inf: every word
RAREST_SWEEP = (0.5, 1.0, 2.0)  # rarest_first.CANDIDATE_POSTINGS_PER_CHUNK


@contextmanager
def _keyword_way(rescore: bool, candidates: float, budget: float) -> Iterator[None]:
    """The keyword index's search set one way for a while, then put back as it was found."""
    found = (
        rarest_first.RESCORE,
        rarest_first.CANDIDATE_POSTINGS_PER_CHUNK,
        terms.QUERY_POSTINGS_PER_CHUNK,
    )
    rarest_first.RESCORE = rescore
    rarest_first.CANDIDATE_POSTINGS_PER_CHUNK = candidates
    terms.QUERY_POSTINGS_PER_CHUNK = budget
    try:
        yield
    finally:
        (
            rarest_first.RESCORE,
            rarest_first.CANDIDATE_POSTINGS_PER_CHUNK,
            terms.QUERY_POSTINGS_PER_CHUNK,
        ) = found


def _keyword_budget_sweep(
    index: ChunkIndex, dataset_id: str, questions: Sequence[str]
) -> dict[str, dict[str, float]]:
    """A hybrid search's keyword list (HYBRID_CANDIDATES) of the large dataset asked each way:
    the plain disjunction of every word ("inf"); of the question's rarest words within each
    postings budget (terms.rarest_terms, "1.0" … "4.0": the search before rarest_first.py);
    and rarest first, candidates found by the rarest words within each budget of
    RAREST_SWEEP and scored by every word ("rarest 1.0" …). p50, p95, the slowest, and how much
    of every word's top 10 each keeps. Each question is asked every way in turn, the first a
    different one each time, so no way meets the page cache alone."""
    chosen = terms.QUERY_POSTINGS_PER_CHUNK
    ways: dict[str, tuple[bool, float, float]] = {"inf": (False, math.inf, math.inf)}
    ways.update({str(budget): (False, math.inf, budget) for budget in KEYWORD_BUDGET_SWEEP})
    ways.update({f"rarest {candidates}": (True, candidates, chosen) for candidates in RAREST_SWEEP})
    names = list(ways)
    took: dict[str, list[float]] = {name: [] for name in names}
    tops: dict[str, list[set[str]]] = {name: [] for name in names}
    for n, question in enumerate(questions):
        for name in names[n % len(names) :] + names[: n % len(names)]:
            with _keyword_way(*ways[name]):
                began = time.perf_counter()
                hits = index.search_keyword(dataset_id, question, HYBRID_CANDIDATES)
                took[name].append((time.perf_counter() - began) * 1000)
            tops[name].append({hit.chunk_id for hit in hits[:TOP_K]})
    out: dict[str, dict[str, float]] = {}
    for name in names:
        kept = [
            len(top & every) / len(every)
            for top, every in zip(tops[name], tops["inf"], strict=True)
            if every
        ]
        out[name] = {
            "p50": round(percentile(took[name], 50), 2),
            "p95": round(percentile(took[name], 95), 2),
            "max": round(max(took[name]), 2),
            "top10_kept": round(float(np.mean(kept)), 4) if kept else 1.0,
        }
    return out


def _rarest_first_sweep(
    index: ChunkIndex, dataset_id: str, questions: Sequence[str], dimension: int = DIMENSION
) -> dict[str, dict[str, float]]:
    """The large dataset's keyword search and hybrid search (HYBRID_CANDIDATES from each list)
    with the keyword index's search rarest first (rarest_first.py, as set) and with the plain
    disjunction of the rarest words within the postings budget (the search before it): p50,
    p95, the slowest (a second pass; each question asked both ways in turn, the first a
    different one each time)."""
    embedder = HashingEmbedder(dimension)
    vectors = [embedder.vector(question) for question in questions]
    pool = ThreadPoolExecutor(1, thread_name_prefix="bench-rarest")

    def hybrid(q: int) -> list[Hit]:
        nearest, words = both_lists(
            index,
            pool,
            lambda: index.search_keyword(dataset_id, questions[q], HYBRID_CANDIDATES),
            lambda: index.search_vector(dataset_id, vectors[q], HYBRID_CANDIDATES, fused=True),
            dataset_id,
            None,
        )
        return score_fusion(questions[q], nearest, words, VECTOR_WEIGHT, TOP_K)

    def keyword(q: int) -> list[Hit]:
        return index.search_keyword(dataset_id, questions[q], HYBRID_CANDIDATES)

    candidates, budget = rarest_first.CANDIDATE_POSTINGS_PER_CHUNK, terms.QUERY_POSTINGS_PER_CHUNK
    ways = {"rarest first": True, "budget": False}
    took: dict[tuple[str, str], list[float]] = {}
    try:
        for mode, call in (("keyword", keyword), ("hybrid", hybrid)):
            for _ in range(2):  # the first pass reads the pages in; the second is reported
                for way in ways:
                    took[mode, way] = []
                for n in range(len(questions)):
                    for way in (*ways,)[n % 2 :] + (*ways,)[: n % 2]:
                        with _keyword_way(ways[way], candidates, budget):
                            began = time.perf_counter()
                            call(n)
                            took[mode, way].append((time.perf_counter() - began) * 1000)
    finally:
        pool.shutdown()
    return {
        f"{mode} {way}": {
            "p50": round(percentile(values, 50), 2),
            "p95": round(percentile(values, 95), 2),
            "max": round(max(values), 2),
        }
        for (mode, way), values in took.items()
    }


def _pg_ef_sweep(
    index: PgVectorIndex, corpus: Corpus, dataset_id: str, questions: Sequence[str]
) -> dict[str, dict[str, float]]:
    """pgvector's `hnsw.ef_search` for a whole dataset's partition (HNSW_EF_SEARCH, before a
    filter's share widens it: `_pg_filter_sweep`)."""
    chosen = pgvector.HNSW_EF_SEARCH

    def apply(ef: int) -> None:
        pgvector.HNSW_EF_SEARCH = ef

    try:
        return _sweep(index, corpus, dataset_id, questions, PG_EF_SWEEP, apply)
    finally:
        apply(chosen)


PG_FILTER_WIDEN_SWEEP = (0.0, 0.5, 0.75, 1.0)  # FILTER_WIDEN_POWER tried with SHELF (half)


def _pg_filter_sweep(
    index: PgVectorIndex, corpus: Corpus, dataset_id: str, questions: Sequence[str]
) -> dict[str, dict[str, float]]:
    """How far a filtered walk must widen (pgvector 0.6 filters after it): vector search of
    the large dataset with SHELF, which admits about half of it, at ef_search HNSW_EF_SEARCH
    / share ** each power, recall@10 against the exact top 10 of the chunks it admits. Keyed
    "<power>/<ef_search at a share of exactly one half>" (SHELF's share is about that: each
    document's shelf is drawn at random)."""
    chosen = pgvector.FILTER_WIDEN_POWER

    def apply(power: float) -> None:
        pgvector.FILTER_WIDEN_POWER = power

    try:
        found = _sweep(index, corpus, dataset_id, questions, PG_FILTER_WIDEN_SWEEP, apply, SHELF)
    finally:
        apply(chosen)
    return {
        f"{power:g}/{int(pgvector.HNSW_EF_SEARCH / 0.5**power)}": found[str(power)]
        for power in PG_FILTER_WIDEN_SWEEP
    }


def _pg_breadth_sweeps(
    index: PgVectorIndex, corpus: Corpus, dataset_id: str, questions: Sequence[str]
) -> dict[str, dict[str, dict[str, float]]]:
    """The walk's breadth swept, without a filter, with one, and for hybrid's vector list
    (after the table)."""
    return {
        "ef_search_sweep": _pg_ef_sweep(index, corpus, dataset_id, questions),
        "filter_widen_sweep": _pg_filter_sweep(index, corpus, dataset_id, questions),
        "fused_sweep": _hybrid_sweep(
            index, corpus, dataset_id, questions, PG_FUSED_SWEEP, (pgvector, "HNSW_EF_FUSED")
        ),
    }


def _hnsw_sweep(
    db: Database,
    index: PgVectorIndex,
    corpus: Corpus,
    dataset_id: str,
    questions: Sequence[str],
    builds: Sequence[tuple[int, int]],
) -> dict[str, dict[str, Any]]:
    """pgvector's graphs built again with each (m, ef_construction) of `builds`: the build's
    time and size, and recall@10, p50 and p95 of the large dataset at each ef_search."""
    hnsw = f"ix_{index.table}_hnsw"
    out: dict[str, dict[str, Any]] = {}
    chosen = pgvector.HNSW_EF_SEARCH

    def apply(ef: int) -> None:
        pgvector.HNSW_EF_SEARCH = ef

    try:
        for m, ef_construction in builds:
            with db.write() as tx:
                tx.exec_driver_sql(f"DROP INDEX IF EXISTS {hnsw}")
            began = time.perf_counter()
            with db.write() as tx:
                tx.exec_driver_sql(index.hnsw_ddl(m, ef_construction))
            build_s = time.perf_counter() - began
            with db.read() as conn:
                size = conn.execute(
                    text(
                        "SELECT coalesce(sum(pg_relation_size(inhrelid)), 0)::bigint FROM "
                        "pg_inherits WHERE inhparent = to_regclass(:i)"
                    ),
                    {"i": hnsw},
                ).scalar_one()
            out[f"{m}/{ef_construction}"] = {
                "build_s": round(build_s, 1),
                "size_mb": round(int(size) / 1e6, 1),
                "ef_search": _sweep(index, corpus, dataset_id, questions, PG_BUILD_EF_SWEEP, apply),
            }
    finally:
        apply(chosen)
        with db.write() as tx:  # the graphs as the product builds them again
            tx.exec_driver_sql(f"DROP INDEX IF EXISTS {hnsw}")
            tx.exec_driver_sql(index.hnsw_ddl())
    return out


def _build_pg_keywords(figures: SearchFigures, index: PgVectorIndex, folder: Path) -> None:
    """Build the keyword index an API process keeps, from the database, and time it."""
    keywords = index.keywords
    assert keywords is not None
    began = time.perf_counter()
    keywords.want()
    if not keywords.caught_up(timeout=BUILD_LIMIT_S):
        raise RuntimeError(f"the keyword index was not built within {BUILD_LIMIT_S:.0f} s")
    figures.settings["keyword_build_s"] = round(time.perf_counter() - began, 1)
    figures.settings["keyword_disk_mb"] = round(_folder_mb(folder), 1)


def _measure_pg_keywords(
    figures: SearchFigures,
    db: Database,
    index: PgVectorIndex,
    dataset_ids: Sequence[str],
    questions: Sequence[str],
) -> None:
    """The keyword index's postings budget swept, and GIN's `ts_rank_cd` for the same words."""
    figures.settings["keyword_budget_sweep"] = _keyword_budget_sweep(
        index, dataset_ids[0], questions
    )
    figures.settings["rarest_first_sweep"] = _rarest_first_sweep(index, dataset_ids[0], questions)
    figures.settings["gin_keyword_ms"] = _gin_keyword(db, dataset_ids, questions)


def _gin_keyword(
    db: Database, dataset_ids: Sequence[str], questions: Sequence[str]
) -> dict[str, dict[str, float]]:
    """Keyword search through the GIN index alone (`ts_rank_cd` over every match: what a process
    without its keyword index answers with), p50 and p95 per dataset, on at least MIN_QUESTIONS
    questions or MODE_BUDGET_S of them."""
    plain = PgVectorIndex(db, DIMENSION)
    out = {}
    for n, dataset_id in enumerate(dataset_ids):

        def keyword(q: int, d: str = dataset_id) -> list[Hit]:
            return plain.search_keyword(d, questions[q], TOP_K)

        took, _ = _passed(keyword, len(questions))
        out["large" if n == 0 else "small"] = _figures(took)
    return out


def _graph_settings() -> dict[str, Any]:
    return {
        "index": "faiss IVF, 8-bit scalar quantizer",
        "lists_per_million": lists.lists_for(1_000_000),
        "train_per_list": lists.TRAIN_PER_LIST,
        "probe_share": lists.PROBE_SHARE,
        "probe_share_fused": lists.PROBE_SHARE_FUSED,
        "regrow": lists.REGROW,
        "candidates_min": graphs.CANDIDATES_MIN,
        "candidates_per_k": graphs.CANDIDATES_PER_K,
        "candidates_widen": graphs.CANDIDATES_WIDEN,
    }


def _tune(server: LocalPostgres) -> None:
    """The bench's PostgreSQL set for a bulk load and its HNSW build, then restarted."""
    plain = server.url().replace("+psycopg", "")
    with psycopg.connect(plain, autocommit=True) as conn:
        for setting in (
            "maintenance_work_mem = '4GB'",  # the HNSW build in memory: far faster
            "shared_buffers = '2GB'",
            "max_parallel_maintenance_workers = 2",
        ):
            conn.execute(f"ALTER SYSTEM SET {setting}")
    server.stop()
    server.start()


def bench_scaleout(
    root: Path,
    chunks: int,
    questions: list[str],
    hnsw_builds: Sequence[tuple[int, int]] = (),
    keep: Path | None = None,
    *,
    rebuild: bool = True,
) -> SearchFigures:
    """With `keep`, the PostgreSQL server's data and the keyword index stay in that folder, and
    a later run of as many chunks measures them again without writing the chunks: pgvector's
    graphs and the keyword index are built again and timed, or, without `rebuild`, used as
    they were kept (the first searches then read them from disk, as after a restart)."""
    figures = SearchFigures("scale-out", chunks, len(questions))
    folder = keep or Path(tempfile.mkdtemp(prefix="kops-bench-search-pg-"))
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)  # PostgreSQL runs as `postgres` when we are root
    server = LocalPostgres(folder / "pg", port=free_port(), database="bench", durable=False)
    server.init()
    server.start()
    db: Database | None = None
    index: PgVectorIndex | None = None
    try:
        _tune(server)
        db = Database(server.url())
        upgrade(db.engine)
        reuse = keep is not None and _kept_chunks(db) == chunks
        if keep is not None and not reuse and _kept_chunks(db):
            raise ValueError(f"{keep} holds another corpus: give an empty folder")
        if reuse and rebuild:  # the keyword index's folder holds its state as well
            # (pg_changes.STATE_FILE): without it, it is built again as by a first API process
            shutil.rmtree(folder / "keywords", ignore_errors=True)
        index = PgVectorIndex(db, DIMENSION, keyword_folder=folder / "keywords")
        index.ensure()
        build = not reuse or rebuild
        if build:  # written without it, then built at once (as a bulk load would)
            with db.write() as tx:
                tx.exec_driver_sql(f"DROP INDEX ix_{index.table}_hnsw")
        dataset_ids = _datasets(db, write=not reuse)
        passages = Passages(faq_pages(root), DIMENSION)
        began = time.perf_counter()
        corpus = _write(index, db, passages, chunks, dataset_ids, write=not reuse)
        figures.write_s = round(time.perf_counter() - began, 1)
        figures.settings["reused_database"] = reuse
        figures.settings["rebuilt_side_indexes"] = build
        if build:
            _build_hnsw(figures, db, index)
        _pg_sizes(figures, db, index)
        if chunks >= index.keyword_min_chunks:
            _build_pg_keywords(figures, index, folder / "keywords")
        _measure_scaleout(figures, db, index, corpus, dataset_ids, questions, hnsw_builds)
    finally:
        if index is not None:
            index.close()
        if db is not None:
            db.dispose()
        server.stop()
        if keep is None:
            shutil.rmtree(folder, ignore_errors=True)
    return figures


def _measure_scaleout(
    figures: SearchFigures,
    db: Database,
    index: PgVectorIndex,
    corpus: Corpus,
    dataset_ids: Sequence[str],
    questions: Sequence[str],
    hnsw_builds: Sequence[tuple[int, int]],
) -> None:
    _measure(figures, index, corpus, dataset_ids, questions, HashingEmbedder(DIMENSION))
    figures.settings.update(_pg_breadth_sweeps(index, corpus, dataset_ids[0], questions))
    if index.keywords is not None and index.keywords.ready:
        _measure_pg_keywords(figures, db, index, dataset_ids, questions)
    if hnsw_builds:
        figures.settings["hnsw_sweep"] = _hnsw_sweep(
            db, index, corpus, dataset_ids[0], questions, hnsw_builds
        )


def _build_hnsw(figures: SearchFigures, db: Database, index: PgVectorIndex) -> None:
    """pgvector's graphs built over the written chunks at once, and timed."""
    began = time.perf_counter()
    with db.write() as tx:
        tx.exec_driver_sql(index.hnsw_ddl())
        tx.exec_driver_sql(f"ANALYZE {index.table}")
        tx.exec_driver_sql("ANALYZE chunks")
        tx.exec_driver_sql("ANALYZE documents")
    figures.index_build_s = round(time.perf_counter() - began, 1)


def _pg_sizes(figures: SearchFigures, db: Database, index: PgVectorIndex) -> None:
    """The graphs' size (what shared buffers must hold), the database's, and the settings."""
    with db.read() as conn:
        size = conn.execute(  # the index is partitioned: each dataset's graph, summed
            text(
                "SELECT (SELECT coalesce(sum(pg_relation_size(inhrelid)), 0) FROM "
                "pg_inherits WHERE inhparent = to_regclass(:i)), "
                "pg_database_size(current_database()), current_setting('shared_buffers')"
            ),
            {"i": f"ix_{index.table}_hnsw"},
        ).one()
    figures.index_memory_mb = round(int(size[0]) / 1e6, 1)
    figures.disk_mb = round(int(size[1]) / 1e6, 1)
    figures.settings.update(
        {
            "m": pgvector.HNSW_M,
            "ef_construction": pgvector.HNSW_EF_CONSTRUCTION,
            "ef_search": pgvector.HNSW_EF_SEARCH,
            "ef_fused": pgvector.HNSW_EF_FUSED,
            "filter_widen_power": pgvector.FILTER_WIDEN_POWER,
            "keyword_min_chunks": index.keyword_min_chunks,
            "shared_buffers": str(size[2]),
        }
    )


def run_search_bench(
    root: Path,
    *,
    chunks: int,
    topologies: Sequence[str] = TOPOLOGIES,
    questions: int = 200,
    keep: Path | None = None,
    rebuild: bool = True,
    hnsw_builds: Sequence[tuple[int, int]] = (),
    ingest_rounds: int = 0,
) -> list[SearchFigures]:
    if keep is not None and len(topologies) > 1:
        raise ValueError("a kept folder holds one topology's database: give --topology too")
    asked = _questions(root)
    picked = [asked[n % len(asked)] for n in range(0, len(asked), max(1, len(asked) // questions))]
    picked = picked[:questions]
    out = []
    for topology in topologies:
        if topology == "embedded":
            out.append(
                bench_embedded(
                    root, chunks, picked, keep, rebuild=rebuild, ingest_rounds=ingest_rounds
                )
            )
        else:
            out.append(bench_scaleout(root, chunks, picked, hnsw_builds, keep, rebuild=rebuild))
    return out


def render(figures: Sequence[SearchFigures]) -> Any:
    table = Table(title="kops bench search (p50 / p95 ms; recall@10 against exact)")
    columns = ("topology", "chunks", "search", "vector", "keyword", "hybrid", "recall@10")
    for column in (*columns, "hybrid recall@10"):
        table.add_column(column)
    for f in figures:
        for label in ("large", "large filtered", "small", "small filtered"):
            cells = []
            for mode in ("vector", "keyword", "hybrid"):
                got = f.latency_ms.get(f"{label} {mode}")
                cells.append("" if got is None else f"{got['p50']:g} / {got['p95']:g}")
            recall = f.recall_at_10.get(label)
            fused = f.settings.get("hybrid_recall_at_10", {}).get(label)
            table.add_row(
                f.topology,
                str(f.chunks),
                label,
                *cells,
                "" if recall is None else f"{recall:g}",
                "" if fused is None else f"{fused:g}",
            )
        table.add_row(
            f.topology,
            str(f.chunks),
            f"write {f.write_s:g} s, index {f.index_build_s:g} s, disk {f.disk_mb:g} MB, "
            f"index memory {f.index_memory_mb:g} MB",
            "",
            "",
            "",
            "",
            "",
        )
        ingestion = f.settings.get("ingestion")
        if ingestion:
            rates = {mode: statistics.median(r) for mode, r in ingestion["chunks_per_s"].items()}
            table.add_row(
                f.topology,
                str(f.chunks),
                f"ingestion {rates[KEPT]:.1f} chunks/s with the index kept, "
                f"{rates[NOT_KEPT]:.1f} without: {ingestion['throughput_lost_pct']:g}% lost; "
                f"its stage full {rates[FULL]:.1f}: "
                f"{ingestion['throughput_lost_stage_full_pct']:g}% lost "
                f"(snapshots {ingestion['snapshot_share_pct']:g}% more)",
                "",
                "",
                "",
                "",
                "",
            )
    return table
