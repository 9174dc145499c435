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
