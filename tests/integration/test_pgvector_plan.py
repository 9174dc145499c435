"""pgvector at a shared table: a dataset that is most of the table walks the HNSW index (the
planner's own plan, read with EXPLAIN), one that is a small share is searched exactly through
its btree, and a dataset filter never returns fewer than topK (a real PostgreSQL 16 with
pgvector)."""

from __future__ import annotations

import numpy as np
import pytest

from knowledgeops.db.engine import Database
from knowledgeops.ingest.index.base import IndexedChunk, chunk_id, text_hash
from knowledgeops.ingest.index.filters import SearchFilter
from knowledgeops.ingest.index.pgvector import HNSW_EF_SEARCH, PgVectorIndex
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
    index = PgVectorIndex(pgvector_db, DIMENSION, exact_max_rows=100)
    index.ensure()
    with pgvector_db.write() as conn:
        large, small = insert_dataset(conn), insert_dataset(conn)
    fill(index, large, 40, 100, seed=1)  # 4,000 chunks
    fill(index, small, 2, 50, seed=2)  # 100: 2.4% of the table
    with pgvector_db.write() as conn:
        conn.exec_driver_sql(f"ANALYZE {index.table}")
        conn.exec_driver_sql("ANALYZE chunks")
        conn.exec_driver_sql("ANALYZE documents")
    return index, large, small


def query() -> np.ndarray:
    vector = np.random.default_rng(9).normal(size=DIMENSION).astype(np.float32)
    return vector / np.linalg.norm(vector)


def test_a_large_dataset_walks_the_hnsw_index(shared) -> None:
    index, large, _ = shared
    with index.db.read() as conn:
        ef = index.ef_search(conn, large, 10, None)
    assert ef is not None
    assert HNSW_EF_SEARCH <= ef < 2 * HNSW_EF_SEARCH
    plan = index.explain_vector(large, query(), 10)
    assert f"Index Scan using ix_{index.table}_hnsw" in plan, plan
    assert len(index.search_vector(large, query(), 10)) == 10


def test_a_small_share_is_exact_through_its_btree(shared) -> None:
    index, _, small = shared
    with index.db.read() as conn:
        assert index.ef_search(conn, small, 10, None) is None
    plan = index.explain_vector(small, query(), 10)
    assert "hnsw" not in plan, plan
    assert f"ix_{index.table}_dataset" in plan, plan
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
    with index.db.read() as conn:  # half the dataset passes: the walk goes twice as wide
        ef = index.ef_search(conn, large, 10, half)
    assert ef is not None
    assert ef >= 2 * HNSW_EF_SEARCH - 1
    for dataset in (large, small):
        hits = index.search_vector(dataset, query(), 10, half)
        assert len(hits) == 10
    few = SearchFilter(document_ids=("00010000-0000-4000-8000-000000000003",))
    hits = index.search_vector(large, query(), 10, few)
    assert len(hits) == 10
    assert {h.document_id for h in hits} == set(few.document_ids or ())
