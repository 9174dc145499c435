"""Start-up checks for the scale-out processes: a wrong database or broker URL, a schema that is
behind, or a database without pgvector stops the process at once with one sentence that names
the setting and what is wrong. URLs in messages never show a password."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import redis
from sqlalchemy.exc import DBAPIError

from knowledgeops.db.engine import Database
from knowledgeops.db.migrate import current_revision, head_revision
from knowledgeops.errors import IndexUnavailable, StartupError
from knowledgeops.ingest.index.base import ChunkIndex
from knowledgeops.roles.wiring import make_index, model_dimension
from knowledgeops.settings import Settings

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger(__name__)


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


def check_index(index: ChunkIndex, db: Database, *, create: bool = False) -> None:
    """The index's tables (and pgvector) are there (`create`: make them, as `kops migrate`
    does)."""
    try:
        index.ensure() if create else index.verify()
    except IndexUnavailable as exc:
        raise StartupError(f"KOPS_DATABASE_URL ({db.safe_url}): {exc}") from None


def require_broker(settings: Settings, role: str) -> str:
    from knowledgeops.jobs.celery_dispatch import SUPPORTED_SCHEMES, scheme_of  # noqa: PLC0415 (celery: heavy, only for a role with a broker)

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
    from knowledgeops.jobs.celery_dispatch import check_broker as connect  # noqa: PLC0415 (celery: heavy, only for a role with a broker)

    try:
        connect(app)
    except ConnectionError as exc:
        raise StartupError(f"KOPS_BROKER_URL: {exc}") from None


def check_cache(settings: Settings) -> None:
    if settings.cache_url is None or not settings.embed_cache:
        return

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


def check_scaleout(settings: Settings, role: str, *, broker: bool) -> Celery | None:
    """Everything a scale-out process needs before it starts: PostgreSQL, a current schema,
    pgvector and the index table, the cache (and the broker); returns the Celery app for a role
    with a broker. Raises StartupError. The API only warns about the cache: it can accept
    uploads without it."""
    require_postgres(settings, role)
    url = require_broker(settings, role) if broker else None
    db = Database(settings.resolved_database_url)
    try:
        check_database(db)
        check_schema(db)
        check_index(make_index(db, model_dimension(settings)), db)
    finally:
        db.dispose()
    try:
        check_cache(settings)
    except StartupError as exc:
        if broker:
            raise
        log.warning("%s; searches embed their queries without the cache until it answers", exc)
    if url is None:
        return None
    from knowledgeops.jobs.celery_dispatch import make_celery  # noqa: PLC0415 (celery: heavy, only for a role with a broker)

    app = make_celery(
        url,
        job_time_limit_s=settings.job_time_limit_s,
        visibility_timeout_s=settings.visibility_timeout_s,
    )
    check_broker(app)
    return app
