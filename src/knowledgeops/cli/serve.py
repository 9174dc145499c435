"""`kops serve` (the embedded default) and `kops migrate` (the schema of either topology)."""

from __future__ import annotations

from typing import Annotated

import typer

from knowledgeops.cli.common import DataDirOpt, cannot_start, console, settings
from knowledgeops.db.engine import Database
from knowledgeops.db.lockfile import DataDirLock
from knowledgeops.db.migrate import current_revision, upgrade
from knowledgeops.errors import StartupError
from knowledgeops.roles import embedded
from knowledgeops.roles.preflight import check_database, check_index
from knowledgeops.roles.wiring import make_index, model_dimension


def serve(
    port: Annotated[int | None, typer.Option(help="HTTP port (KOPS_PORT, default 8000).")] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind (KOPS_HOST).")] = None,
    data_dir: DataDirOpt = None,
    workers: Annotated[int | None, typer.Option(help="Worker threads (KOPS_WORKERS).")] = None,
) -> None:
    """Run the embedded default: API, workers and relay in one process, data in SQLite."""
    chosen = settings(port=port, host=host, data_dir=data_dir, workers=workers)
    try:
        embedded.serve(chosen)
    except StartupError as exc:  # another process holds the data folder
        raise cannot_start(exc) from None


def migrate(data_dir: DataDirOpt = None) -> None:
    """Bring the database schema (and the index's tables) up to date."""
    chosen = settings(data_dir=data_dir)
    lock = DataDirLock(chosen.data_dir)
    db: Database | None = None
    try:
        if chosen.is_sqlite:
            lock.acquire()
        db = Database(chosen.resolved_database_url)
        check_database(db)
        before = current_revision(db.engine)
        upgrade(db.engine)
        after = current_revision(db.engine)
        # pgvector's extension, or sqlite-vec's and FTS5's tables, and their indexes
        check_index(make_index(db, model_dimension(chosen)), db, create=True)
    except StartupError as exc:
        raise cannot_start(exc) from None
    finally:
        if db is not None:
            db.dispose()
        lock.release()
    if before == after:
        console.print(f"database is up to date (revision {after})")
    else:
        console.print(f"migrated database from {before or 'empty'} to {after}")


def register(app: typer.Typer) -> None:
    app.command()(serve)
    app.command()(migrate)
