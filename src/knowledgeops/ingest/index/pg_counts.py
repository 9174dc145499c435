"""How many searchable chunks a dataset holds in PostgreSQL, and how many a filter admits,
kept for a moment between searches.

Every scale-out search counts them (the HNSW walk's breadth, or an exact search; how many
candidates the keyword index is asked for under a filter), a hybrid search once per list, by
summing `chunk_count` over the dataset's active documents: a read of every document of the
dataset, which grows with their number, not with the chunks. SQLite tells a reader when anything
committed (counts.py keeps its counts until then); PostgreSQL has no such cheap signal across
processes, so here a count is kept for `KEPT_S` and taken again after.

A kept count only ever steers how a search looks, never what it may return: too low, and a walk
becomes an exact search (slower, the same answer); too high, and a walk that finds fewer than k
rows is run again exactly, while a keyword list too short under a filter is widened and then
left to the GIN index. The one count that decides an answer by itself, a filter that admits
nothing (the search returns at once with no hits), is never kept: a document made searchable a
moment ago is found by the very next search.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import text

from knowledgeops.db.engine import Tx
from knowledgeops.ingest.index.filters import SearchFilter, postgres_where

KEPT_S = 2.0  # how long a count is used again
KEPT_MAX = 4096  # counts kept (distinct datasets and filters); more: all are dropped


def _count(conn: Tx, dataset_id: str, conditions: str, params: dict[str, Any]) -> tuple[int, int]:
    """(active chunks the conditions admit, active chunks) of the dataset, counted now."""
    admitted, dataset = conn.execute(
        text(
            "SELECT coalesce(sum(d.chunk_count) FILTER (WHERE true"
            f"{conditions}), 0), coalesce(sum(d.chunk_count), 0) FROM documents d "
            "WHERE d.dataset_id = :dataset AND d.active_generation IS NOT NULL"
        ),
        {**params, "dataset": dataset_id},
    ).one()
    return int(admitted), int(dataset)


class KeptCounts:
    """The two counts, kept for `kept_s` unless the filter admitted nothing."""

    def __init__(self, kept_s: float = KEPT_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.kept_s = kept_s
        self.clock = clock
        self._lock = threading.Lock()
        self._kept: dict[tuple[Any, ...], tuple[float, int, int]] = {}

    def of(self, conn: Tx, dataset_id: str, where: SearchFilter | None) -> tuple[int, int]:
        params: dict[str, Any] = {}
        conditions = postgres_where(where, params)  # the key: 1 and True are equal in Python
        key = (dataset_id, conditions, repr(sorted(params.items())))  # lists, JSON: as text
        now = self.clock()
        with self._lock:
            found = self._kept.get(key)
        if found is not None and now - found[0] < self.kept_s:
            return found[1], found[2]
        admitted, dataset = _count(conn, dataset_id, conditions, params)
        with self._lock:
            if admitted == 0:
                self._kept.pop(key, None)
            else:
                if len(self._kept) >= KEPT_MAX:
                    self._kept.clear()
                self._kept[key] = (now, admitted, dataset)
        return admitted, dataset
