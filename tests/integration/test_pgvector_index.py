"""pgvector specifics the shared index contract does not cover: the HNSW index itself, exact
results for a small dataset inside a large table, and a clear error where pgvector is missing."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import text

from knowledgeops.db.engine import Database
from knowledgeops.ingest.index.base import IndexedChunk, chunk_id, text_hash
from knowledgeops.ingest.index.pgvector import PgVectorIndex, PgVectorMissing
from tests.fixtures.rows import insert_dataset, insert_document

pytestmark = pytest.mark.postgres
DIM = 16


def _dataset_with_document(db: Database) -> tuple[str, str]:
    with db.write() as conn:
        dataset_id = insert_dataset(conn)
        return dataset_id, insert_document(conn, dataset_id)


def _fill(index: PgVectorIndex, db: Database, count: int, rng: np.random.Generator) -> str:
    dataset_id, document_id = _dataset_with_document(db)
    vectors = rng.normal(size=(count, DIM)).astype(np.float32)
    rows = [
        IndexedChunk(
            id=chunk_id(document_id, 1, n),
            document_id=document_id,
            dataset_id=dataset_id,
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
        for n in range(count)
    ]
    with db.write() as conn:
        for start in range(0, count, 500):
            index.upsert(conn, rows[start : start + 500])
        assert index.activate(conn, document_id, 1) == count
    return dataset_id


def test_vectors_have_an_hnsw_cosine_index_and_words_a_gin_index(pgvector_db: Database) -> None:
    index = PgVectorIndex(pgvector_db, DIM)
    index.ensure()
    index.ensure()  # idempotent
    with pgvector_db.read() as conn:
        definitions = conn.execute(
            text("SELECT indexdef FROM pg_indexes WHERE tablename = :t"), {"t": index.table}
        ).scalars()
        joined = "\n".join(definitions)
    assert "USING hnsw (embedding vector_cosine_ops)" in joined
    assert "USING gin (words_v2)" in joined


def test_a_small_dataset_in_a_large_table_gets_all_its_neighbours(pgvector_db: Database) -> None:
    index = PgVectorIndex(pgvector_db, DIM)
    index.ensure()
    rng = np.random.default_rng(7)
    _fill(index, pgvector_db, 3000, rng)
    small = _fill(index, pgvector_db, 7, rng)
    with pgvector_db.write() as conn:
        conn.exec_driver_sql(f"ANALYZE {index.table}")
    hits = index.search_vector(small, rng.normal(size=DIM).astype(np.float32), 10)
    assert len(hits) == 7
    assert len({hit.chunk_id for hit in hits}) == 7
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_large_dataset_search_matches_exact_ranking(pgvector_db: Database) -> None:
    index = PgVectorIndex(pgvector_db, DIM)
    index.ensure()
    rng = np.random.default_rng(11)
    dataset_id = _fill(index, pgvector_db, 2000, rng)
    query = rng.normal(size=DIM).astype(np.float32)
    hits = index.search_vector(dataset_id, query, 10)
    with pgvector_db.read() as conn:
        conn.exec_driver_sql("SET LOCAL enable_indexscan = off")
        exact = conn.execute(
            text(
                f"SELECT c.id FROM {index.table} v JOIN chunks c ON c.seq = v.seq "
                "ORDER BY v.embedding <=> CAST(:q AS vector) LIMIT 10"
            ),
            {"q": "[" + ",".join(map(str, query.tolist())) + "]"},
        ).scalars()
        exact_ids = list(exact)
    recall = len({hit.chunk_id for hit in hits} & set(exact_ids)) / 10
    assert len(hits) == 10
    assert recall >= 0.9


def test_a_database_without_pgvector_is_named_with_what_to_do(postgres_db: Database) -> None:
    """The machine's PostgreSQL 15 has no pgvector package: start-up must say so plainly."""
    with pytest.raises(PgVectorMissing, match=r"no pgvector extension.*Install pgvector"):
        PgVectorIndex(postgres_db, DIM).ensure()
