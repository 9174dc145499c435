"""Shared fixtures: real databases (SQLite in a temp folder, PostgreSQL from a template)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from knowledgeops.db.engine import Database
from knowledgeops.db.migrate import upgrade
from knowledgeops.ingest.embedders.local import DIMENSION
from knowledgeops.ingest.index.pgvector import PgVectorIndex
from knowledgeops.lab.devpg import LocalPostgres, LocalPostgresError, free_port
from knowledgeops.lab.embedders import HashingEmbedder
from knowledgeops.roles.embedded import EmbeddedRole
from knowledgeops.settings import Settings

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
POSTGRES_URL = os.environ.get(
    "KOPS_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def unavailable(reason: str) -> None:
    """Skip locally; in CI a missing service is a failure, never a silent skip."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: services must be reachable)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def sqlite_db(tmp_path: object) -> Iterator[Database]:
    db = Database(f"sqlite:///{tmp_path}/kops.db")
    upgrade(db.engine)
    yield db
    db.dispose()


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[str]:
    """A migrated template database, made once per test session."""
    admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        admin.dispose()
        unavailable(f"PostgreSQL is not reachable at {make_url(POSTGRES_URL).host}: {exc}")
    name = f"kops_tpl_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(POSTGRES_URL).set(database=name)
    engine = create_engine(url)
    upgrade(engine)
    engine.dispose()
    yield name
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _database_from_template(admin_url: str, template: str) -> Iterator[Database]:
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    name = f"kops_t_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    db = Database(make_url(admin_url).set(database=name).render_as_string(hide_password=False))
    yield db
    db.dispose()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def postgres_db(postgres_template: str) -> Iterator[Database]:
    """A fresh, migrated PostgreSQL database for one test (CREATE DATABASE … TEMPLATE …)."""
    yield from _database_from_template(POSTGRES_URL, postgres_template)


@pytest.fixture
def postgres_empty_db(postgres_template: str) -> Iterator[Database]:
    """A fresh PostgreSQL database with no table at all (for migrating step by step)."""
    yield from _database_from_template(POSTGRES_URL, "template0")


@pytest.fixture(scope="session")
def pgvector_server() -> Iterator[LocalPostgres]:
    """PostgreSQL 16 with pgvector from the pgserver package, on a free port, for this session
    (the machine's PostgreSQL 15 has no pgvector); its `kops` database is migrated."""
    root = Path(tempfile.mkdtemp(prefix="kops-test-pg-"))
    server = LocalPostgres(root, free_port(), durable=False)
    try:
        server.start()
    except LocalPostgresError as exc:
        shutil.rmtree(root, ignore_errors=True)
        unavailable(f"PostgreSQL with pgvector (pgserver) could not start: {exc}")
    engine = create_engine(server.url())
    upgrade(engine)
    engine.dispose()
    db = Database(server.url())
    PgVectorIndex(db, DIMENSION).ensure()  # what `kops migrate` makes for the real model
    db.dispose()
    yield server
    server.destroy()


@pytest.fixture
def pgvector_db(pgvector_server: LocalPostgres) -> Iterator[Database]:
    """A fresh, migrated database with pgvector for one test."""
    yield from _database_from_template(pgvector_server.url("postgres"), pgvector_server.database)


@pytest.fixture
def make_runtime(tmp_path: Any) -> Iterator[Callable[..., EmbeddedRole]]:
    """Build an embedded runtime in a temp folder with the deterministic test embedder, fast
    timings and no embedding cache (unless asked for); started runtimes are stopped at the end
    of the test."""
    built: list[EmbeddedRole] = []

    def make(
        *,
        start: bool = True,
        embedder: Any = None,
        from_settings: str | None = None,
        **overrides: Any,
    ) -> EmbeddedRole:
        """`from_settings="local" | "openai"`: the runtime builds that embedder from the
        settings (KOPS_EMBEDDER), as in production, instead of the test embedder."""
        values: dict[str, Any] = {
            "data_dir": tmp_path / f"data{len(built)}",
            "workers": 2,
            "heartbeat_interval_s": 0.2,
            "stale_after_s": 5.0,
            "relay_interval_s": 0.1,
            "backoff_base_s": 0.05,
            "backoff_max_s": 0.2,
            "embed_batch_size": 8,
            "chunk_size": 64,
            "chunk_overlap": 8,
            # the embedder a test passes is what it observes; the cache has tests of its own
            "embed_cache": False,
        }
        values.update(overrides)
        if from_settings is not None:
            values["embedder"] = from_settings
        chosen = None if from_settings else (embedder or HashingEmbedder())
        runtime = EmbeddedRole(Settings(**values), embedder=chosen)
        built.append(runtime)
        if start:
            runtime.start()
        return runtime

    yield make
    for runtime in built:
        if runtime.started_at is not None:
            runtime.stop()


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 30.0,
    what: str = "condition",
    interval: float = 0.05,
) -> Any:
    """Poll until `predicate()` is truthy; returns its value or fails the test."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not met within {timeout:g} s")
        time.sleep(interval)
