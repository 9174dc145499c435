"""What `kops migrate` and `kops keys` do straight on the database, with no running API: bring the
schema (and the index's tables) up to date, and reach the API keys.

On the embedded SQLite file, the data folder's lock is held while the schema changes (another
`kops serve` must not be using it), and `kops keys` brings the schema up to date first (the file
may be new); on PostgreSQL the keys need a current schema (`kops migrate`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from knowledgeops.db.engine import Database
from knowledgeops.db.lockfile import DataDirLock
from knowledgeops.db.migrate import current_revision, upgrade
from knowledgeops.roles.preflight import check_database, check_index, check_schema
from knowledgeops.roles.wiring import make_index, model_dimension
from knowledgeops.service.keys import ApiKeys
from knowledgeops.settings import Settings


def migrate_database(settings: Settings) -> tuple[str | None, str | None]:
    """Upgrade the schema to the newest revision and make the index's tables (pgvector's
    extension, or sqlite-vec's and FTS5's); returns the revisions before and after. Raises
    StartupError."""
    lock = DataDirLock(settings.data_dir)
    db: Database | None = None
    try:
        if settings.is_sqlite:
            lock.acquire()
        db = Database(settings.resolved_database_url)
        check_database(db)
        before = current_revision(db.engine)
        upgrade(db.engine)
        after = current_revision(db.engine)
        check_index(make_index(db, model_dimension(settings)), db, create=True)
        return before, after
    finally:
        if db is not None:
            db.dispose()
        lock.release()


@contextmanager
def api_keys(settings: Settings) -> Iterator[ApiKeys]:
    """The API keys of the database the settings name. Raises StartupError."""
    if settings.is_sqlite:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    db = Database(settings.resolved_database_url)
    try:
        check_database(db)
        if settings.is_sqlite:
            upgrade(db.engine)
        else:
            check_schema(db)
        yield ApiKeys(db)
    finally:
        db.dispose()
