"""How many searchable chunks a dataset holds, and how many of them a filter admits, counted
once between two commits.

Every embedded search counts them (SqliteIndex: graph or exact, and how many candidates a
filter's share needs), and a hybrid search's two lists each count the same two numbers: at a
million chunks the filtered count reads every document of the dataset (7.4 ms at 9,000
documents), so it was paid four times per filtered hybrid search. Here both are one query, and
its answer is kept until anything commits to the database: SQLite's `PRAGMA data_version`, read
on a connection of its own that never writes, changes whenever another connection (of this
process or another) commits, so a count kept under the version read before it was taken is
exactly what counting again would give as long as the version is the same
(docs/architecture.md, "The counts a search needs").
"""

from __future__ import annotations

import threading
from typing import Any

import sqlean
from sqlalchemy.engine import make_url

from knowledgeops.db.engine import Database
from knowledgeops.ingest.index.filters import SearchFilter, sqlite_where

# a dataset's searchable chunks: the index on (dataset_id, active_generation, chunk_count)
# covers it (6.2 → 1.1 ms at 9,000 documents)
ACTIVE_CHUNKS = (
    "SELECT coalesce(sum(d.chunk_count), 0) FROM documents d WHERE d.dataset_id = ? "
    "AND d.active_generation IS NOT NULL"
)
KEPT_MAX = 4096  # counts kept between two commits (distinct datasets and filters)


def _file(db: Database) -> str | None:
    """The database's file, or None for one in memory (a second connection would not see it)."""
    name = make_url(db.url).database
    if not name or name == ":memory:" or name.startswith("file:"):
        return None
    return name


class ActiveCounts:
    """(chunks the filter admits, chunks of the dataset) for the dataset's active generations."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._file = _file(db)
        self._lock = threading.Lock()
        self._watch: sqlean.Connection | None = None
        self._version: int | None = None  # the version the kept counts were taken under
        self._kept: dict[tuple[Any, ...], tuple[int, int]] = {}

    def of(self, dataset_id: str, where: SearchFilter | None) -> tuple[int, int]:
        """The two counts, as kept when nothing has committed since they were taken."""
        params: list[Any] = []
        conditions = sqlite_where(where, params)
        key = (dataset_id, conditions, *params)
        version = self._version_now()
        if version is not None:
            with self._lock:
                if version == self._version and key in self._kept:
                    return self._kept[key]
        counted = self._count(dataset_id, conditions, params)
        if version is not None:
            with self._lock:
                if version != self._version:
                    self._kept.clear()
                    self._version = version
                if len(self._kept) < KEPT_MAX:
                    self._kept[key] = counted
        return counted

    def count(self, dataset_id: str, where: SearchFilter | None) -> tuple[int, int]:
        """The two counts taken now, neither kept nor read from what was (what a search pays
        while documents are being written)."""
        params: list[Any] = []
        conditions = sqlite_where(where, params)
        return self._count(dataset_id, conditions, params)

    def _count(self, dataset_id: str, conditions: str, params: list[Any]) -> tuple[int, int]:
        """Both numbers in one pass over the dataset's documents (in a transaction that begins
        after the version was read, so a commit in between shows as a new version next time)."""
        with self.db.read() as conn:
            if not conditions:
                total = int(conn.exec_driver_sql(ACTIVE_CHUNKS, (dataset_id,)).scalar() or 0)
                return total, total
            row = conn.exec_driver_sql(
                f"SELECT coalesce(sum(d.chunk_count) FILTER (WHERE 1{conditions}), 0), "
                "coalesce(sum(d.chunk_count), 0) FROM documents d WHERE d.dataset_id = ? "
                "AND d.active_generation IS NOT NULL",
                (*params, dataset_id),
            ).one()
        return int(row[0]), int(row[1])

    def _version_now(self) -> int | None:
        """The database's data_version as the watching connection sees it; None where there
        is no file to watch, or the watch fails (then nothing is kept: the search counts, as it
        would anyway, and the next one opens the watch again)."""
        if self._file is None:
            return None
        with self._lock:
            try:
                if self._watch is None:
                    self._watch = sqlean.connect(self._file, check_same_thread=False, timeout=30)
                    self._watch.isolation_level = None  # autocommit: never holds a snapshot
                return int(self._watch.execute("PRAGMA data_version").fetchone()[0])
            except sqlean.Error:
                if self._watch is not None:
                    self._watch.close()
                self._watch = None
                self._kept.clear()
                self._version = None
                return None

    def close(self) -> None:
        with self._lock:
            if self._watch is not None:
                self._watch.close()
                self._watch = None
            self._kept.clear()
            self._version = None
