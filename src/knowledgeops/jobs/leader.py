"""One active relay among several (docs/architecture.md: Two topologies): a PostgreSQL
session-level advisory lock.

The leader holds the lock on a connection of its own. When its process dies, PostgreSQL closes
the session and frees the lock at once; a standby polling `pg_try_advisory_lock` takes over on
its next try. TCP keepalives on that session make the server notice a vanished machine (no FIN)
within seconds too. A leader that can no longer reach its session steps down before it acts again.
Two relays active for a moment would still be harmless (publishing twice is at-least-once; every
state change is a compare-and-set), the lock only keeps them from doubling the work.
"""

from __future__ import annotations

import logging
import zlib

import psycopg
from sqlalchemy.engine import make_url

log = logging.getLogger(__name__)

KEEPALIVE_IDLE_S = 5  # s
KEEPALIVE_INTERVAL_S = 2  # s
KEEPALIVE_COUNT = 3
CONNECT_TIMEOUT_S = 5  # s


def lock_key(name: str) -> int:
    """A stable 32-bit key for `name` (advisory locks are keyed by integers)."""
    return zlib.crc32(name.encode())


class AdvisoryLeader:
    def __init__(self, database_url: str, name: str = "kops.relay") -> None:
        url = make_url(database_url)
        if url.get_backend_name() != "postgresql":
            raise ValueError("leader election needs PostgreSQL")
        self._conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self.key = lock_key(name)
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._leading = False

    @property
    def is_leader(self) -> bool:
        return self._leading

    def try_acquire(self) -> bool:
        """True when this process holds (or now took) the lock. A standby keeps its session
        open and asks again on it, rather than reconnecting on every try."""
        if self._leading:
            return self.still_leader()
        try:
            conn = self._session()
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()
        except Exception:
            self._drop()
            raise
        if row is None or not row[0]:
            return False
        self._leading = True
        log.info("relay: this process is now the active relay")
        return True

    def _session(self) -> psycopg.Connection[tuple[object, ...]]:
        if self._conn is None or self._conn.closed:
            conn = psycopg.connect(
                self._conninfo,
                autocommit=True,
                connect_timeout=CONNECT_TIMEOUT_S,
                keepalives=1,
                keepalives_idle=KEEPALIVE_IDLE_S,
                keepalives_interval=KEEPALIVE_INTERVAL_S,
                keepalives_count=KEEPALIVE_COUNT,
                application_name="kops-relay-leader",
            )
            try:
                conn.execute(f"SET tcp_keepalives_idle = {KEEPALIVE_IDLE_S}")
                conn.execute(f"SET tcp_keepalives_interval = {KEEPALIVE_INTERVAL_S}")
                conn.execute(f"SET tcp_keepalives_count = {KEEPALIVE_COUNT}")
            except Exception:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def still_leader(self) -> bool:
        """Check the session that holds the lock is alive; step down if it is not."""
        if not self._leading or self._conn is None:
            return False
        try:
            self._conn.execute("SELECT 1")
        except Exception as exc:
            log.warning("relay: lost the leader session (%s); standing by", exc)
            self._drop()
            return False
        return True

    def release(self) -> None:
        if self._leading and self._conn is not None:
            try:
                self._conn.execute("SELECT pg_advisory_unlock(%s)", (self.key,))
            except Exception:
                log.debug("relay: unlock failed; closing the session frees it", exc_info=True)
        self._drop()

    def _drop(self) -> None:
        self._leading = False
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                log.debug("closing the leader session failed", exc_info=True)
