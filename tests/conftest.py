"""Shared fixtures: real databases (SQLite in a temp folder, PostgreSQL from a template)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from knowledgeops.db.engine import Database
from knowledgeops.db.migrate import upgrade

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


@pytest.fixture
def postgres_db(postgres_template: str) -> Iterator[Database]:
    """A fresh, migrated PostgreSQL database for one test (CREATE DATABASE … TEMPLATE …)."""
    admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    name = f"kops_t_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{postgres_template}"'))
    db = Database(make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False))
    yield db
    db.dispose()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()
