"""`kops serve` (the embedded default) and `kops migrate` (the schema of either topology)."""

from __future__ import annotations

from typing import Annotated

import typer

from knowledgeops.cli.common import DataDirOpt, cannot_start, console, settings
from knowledgeops.errors import StartupError


def serve(
    port: Annotated[int | None, typer.Option(help="HTTP port (KOPS_PORT, default 8000).")] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind (KOPS_HOST).")] = None,
    data_dir: DataDirOpt = None,
    workers: Annotated[int | None, typer.Option(help="Worker threads (KOPS_WORKERS).")] = None,
) -> None:
    """Run the embedded default: API, workers and relay in one process, data in SQLite."""
    chosen = settings(port=port, host=host, data_dir=data_dir, workers=workers)
    from knowledgeops.roles import embedded  # noqa: PLC0415 (the service itself, for this command)

    try:
        embedded.serve(chosen)
    except StartupError as exc:  # another process holds the data folder
        raise cannot_start(exc) from None


def migrate(data_dir: DataDirOpt = None) -> None:
    """Bring the database schema (and the index's tables) up to date."""
    from knowledgeops.roles.admin import migrate_database  # noqa: PLC0415 (SQLAlchemy, Alembic)

    try:
        before, after = migrate_database(settings(data_dir=data_dir))
    except StartupError as exc:
        raise cannot_start(exc) from None
    if before == after:
        console.print(f"database is up to date (revision {after})")
    else:
        console.print(f"migrated database from {before or 'empty'} to {after}")


def register(app: typer.Typer) -> None:
    app.command()(serve)
    app.command()(migrate)
