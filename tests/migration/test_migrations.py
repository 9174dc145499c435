"""The schema built by the migrations equals the declared one, on SQLite and on PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from knowledgeops.db.engine import Database
from knowledgeops.db.migrate import current_revision, head_revision, is_up_to_date, upgrade
from knowledgeops.db.schema import Base
from knowledgeops.ingest.index.sqlite import SqliteIndex

INDEX_TABLE_PREFIXES = ("chunk_vectors_", "chunk_fts")  # owned by the index adapter


def _declared_only(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    return not (type_ == "table" and name is not None and name.startswith(INDEX_TABLE_PREFIXES))


def schema_differences(db: Database) -> list[Any]:
    with db.engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "include_object": _declared_only}
        )
        return list(compare_metadata(context, Base.metadata))


@pytest.fixture(params=["sqlite", "postgres"])
def migrated(request: pytest.FixtureRequest) -> Database:
    db: Database = request.getfixturevalue(f"{request.param}_db")  # both fixtures migrate to head
    return db


def test_migrated_schema_equals_the_declared_schema(migrated: Database) -> None:
    assert schema_differences(migrated) == []
    assert is_up_to_date(migrated.engine)
    assert current_revision(migrated.engine) == head_revision()


def test_upgrade_is_idempotent(migrated: Database) -> None:
    upgrade(migrated.engine)
    assert schema_differences(migrated) == []


def test_expected_tables_and_keys(migrated: Database) -> None:
    inspector = inspect(migrated.engine)
    tables = set(inspector.get_table_names())
    assert {"datasets", "documents", "ingest_jobs", "outbox", "chunks", "alembic_version"} <= tables
    uniques = {tuple(u["column_names"]) for u in inspector.get_unique_constraints("chunks")}
    assert ("document_id", "generation", "ordinal") in uniques
    doc_uniques = {tuple(u["column_names"]) for u in inspector.get_unique_constraints("documents")}
    assert ("dataset_id", "sha256") in doc_uniques
    job_indexes = {tuple(i["column_names"]) for i in inspector.get_indexes("ingest_jobs")}
    assert ("status", "run_after") in job_indexes


def test_sqlite_index_tables_do_not_disturb_the_comparison(sqlite_db: Database) -> None:
    SqliteIndex(sqlite_db, 384).ensure()
    assert schema_differences(sqlite_db) == []


def test_a_fresh_database_starts_empty_and_upgrades(tmp_path: Any) -> None:
    db = Database(f"sqlite:///{tmp_path}/new.db")
    assert current_revision(db.engine) is None
    assert not is_up_to_date(db.engine)
    upgrade(db.engine)
    assert is_up_to_date(db.engine)
    db.dispose()


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_upgrading_from_0006_keeps_every_row_and_records_each_documents_model(
    engine: str, tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    """0007 rebuilds `ingest_jobs` on SQLite (its document_id becomes optional): the rows that
    refer to jobs and documents (outbox, parts, chunks) must all survive it, and every
    searchable document is recorded as embedded by its dataset's model."""
    if engine == "sqlite":
        db = Database(f"sqlite:///{tmp_path}/old.db")
    else:
        db = request.getfixturevalue("postgres_empty_db")
    upgrade(db.engine, "0006")
    now = "2026-12-01 10:00:00"
    with db.engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO datasets (id, tenant_id, name, description, embedding_model, chunk_size, "
            "chunk_overlap, is_default, created_at, updated_at) VALUES ('ds', 'default', 'n', '', "
            f"'model-a', 64, 8, false, '{now}', '{now}')"
        )
        for doc, active in (("d1", 1), ("d2", None)):
            conn.exec_driver_sql(
                "INSERT INTO documents (id, dataset_id, file_name, file_size, content_type, "
                "sha256, blob_key, status, active_generation, latest_generation, chunk_count, "
                f"created_at, updated_at) VALUES ('{doc}', 'ds', 'a.txt', 1, 'text/plain', "
                f"'{doc}', 'k', 'ready', {'NULL' if active is None else active}, 1, 1, "
                f"'{now}', '{now}')"
            )
        conn.exec_driver_sql(
            "INSERT INTO ingest_jobs (id, document_id, dataset_id, kind, generation, status, "
            "stage, processed_chunks, retryable, attempt, max_attempts, version, created_at, "
            f"updated_at) VALUES ('j1', 'd1', 'ds', 'ingest', 1, 'pending', 'queued', 0, false, "
            f"0, 3, 1, '{now}', '{now}')"
        )
        conn.exec_driver_sql(
            "INSERT INTO ingest_jobs (id, document_id, dataset_id, kind, parent_id, generation, "
            "status, stage, processed_chunks, retryable, attempt, max_attempts, version, "
            "created_at, updated_at) VALUES ('p1', 'd1', 'ds', 'part', 'j1', 1, 'pending', "
            f"'queued', 0, false, 0, 3, 1, '{now}', '{now}')"
        )
        conn.exec_driver_sql(
            "INSERT INTO job_parts (job_id, part_index, first_page, last_page, ordinal_base, "
            "max_chunks, chunk_size, chunk_overlap) VALUES ('p1', 0, 1, 10, 0, 100, 64, 8)"
        )
        conn.exec_driver_sql(
            "INSERT INTO outbox (job_id, created_at, available_at, publish_attempts) "
            f"VALUES ('j1', '{now}', '{now}', 0)"
        )
        conn.exec_driver_sql(
            "INSERT INTO chunks (id, document_id, dataset_id, generation, ordinal, text, "
            "content_hash, token_count) VALUES ('c1', 'd1', 'ds', 1, 0, 'x', 'h', 1)"
        )
    upgrade(db.engine)
    assert schema_differences(db) == []
    with db.engine.connect() as conn:
        counts = {
            table: conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one()
            for table in ("ingest_jobs", "job_parts", "outbox", "chunks", "documents")
        }
        models = dict(conn.exec_driver_sql("SELECT id, embedding_model FROM documents").all())
    assert counts == {"ingest_jobs": 2, "job_parts": 1, "outbox": 1, "chunks": 1, "documents": 2}
    assert models == {"d1": "model-a", "d2": None}
    if engine == "sqlite":
        with db.engine.connect() as conn:  # the pool's connections enforce foreign keys again
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar_one() == 1
        db.dispose()
