"""Schema migrations with Alembic, run from code (`kops migrate`, and when `kops serve` starts)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

MIGRATIONS = Path(__file__).with_name("migrations")


def alembic_config(engine: Engine) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["engine"] = engine
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the database to `revision` (default: the newest).

    On SQLite, a migration that changes a column rebuilds its table (Alembic's batch mode:
    copy, drop, rename), and dropping a table with foreign keys on deletes the rows that refer
    to it (ON DELETE CASCADE: a job's outbox row, a document's chunks). So foreign keys are off
    while the migrations run, as SQLite's own procedure for such changes says, and checked
    before the transaction commits."""
    cfg = alembic_config(engine)
    with engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        raw = conn.connection.dbapi_connection
        if sqlite:  # before the transaction begins: inside one, SQLite ignores the pragma
            assert raw is not None
            raw.execute("PRAGMA foreign_keys=OFF")
        try:
            with conn.begin():
                if not sqlite:  # two `kops migrate` at once: one waits
                    conn.exec_driver_sql("SELECT pg_advisory_xact_lock(hashtext('kops.migrate'))")
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, revision)
                if sqlite:
                    broken = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
                    if broken:
                        raise RuntimeError(f"the migration broke foreign keys: {broken[:5]}")
        finally:
            if sqlite:
                assert raw is not None
                raw.execute("PRAGMA foreign_keys=ON")


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str | None:
    return ScriptDirectory(str(MIGRATIONS)).get_current_head()


def is_up_to_date(engine: Engine) -> bool:
    return current_revision(engine) == head_revision()
