"""Scale-out processes that cannot work stop at once with one line naming the setting and what
is wrong: no stack trace as the only clue, and never a password."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from knowledgeops.db.engine import Database
from knowledgeops.lab.devpg import LocalPostgres
from knowledgeops.lab.topology import kops_env

pytestmark = pytest.mark.postgres
SECRET = "s3cr3t-pw"


def kops(*args: str, **settings: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "knowledgeops.cli", *args],
        env=kops_env(**settings),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def refused(done: subprocess.CompletedProcess[str], *phrases: str) -> str:
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output
    assert SECRET not in output
    for phrase in phrases:
        assert phrase in done.stderr, done.stderr
    return done.stderr


def test_an_unreachable_database_is_named_without_its_password(tmp_path: Path) -> None:
    url = f"postgresql+psycopg://postgres:{SECRET}@127.0.0.1:1/kops"
    for role in ("api", "worker", "relay"):
        done = kops(role, database_url=url, broker_url="redis://127.0.0.1:6379/11")
        refused(done, "KOPS_DATABASE_URL: cannot connect to", "127.0.0.1:1/kops")


def test_an_unreachable_broker_is_named_without_its_password(
    pgvector_server: LocalPostgres, pgvector_db: Database
) -> None:
    broker = f"redis://:{SECRET}@127.0.0.1:1/0"
    for role in ("worker", "relay"):
        done = kops(role, database_url=pgvector_db.url, broker_url=broker)
        refused(done, "KOPS_BROKER_URL: cannot reach the broker at redis://", "127.0.0.1:1")


def test_a_missing_or_unsupported_broker_says_what_to_set(pgvector_db: Database) -> None:
    refused(kops("worker", database_url=pgvector_db.url), "needs a broker: set KOPS_BROKER_URL")
    done = kops("relay", database_url=pgvector_db.url, broker_url="kafka://127.0.0.1:9092")
    refused(done, "KOPS_BROKER_URL: the scheme 'kafka' is not supported")


def test_a_database_without_pgvector_is_refused_with_what_to_do(postgres_db: Database) -> None:
    """The machine's PostgreSQL 15 has no pgvector (the template database is migrated)."""
    done = kops("api", database_url=postgres_db.url)
    refused(done, "KOPS_DATABASE_URL", "no pgvector extension", "Install pgvector")


def test_a_schema_behind_the_code_asks_for_kops_migrate(pgvector_server: LocalPostgres) -> None:

    with psycopg.connect(
        host=pgvector_server.host, port=pgvector_server.port, user="postgres", autocommit=True
    ) as conn:
        conn.execute('DROP DATABASE IF EXISTS "kops_empty"')
        conn.execute('CREATE DATABASE "kops_empty"')
    done = kops("api", database_url=pgvector_server.url("kops_empty"))
    refused(done, "schema revision none (empty)", "run `kops migrate` first")
    migrated = kops("migrate", database_url=pgvector_server.url("kops_empty"))
    assert migrated.returncode == 0, migrated.stderr
    assert "migrated database from empty" in migrated.stdout


def test_sqlite_is_refused_by_the_scale_out_commands(tmp_path: Path) -> None:
    done = kops("worker", data_dir=tmp_path, broker_url="redis://127.0.0.1:6379/11")
    refused(done, "needs PostgreSQL", "kops serve")


def test_broker_and_cache_on_one_redis_database_is_a_settings_error(tmp_path: Path) -> None:
    done = kops(
        "relay",
        data_dir=tmp_path,
        broker_url="redis://127.0.0.1:6379/0",
        cache_url="redis://127.0.0.1:6379/0",
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "Traceback" not in output
    assert "same Redis database" in done.stderr
