"""Opening the database: one `Database` per process, with read and write transactions.

SQLite runs through `sqlean` (the machine's own sqlite3 cannot load extensions) with WAL, a busy
timeout, foreign keys on, sqlite-vec loaded on every connection, and `BEGIN IMMEDIATE` for writes so
two writers queue on the busy timeout instead of failing half-way through a transaction.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlean
import sqlite_vec
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

Tx = Connection
"""The one seam every layer shares: the open transaction a write joins (the job store's own
writes, the index's rows, a handler's rows, a listener's updates), so they commit together or not
at all. The in-memory twins of the job store and the index have no database: they hand None."""

SQLITE_BUSY_TIMEOUT_MS = 30_000  # ms
SQLITE_POOL_SIZE = 16  # connections kept open
SQLITE_POOL_OVERFLOW = 64  # more opened under load
CONNECT_TIMEOUT_S = 10  # s: a server that does not answer fails the connection, not the process
IDLE_IN_TX_LIMIT_S = 120  # s: our transactions are short; one idle this long was abandoned
SLOW_WRITE_S = 5.0  # s: a write transaction held this long is logged with the code that held it
# (SQLite's other writers wait for it, and give up after the busy timeout)

log = logging.getLogger(__name__)


def _sqlite_engine(url: str) -> Engine:

    # SQLite connections are cheap; a roomy pool keeps API threads, workers, the relay and the
    # heartbeat from queueing for a connection while one of them waits on the write lock.
    engine = create_engine(
        url,
        module=sqlean,
        connect_args={"check_same_thread": False, "timeout": 30},
        pool_size=SQLITE_POOL_SIZE,
        max_overflow=SQLITE_POOL_OVERFLOW,
        pool_timeout=60,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (see _on_begin)
        dbapi_conn.enable_load_extension(True)
        sqlite_vec.load(dbapi_conn)
        dbapi_conn.enable_load_extension(False)
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = "IMMEDIATE" if conn.get_execution_options().get("kops_write") else "DEFERRED"
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


def create_db_engine(url: str) -> Engine:
    if make_url(url).get_backend_name() == "sqlite":
        return _sqlite_engine(url)
    return create_engine(
        url,
        pool_pre_ping=True,
        pool_size=10,
        max_overflow=10,
        pool_timeout=30,
        connect_args={
            "connect_timeout": CONNECT_TIMEOUT_S,
            # a process frozen inside a transaction (SIGSTOP, a VM pause) must not hold its
            # row locks for ever: PostgreSQL ends such a session after this long
            "options": f"-c idle_in_transaction_session_timeout={IDLE_IN_TX_LIMIT_S * 1000}",
        },
    )


@contextmanager
def _timed() -> Iterator[None]:
    """Log a write transaction that ran for SLOW_WRITE_S or longer, with where it was opened
    (the frames outside this module and contextlib: the caller of `write()`)."""
    began = time.monotonic()
    try:
        yield
    finally:
        held = time.monotonic() - began
        if held >= SLOW_WRITE_S:
            frames = [
                f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} {frame.name}"
                for frame in traceback.extract_stack()[:-1]
                if not frame.filename.endswith(("engine.py", "contextlib.py"))
            ]
            log.warning(
                "a write transaction held the database for %.1f s, opened by %s",
                held,
                " < ".join(reversed(frames[-4:])),
            )


class Database:
    """The process's handle on the database: `write()` and `read()` transactions."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = create_db_engine(url)
        self.dialect = self.engine.dialect.name
        # SQLite has one writer at a time. Its own busy handler makes a waiting writer sleep
        # and poll (up to 100 ms a nap), so under steady worker writes an upload can wait for
        # a second; this process's writers queue on a lock instead and are woken the moment
        # the writer before them commits. Other processes still meet the busy timeout.
        self._write_lock: threading.RLock | None = threading.RLock() if self.is_sqlite else None

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A transaction that may write; commits on success, rolls back on any exception."""
        if self._write_lock is None:
            with self._transaction() as conn, _timed():
                yield conn
            return
        if not self._write_lock.acquire(timeout=SQLITE_BUSY_TIMEOUT_MS / 1000):
            # what SQLite's own busy timeout raises, so it is handled the same (transient; 503)
            raise OperationalError(
                "BEGIN IMMEDIATE", None, sqlite3.OperationalError("database is locked")
            )
        try:
            with self._transaction() as conn, _timed():
                yield conn
        finally:
            self._write_lock.release()

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            conn.execution_options(kops_write=True)  # read by _on_begin: BEGIN IMMEDIATE
            with conn.begin():
                yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read-only transaction (a consistent snapshot; never takes the write lock)."""
        with self.engine.connect() as conn, conn.begin():
            yield conn

    @property
    def safe_url(self) -> str:
        """The URL with its password hidden, for messages and logs."""
        return make_url(self.url).render_as_string(hide_password=True)

    def ping(self) -> None:
        with self.read() as conn:
            conn.execute(text("SELECT 1"))

    def dispose(self) -> None:
        self.engine.dispose()
