"""Start-up checks for the scale-out processes: a wrong database or broker URL, a schema that is
behind, or a database without pgvector stops the process at once with one sentence that names
the setting and what is wrong. URLs in messages never show a password."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy.exc import DBAPIError

from knowledgeops.db.engine import Database
from knowledgeops.db.migrate import current_revision, head_revision
from knowledgeops.ingest.index.pgvector import PgVectorIndex, PgVectorMissing
from knowledgeops.settings import Settings

if TYPE_CHECKING:
    from celery import Celery


class StartupError(Exception):
    """The process cannot start; the message says which setting to fix and how."""


def _first_line(exc: BaseException) -> str:
    original = getattr(exc, "orig", None) or exc
    lines = str(original).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def require_postgres(settings: Settings, role: str) -> None:
    if settings.is_sqlite:
        raise StartupError(
            f"`kops {role}` is part of the scale-out topology and needs PostgreSQL: set "
            "KOPS_DATABASE_URL=postgresql+psycopg://USER@HOST:PORT/DB (with pgvector). "
            "To run everything in one process on SQLite, use `kops serve`."
        )


def check_database(db: Database) -> None:
    try:
        db.ping()
    except DBAPIError as exc:
        raise StartupError(
            f"KOPS_DATABASE_URL: cannot connect to {db.safe_url}: {_first_line(exc)}"
        ) from None
    except Exception as exc:  # a bad driver name, an unknown host
        raise StartupError(f"KOPS_DATABASE_URL: {db.safe_url}: {_first_line(exc)}") from None


def check_schema(db: Database) -> None:
    current, head = current_revision(db.engine), head_revision()
    if current != head:
        raise StartupError(
            f"the database at {db.safe_url} is at schema revision {current or 'none (empty)'}, "
            f"this version needs {head}: run `kops migrate` first"
        )


def check_index(index: object, db: Database, *, create: bool = False) -> None:
    """pgvector and the index tables are there (`create`: make them, as `kops migrate` does)."""
    if not isinstance(index, PgVectorIndex):
        return
    try:
        index.ensure() if create else index.verify()
    except PgVectorMissing as exc:
        raise StartupError(f"KOPS_DATABASE_URL ({db.safe_url}): {exc}") from None


def require_broker(settings: Settings, role: str) -> str:
    from knowledgeops.jobs.celery_dispatch import SUPPORTED_SCHEMES, scheme_of

    if settings.broker_url is None:
        raise StartupError(
            f"`kops {role}` needs a broker: set KOPS_BROKER_URL (for example "
            "redis://127.0.0.1:6379/0 or amqp://guest:guest@127.0.0.1:5672//)"
        )
    url = settings.broker_url.get_secret_value()
    scheme = scheme_of(url)
    if scheme not in SUPPORTED_SCHEMES:
        raise StartupError(
            f"KOPS_BROKER_URL: the scheme {scheme or '(none)'!r} is not supported; use "
            "redis://, rediss:// or amqp://"
        )
    return url


def check_broker(app: Celery) -> None:
    from knowledgeops.jobs.celery_dispatch import check_broker as connect

    try:
        connect(app)
    except ConnectionError as exc:
        raise StartupError(f"KOPS_BROKER_URL: {exc}") from None


def check_cache(settings: Settings) -> None:
    if settings.cache_url is None or not settings.embed_cache:
        return
    import redis

    client = redis.Redis.from_url(
        settings.cache_url.get_secret_value(), socket_timeout=5, socket_connect_timeout=5
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        pool_kwargs = client.connection_pool.connection_kwargs
        where = f"{pool_kwargs.get('host')}:{pool_kwargs.get('port')}/{pool_kwargs.get('db')}"
        raise StartupError(f"KOPS_CACHE_URL: cannot reach Redis at {where}: {exc}") from None
    finally:
        client.close()
