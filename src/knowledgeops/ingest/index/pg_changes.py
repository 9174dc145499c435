"""The scale-out keyword index's change log: a PostgreSQL table written by `PgVectorIndex` in the
changes' own transactions, and the state of each API process's replica, kept beside it on disk
(docs/architecture.md, "Keyword search at a million chunks").

PostgreSQL's `ts_rank_cd` ranks every GIN match of a question's words before it keeps the best:
seconds for a dataset of 200,000 chunks. So each process that serves searches keeps a Tantivy
index of the database's active chunks (keywords.py), built from the chunks and then following
this log; the database stays the truth, and every candidate is checked in SQL.

The log's order is the transactions', not their ids': two transactions may commit in the other
order than they took their sequence values, so a reader that went by id alone would pass over a
row that commits late. Each row carries its transaction's id (`pg_current_xact_id()`), and a row
is applied only once its transaction id is below the oldest transaction still running
(`pg_snapshot_xmin` of the reader's snapshot): no row can appear below that point any more. The
position is (transaction id, row id): rows are applied in that order, each once. Rows of
transactions that committed but are not below that point yet are read by searches as pending,
like the rows a commit of the index does not hold yet.

Rows older than `RETENTION` are pruned (writers start a prune every `PRUNE_AFTER_ROWS` rows they
log, at most once a minute); the greatest position pruned is kept in the origin table, and a
replica whose saved position is below it has missed rows and is built again. The origin table
also names the log (a random id made with it), which with the cluster's system identifier and
the database's oid names the database: a replica saved for another database (a copy made from
a template, a restored dump, whose transaction ids mean nothing here) is built again too.

Each process keeps its replica in a slot of its own under the replica folder (an exclusive lock
on `slot-<n>.lock` for its life), so `kops api --workers 4` keeps four, and a restarted process
takes a free slot whose replica it opens and catches up.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from sqlalchemy import Connection, text

from knowledgeops.db.engine import Database
from knowledgeops.ingest.index.keywords import (
    ACTIVE_CHUNKS,
    READ_BATCH,
    Change,
    LogPruned,
    Position,
    Saved,
    terms_version,
)

log = logging.getLogger(__name__)

RETENTION_S = 24 * 3600.0  # log rows kept this long; a replica stopped for longer is rebuilt
PRUNE_AFTER_ROWS = 10_000  # log rows a process writes that start a prune …
PRUNE_INTERVAL_S = 60.0  # … at most this often
SLOTS = 64  # replicas under one folder (processes serving searches on one machine)
STATE_FILE = "state.json"


def log_tables(table: str) -> tuple[str, str]:
    """The log and its origin table, for the index table `table`."""
    return f"{table}_log", f"{table}_log_origin"


def create_tables(conn: Connection, table: str) -> None:
    """The log and its origin row (idempotent; `PgVectorIndex.ensure` runs it)."""
    changes, origin = log_tables(table)
    conn.exec_driver_sql(
        f"CREATE TABLE IF NOT EXISTS {changes} (id bigserial PRIMARY KEY, "
        "xid xid8 NOT NULL DEFAULT pg_current_xact_id(), dataset_key bigint NOT NULL, "
        "seq integer NOT NULL, added boolean NOT NULL, at timestamptz NOT NULL DEFAULT now())"
    )
    conn.exec_driver_sql(f"CREATE INDEX IF NOT EXISTS ix_{changes}_xid ON {changes} (xid, id)")
    conn.exec_driver_sql(
        f"CREATE INDEX IF NOT EXISTS ix_{changes}_dataset ON {changes} (dataset_key, xid, id)"
    )
    conn.exec_driver_sql(
        f"CREATE TABLE IF NOT EXISTS {origin} (id integer PRIMARY KEY CHECK (id = 1), "
        "origin uuid NOT NULL, pruned_xid xid8 NOT NULL DEFAULT '0', "
        "pruned_id bigint NOT NULL DEFAULT 0)"
    )
    conn.execute(
        text(f"INSERT INTO {origin} (id, origin) VALUES (1, :o) ON CONFLICT (id) DO NOTHING"),
        {"o": str(uuid.uuid4())},
    )


def write_log(conn: Connection, table: str, key: int, seqs: Sequence[int], *, added: bool) -> None:
    """Log `seqs` of the dataset `key` as added or removed, in the change's transaction."""
    if seqs:
        conn.execute(
            text(
                f"INSERT INTO {log_tables(table)[0]} (dataset_key, seq, added) "
                "SELECT :k, unnest(CAST(:seqs AS integer[])), :added"
            ),
            {"k": key, "seqs": list(seqs), "added": added},
        )


class Pruner:
    """Prunes the log now and then, as the rows a process writes add up."""

    def __init__(self, db: Database, table: str) -> None:
        self.db = db
        self.log, self.origin = log_tables(table)
        self._lock = threading.Lock()
        self._written = 0
        self._pruned_at = -PRUNE_INTERVAL_S

    def logged(self, rows: int) -> None:
        """`rows` log rows were written: a prune in the background when one is due."""
        with self._lock:
            self._written += rows
            due = (
                self._written >= PRUNE_AFTER_ROWS
                and time.monotonic() - self._pruned_at >= PRUNE_INTERVAL_S
            )
            if not due:
                return
            self._written = 0
            self._pruned_at = time.monotonic()
        threading.Thread(target=self._prune_quietly, name="kops-log-prune", daemon=True).start()

    def _prune_quietly(self) -> None:
        try:
            self.prune()
        except Exception:  # the database busy or gone: the next prune takes these rows too
            log.exception("pruning the keyword log failed")

    def prune(self, older_than_s: float = RETENTION_S) -> int:
        """Delete the rows older than `older_than_s` whose transactions have ended, and keep
        the greatest position deleted; how many rows went."""
        with self.db.write() as tx:
            gone = tx.execute(
                text(
                    f"WITH gone AS (DELETE FROM {self.log} WHERE at < now() - make_interval("
                    "secs => :age) AND xid < pg_snapshot_xmin(pg_current_snapshot()) "
                    "RETURNING xid, id), last AS (SELECT xid, id FROM gone "
                    "ORDER BY xid DESC, id DESC LIMIT 1), moved AS ("
                    f"UPDATE {self.origin} o SET pruned_xid = l.xid, pruned_id = l.id FROM last l "
                    "WHERE (l.xid, l.id) > (o.pruned_xid, o.pruned_id) RETURNING 1) "
                    "SELECT count(*) FROM gone"
                ),
                {"age": older_than_s},
            ).scalar_one()
        return int(gone)


@dataclass
class Slot:
    """A folder of the replica's own, held for the process's life by a lock on a file."""

    folder: Path
    lock: IO[str]

    def release(self) -> None:
        fcntl.flock(self.lock, fcntl.LOCK_UN)
        self.lock.close()


def take_slot(base: Path) -> Slot:
    """The first slot under `base` no other process holds."""
    base.mkdir(parents=True, exist_ok=True)
    for n in range(SLOTS):
        handle = (base / f"slot-{n}.lock").open("a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        folder = base / f"slot-{n}"
        folder.mkdir(exist_ok=True)
        return Slot(folder, handle)
    raise RuntimeError(f"every one of the {SLOTS} keyword index slots under {base} is held")


def _xid(value: object) -> int:
    return int(str(value))


class PgChanges:
    """The log of one PostgreSQL index table, and a replica's state in `folder`."""

    def __init__(self, db: Database, table: str, folder: Path) -> None:
        self.db = db
        self.log, self.origin = log_tables(table)
        self.state_path = folder / STATE_FILE

    def _origin(self, conn: Connection) -> tuple[str, Position]:
        row = conn.exec_driver_sql(  # the log's own id, the cluster's and the database's
            "SELECT concat_ws('/', origin, (SELECT system_identifier FROM pg_control_system()), "
            "(SELECT oid FROM pg_database WHERE datname = current_database())), "
            f"pruned_xid::text, pruned_id FROM {self.origin}"
        ).one()
        return str(row[0]), (_xid(row[1]), int(row[2]))

    def saved(self) -> Saved | None:
        try:
            state = json.loads(self.state_path.read_text("utf-8"))
            position = (int(state["xid"]), int(state["id"]))
            saved = Saved(position, int(state["docs"]), int(state["tokens"]))
            origin = str(state["origin"])
            terms = str(state.get("terms"))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        if terms != terms_version():
            log.warning("the keyword index in %s is made of older terms", self.state_path)
            return None
        with self.db.read() as conn:
            current, pruned = self._origin(conn)
        if origin != current:
            log.warning("the keyword index in %s was made for another database", self.state_path)
            return None
        if position < pruned:
            log.warning("the keyword log was pruned past the index in %s", self.state_path)
            return None
        return saved

    def save(self, state: Saved) -> None:
        with self.db.read() as conn:
            origin, _ = self._origin(conn)
        body = json.dumps(
            {
                "origin": origin,
                "terms": terms_version(),
                "xid": state.position[0],
                "id": state.position[1],
                "docs": state.docs,
                "tokens": state.tokens,
            }
        )
        temporary = self.state_path.with_suffix(".tmp")
        with temporary.open("w", encoding="utf-8") as out:
            out.write(body)
            out.flush()
            os.fsync(out.fileno())
        temporary.replace(self.state_path)
        folder = os.open(self.state_path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)

    def start_build(self) -> Position:
        self.state_path.unlink(missing_ok=True)
        with self.db.read() as conn:
            # every transaction below this point has ended: the chunks read next hold its rows
            xmin = conn.exec_driver_sql(
                "SELECT pg_snapshot_xmin(pg_current_snapshot())::text"
            ).scalar_one()
        return (_xid(xmin), 0)

    def active_chunks(self) -> Iterator[Sequence[tuple[int, str, str]]]:
        with self.db.read() as conn:
            streamed = conn.execution_options(stream_results=True, max_row_buffer=READ_BATCH)
            rows = streamed.execute(text(ACTIVE_CHUNKS))
            while batch := rows.fetchmany(READ_BATCH):
                yield [(int(seq), str(dataset), str(body)) for seq, dataset, body in batch]

    def changes(self, after: Position, limit: int) -> tuple[list[Change], dict[int, str]]:
        with self.db.read() as conn:
            if after < self._origin(conn)[1]:
                raise LogPruned(f"the log was pruned past {after}")
            rows = conn.execute(
                text(
                    f"SELECT xid::text, id, dataset_key, seq, added FROM {self.log} "
                    "WHERE (xid, id) > (CAST(:x AS xid8), :i) "
                    "AND xid < pg_snapshot_xmin(pg_current_snapshot()) "
                    "ORDER BY xid, id LIMIT :n"
                ),
                {"x": str(after[0]), "i": after[1], "n": limit},
            ).all()
            found = [
                Change((_xid(xid), int(row_id)), int(key), int(seq), bool(added))
                for xid, row_id, key, seq, added in rows
            ]
            return found, self.texts(conn, [change.seq for change in found if change.added])

    def pending(
        self, conn: Connection, key: int, after: Position, limit: int
    ) -> list[tuple[int, bool]]:
        rows = conn.execute(
            text(
                f"SELECT seq, added FROM {self.log} WHERE dataset_key = :k "
                "AND (xid, id) > (CAST(:x AS xid8), :i) ORDER BY xid, id LIMIT :n"
            ),
            {"k": key, "x": str(after[0]), "i": after[1], "n": limit},
        ).all()
        return [(int(seq), bool(added)) for seq, added in rows]

    def texts(self, conn: Connection, seqs: Sequence[int]) -> dict[int, str]:
        if not seqs:
            return {}
        rows = conn.execute(
            text("SELECT seq, text FROM chunks WHERE seq = ANY(:seqs)"),
            {"seqs": list(dict.fromkeys(seqs))},
        )
        return {int(seq): str(body) for seq, body in rows}

    def newer(self, after: Position) -> bool:
        with self.db.read() as conn:
            if after < self._origin(conn)[1]:
                return True  # pruned rows the index never applied
            row = conn.execute(
                text(f"SELECT 1 FROM {self.log} WHERE (xid, id) > (CAST(:x AS xid8), :i) LIMIT 1"),
                {"x": str(after[0]), "i": after[1]},
            ).first()
        return row is not None
