"""pgvector specifics the shared index contract does not cover: the HNSW index itself, exact
results for a small dataset inside a large table, and a clear error where pgvector is missing."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import text

from knowledgeops.db.engine import Database
from knowledgeops.ingest.index import pgvector
from knowledgeops.ingest.index.base import IndexedChunk, chunk_id, text_hash
from knowledgeops.ingest.index.pgvector import PgVectorIndex, PgVectorMissing
from tests.fixtures.rows import insert_dataset, insert_document

pytestmark = pytest.mark.postgres
DIM = 16


def _dataset_with_document(db: Database) -> tuple[str, str]:
    with db.write() as conn:
        dataset_id = insert_dataset(conn)
        return dataset_id, insert_document(conn, dataset_id)


def _rows(
    document_id: str, dataset_id: str, generation: int, count: int, rng: np.random.Generator
) -> list[IndexedChunk]:
    vectors = rng.normal(size=(count, DIM)).astype(np.float32)
    return [
        IndexedChunk(
            id=chunk_id(document_id, generation, n),
            document_id=document_id,
            dataset_id=dataset_id,
            generation=generation,
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


def _fill(index: PgVectorIndex, db: Database, count: int, rng: np.random.Generator) -> str:
    dataset_id, document_id = _dataset_with_document(db)
    rows = _rows(document_id, dataset_id, 1, count, rng)
    with db.write() as conn:
        for start in range(0, count, 500):
            index.upsert(conn, rows[start : start + 500])
        assert index.activate(conn, document_id, 1) == count
    return dataset_id


def _counts(index: PgVectorIndex) -> tuple[dict[str, int], dict[str, int]]:
    """Rows in each partition of the index table, and chunks per dataset."""
    with index.db.read() as conn:
        names = conn.exec_driver_sql(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass(%(t)s)",
            {"t": index.table},
        ).scalars()
        partitions = {
            name: conn.exec_driver_sql(f"SELECT count(*) FROM {name}").scalar_one()
            for name in list(names)
        }
        per_dataset = dict(
            conn.exec_driver_sql("SELECT dataset_id, count(*) FROM chunks GROUP BY 1").all()
        )
    return partitions, per_dataset


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


def test_migrate_builds_again_an_hnsw_index_of_other_parameters(pgvector_db: Database) -> None:
    """An index built by an older version (M 16, ef_construction 64) is built again with this
    version's parameters by `kops migrate` (ensure), every partition's graph, and answers."""
    index = PgVectorIndex(pgvector_db, DIM)
    index.ensure()
    with pgvector_db.write() as conn:
        conn.exec_driver_sql(f"DROP INDEX ix_{index.table}_hnsw")
        conn.exec_driver_sql(index.hnsw_ddl(16, 64))
    rng = np.random.default_rng(5)
    dataset_id = _fill(index, pgvector_db, 600, rng)
    with pgvector_db.read() as conn:
        assert index.hnsw_options(conn) == {"m": 16, "ef_construction": 64}
    index.ensure()
    with pgvector_db.read() as conn:
        assert index.hnsw_options(conn) == {
            "m": pgvector.HNSW_M,
            "ef_construction": pgvector.HNSW_EF_CONSTRUCTION,
        }
        partitions = conn.execute(
            text(
                "SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = to_regclass(:i) AND c.reloptions = :o"
            ),
            {
                "i": f"ix_{index.table}_hnsw",
                "o": [f"m={pgvector.HNSW_M}", f"ef_construction={pgvector.HNSW_EF_CONSTRUCTION}"],
            },
        ).scalar_one()
    assert partitions == 1  # the dataset's graph itself was built again
    query = rng.normal(size=DIM).astype(np.float32)
    assert len(index.search_vector(dataset_id, query, 10)) == 10


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


def test_deleted_chunks_take_their_rows_and_a_deleted_datasets_partition_goes_at_migrate(
    pgvector_db: Database,
) -> None:
    """No foreign key deletes a partition's rows: the adapter does, for each way chunks go."""
    index = PgVectorIndex(pgvector_db, DIM)
    index.ensure()
    rng = np.random.default_rng(3)
    a, b = _fill(index, pgvector_db, 50, rng), _fill(index, pgvector_db, 20, rng)
    with pgvector_db.read() as conn:
        doc_a, doc_b = (
            conn.execute(text("SELECT id FROM documents WHERE dataset_id = :d"), {"d": d}).scalar()
            for d in (a, b)
        )
    pa, pb = index.partition(a), index.partition(b)
    assert _counts(index) == ({pa: 50, pb: 20}, {a: 50, b: 20})
    with pgvector_db.write() as conn:  # a new generation replaces the old one's rows
        index.upsert(conn, _rows(doc_a, a, 2, 30, rng))
        assert _counts(index)[0][pa] == 50  # another transaction does not see them yet
        assert index.activate(conn, doc_a, 2) == 30
    assert _counts(index) == ({pa: 30, pb: 20}, {a: 30, b: 20})
    with pgvector_db.write() as conn:  # an unfinished generation's parts are discarded
        index.upsert(conn, _rows(doc_a, a, 3, 15, rng))
        index.discard(conn, doc_a, 3, (0, 10))
    assert _counts(index) == ({pa: 35, pb: 20}, {a: 35, b: 20})
    with pgvector_db.write() as conn:
        index.discard(conn, doc_a, 3)
        index.delete_document(conn, doc_b)
    assert _counts(index) == ({pa: 30, pb: 0}, {a: 30})
    with pgvector_db.write() as conn:
        index.delete_dataset(conn, a)
        conn.execute(text("DELETE FROM datasets WHERE id = :d"), {"d": a})
    assert _counts(index) == ({pa: 0, pb: 0}, {})
    index.ensure()  # what `kops migrate` runs: the deleted dataset's partition is dropped
    assert _counts(index) == ({pb: 0}, {})
    assert _fill(index, pgvector_db, 5, rng)  # and a new dataset gets one at its first write
    assert len(_counts(index)[0]) == 2


def test_a_table_of_the_shared_layout_is_moved_into_partitions(pgvector_db: Database) -> None:
    index = PgVectorIndex(pgvector_db, DIM)
    index.ensure()
    rng = np.random.default_rng(5)
    large, small = _fill(index, pgvector_db, 300, rng), _fill(index, pgvector_db, 40, rng)
    query = rng.normal(size=DIM).astype(np.float32)
    before = {d: index.search_vector(d, query, 10) for d in (large, small)}
    table = index.table
    with pgvector_db.write() as conn:  # the layout `kops migrate` made before: one table
        conn.exec_driver_sql(f"CREATE TABLE shared AS SELECT * FROM {table}")
        conn.exec_driver_sql(f"DROP TABLE {table}")
        conn.exec_driver_sql(f"ALTER TABLE shared RENAME TO {table}")
        conn.exec_driver_sql(
            f"ALTER TABLE {table} ADD PRIMARY KEY (seq), "
            "ADD FOREIGN KEY (seq) REFERENCES chunks (seq) ON DELETE CASCADE"
        )
        conn.exec_driver_sql(
            f"CREATE INDEX ix_{table}_hnsw ON {table} USING hnsw (embedding vector_cosine_ops)"
        )
        conn.exec_driver_sql(
            f"CREATE INDEX ix_{table}_{index.words} ON {table} USING gin ({index.words})"
        )
        conn.exec_driver_sql(f"CREATE INDEX ix_{table}_dataset ON {table} (dataset_id, active)")
    upgraded = PgVectorIndex(pgvector_db, DIM)
    with pytest.raises(PgVectorMissing, match=r"older layout.*run `kops migrate`"):
        upgraded.verify()
    upgraded.ensure()
    upgraded.verify()
    assert _counts(upgraded)[0] == {index.partition(large): 300, index.partition(small): 40}
    with pgvector_db.read() as conn:
        assert conn.exec_driver_sql(f"SELECT to_regclass('{table}_shared')").scalar() is None
        indexes = set(
            conn.execute(
                text("SELECT indexdef FROM pg_indexes WHERE tablename = :p"),
                {"p": index.partition(large)},
            ).scalars()
        )
    assert any("USING hnsw (embedding vector_cosine_ops)" in i for i in indexes), indexes
    assert any(f"USING gin ({index.words})" in i for i in indexes), indexes
    for dataset, hits in before.items():
        assert upgraded.search_vector(dataset, query, 10) == hits
        assert len(upgraded.search_keyword(dataset, "chunk", 5)) == 5
