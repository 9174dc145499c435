"""SQLite writers of one process queue on a lock: the next one starts when the one before it
commits, and one that waits past the busy timeout gets the error SQLite's own timeout gives."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from knowledgeops.db import engine as engine_module
from knowledgeops.db.engine import Database


def test_writers_take_turns_and_a_long_wait_is_a_database_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = Database(f"sqlite:///{tmp_path / 'w.db'}")
    try:
        with db.write() as conn:
            conn.execute(text("CREATE TABLE t (n INTEGER)"))
        holding, release = threading.Event(), threading.Event()

        def hold() -> None:
            with db.write() as conn:
                conn.execute(text("INSERT INTO t VALUES (1)"))
                holding.set()
                release.wait(10)

        holder = threading.Thread(target=hold)
        holder.start()
        assert holding.wait(5)
        monkeypatch.setattr(engine_module, "SQLITE_BUSY_TIMEOUT_MS", 100)
        with pytest.raises(OperationalError, match="database is locked"), db.write():
            pass
        monkeypatch.setattr(engine_module, "SQLITE_BUSY_TIMEOUT_MS", 10_000)
        waiter_done = threading.Event()

        def wait_then_write() -> None:
            with db.write() as conn:
                conn.execute(text("INSERT INTO t VALUES (2)"))
            waiter_done.set()

        waiter = threading.Thread(target=wait_then_write)
        waiter.start()
        assert not waiter_done.wait(0.2)  # queued behind the holder
        release.set()
        holder.join(5)
        assert waiter_done.wait(5)
        waiter.join(5)
        with db.read() as conn:
            assert [r[0] for r in conn.execute(text("SELECT n FROM t ORDER BY n"))] == [1, 2]
        with db.write() as conn:  # and the lock is free again
            conn.execute(text("INSERT INTO t VALUES (3)"))
    finally:
        db.dispose()


def test_a_long_write_is_logged_with_the_code_that_held_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A write transaction held SLOW_WRITE_S or longer is logged, naming its caller (the
    holder every other writer waited for); a shorter one is not."""
    db = Database(f"sqlite:///{tmp_path / 'w.db'}")
    try:
        with caplog.at_level("WARNING", logger="knowledgeops.db.engine"):
            with db.write() as conn:
                conn.execute(text("CREATE TABLE t (n INTEGER)"))
            assert not caplog.records
            monkeypatch.setattr(engine_module, "SLOW_WRITE_S", 0.2)

            def slow_writer() -> None:
                with db.write() as conn:
                    conn.execute(text("INSERT INTO t VALUES (1)"))
                    threading.Event().wait(0.3)

            slow_writer()
            with db.write() as conn:
                conn.execute(text("INSERT INTO t VALUES (2)"))
        (record,) = caplog.records
        assert re.search(r"held the database for \d+\.\d s, opened by ", record.getMessage())
        assert "slow_writer" in record.getMessage()
        assert "test_db_write_lock.py" in record.getMessage()
    finally:
        db.dispose()
