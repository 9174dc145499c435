"""pgvector partitioned by dataset: a search reads its dataset's partition alone (the planner's
own plan, read with EXPLAIN), walks that partition's HNSW graph when the dataset is large and
scans it exactly when it is small, and a filter never returns fewer than topK (a real
PostgreSQL 16 with pgvector)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from knowledgeops.db.engine import Database
from knowledgeops.ingest.index.base import IndexedChunk, chunk_id, text_hash
from knowledgeops.ingest.index.filters import SearchFilter
from knowledgeops.ingest.index.pgvector import (
    HNSW_EF_FUSED,
    HNSW_EF_SEARCH,
    HNSW_MAX_EF_SEARCH,
    PgVectorIndex,
)
from tests.fixtures.rows import insert_dataset, insert_document

pytestmark = [pytest.mark.postgres]

DIMENSION = 32


def fill(index: PgVectorIndex, dataset: str, documents_count: int, per_document: int, seed: int):
    rng = np.random.default_rng(seed)
    with index.db.write() as tx:
        for d in range(documents_count):
            document = f"{seed:04d}0000-0000-4000-8000-{d:012d}"
            insert_document(tx, dataset, document, meta={"half": d % 2})
            vectors = rng.normal(size=(per_document, DIMENSION)).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            index.upsert(
                tx,
                [
                    IndexedChunk(
                        id=chunk_id(document, 1, n),
                        document_id=document,
                        dataset_id=dataset,
                        generation=1,
                        ordinal=n,
                        text=f"chunk {n}",
                        content_hash=text_hash(f"chunk {n}"),
                        token_count=2,
                        page_start=None,
                        page_end=None,
                        section=None,
                        vector=vectors[n],
                    )
                    for n in range(per_document)
                ],
            )
            index.activate(tx, document, 1)


@pytest.fixture
def shared(pgvector_db: Database) -> tuple[PgVectorIndex, str, str]:
    index = PgVectorIndex(pgvector_db, DIMENSION, exact_max_rows=200)
    index.ensure()
    with pgvector_db.write() as conn:
        large, small = insert_dataset(conn), insert_dataset(conn)
    fill(index, large, 40, 100, seed=1)  # 4,000 chunks
    fill(index, small, 2, 50, seed=2)  # 100: under exact_max_rows
    with pgvector_db.write() as conn:
        conn.exec_driver_sql(f"ANALYZE {index.table}")
        conn.exec_driver_sql("ANALYZE chunks")
        conn.exec_driver_sql("ANALYZE documents")
    return index, large, small


def query() -> np.ndarray:
    vector = np.random.default_rng(9).normal(size=DIMENSION).astype(np.float32)
    return vector / np.linalg.norm(vector)


def hnsw_of(index: PgVectorIndex, dataset: str) -> str:
    """The name PostgreSQL gave the HNSW index of a dataset's partition."""
    with index.db.read() as conn:
        return str(
            conn.exec_driver_sql(
                "SELECT indexname FROM pg_indexes WHERE tablename = %(p)s "
                "AND indexdef LIKE '%%USING hnsw%%'",
                {"p": index.partition(dataset)},
            ).scalar_one()
        )


def test_each_dataset_has_its_own_partition_and_graph(shared) -> None:
    index, large, small = shared
    with index.db.read() as conn:
        counts = dict(
            conn.exec_driver_sql(
                "SELECT c.relname, c.reltuples FROM pg_inherits i JOIN pg_class c "
                "ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%(t)s)",
                {"t": index.table},
            ).all()
        )
    assert counts == {index.partition(large): 4000, index.partition(small): 100}
    assert hnsw_of(index, large) != hnsw_of(index, small)


def test_a_large_dataset_walks_its_own_graph(shared) -> None:
    index, large, small = shared
    with index.db.read() as conn:
        ef = index.ef_search(conn, large, 10, None)
    assert ef == HNSW_EF_SEARCH  # the whole partition passes: no widening
    with index.db.read() as conn:  # a hybrid search's vector list walks from its own breadth
        assert index.ef_search(conn, large, 40, None, fused=True) == HNSW_EF_FUSED
    plan = index.explain_vector(large, query(), 10)
    assert f"Index Scan using {hnsw_of(index, large)}" in plan, plan
    assert index.partition(small) not in plan, plan  # the other dataset is never read
    hits = index.search_vector(large, query(), 10)
    assert len(hits) == 10
    with index.db.read() as conn:
        owners = conn.exec_driver_sql(
            "SELECT DISTINCT dataset_id FROM chunks WHERE id = ANY(%(ids)s)",
            {"ids": [h.chunk_id for h in hits]},
        ).scalars()
        assert list(owners) == [large]


def test_a_small_dataset_is_an_exact_scan_of_its_partition(shared) -> None:
    index, large, small = shared
    with index.db.read() as conn:
        assert index.ef_search(conn, small, 10, None) is None
    plan = index.explain_vector(small, query(), 10)
    assert hnsw_of(index, small) not in plan, plan
    assert f"Seq Scan on {index.partition(small)}" in plan, plan
    assert index.partition(large) not in plan, plan
    hits = index.search_vector(small, query(), 10)
    assert len(hits) == 10
    with index.db.read() as conn:  # exactly the nearest: compared with a full sort
        best = conn.exec_driver_sql(
            f"SELECT c.id FROM {index.table} v JOIN chunks c ON c.seq = v.seq "
            "WHERE v.dataset_id = %(d)s ORDER BY v.embedding <=> CAST(%(q)s AS vector), v.seq "
            "LIMIT 10",
            {"d": small, "q": "[" + ",".join(map(repr, query().tolist())) + "]"},
        ).all()
    assert [h.chunk_id for h in hits] == [row[0] for row in best]


def test_a_filter_still_returns_top_k(shared) -> None:
    index, large, small = shared
    half = SearchFilter(metadata=(("half", (1,)),))
    with index.db.read() as conn:  # half the dataset passes: the walk goes √2 times as wide
        ef = index.ef_search(conn, large, 10, half)
    assert ef is not None
    assert ef == int(HNSW_EF_SEARCH * math.sqrt(2))
    with index.db.read() as conn:
        assert index.ef_search(conn, large, 10, half, fused=True) == int(
            HNSW_EF_FUSED * math.sqrt(2)
        )
    with index.db.read() as conn:  # … and far enough that twice k of its rows pass
        assert index.ef_search(conn, large, 150, half) == 600
        assert index.ef_search(conn, large, 300, half) == HNSW_MAX_EF_SEARCH  # pgvector's cap
    for dataset in (large, small):
        hits = index.search_vector(dataset, query(), 10, half)
        assert len(hits) == 10
    few = SearchFilter(document_ids=("00010000-0000-4000-8000-000000000003",))
    with index.db.read() as conn:  # 100 of 4,000 pass: exact
        assert index.ef_search(conn, large, 10, few) is None
    hits = index.search_vector(large, query(), 10, few)
    assert len(hits) == 10
    assert {h.document_id for h in hits} == set(few.document_ids or ())
