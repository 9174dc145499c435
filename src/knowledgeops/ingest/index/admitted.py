"""The chunks a search's filter admits in a large dataset, as a bitmap of their seqs (docs/
architecture.md: Vector search at a million chunks). A search uses it one of two ways (`Way`):
- skip: the lists' scan computes the distances of the admitted codes only (faiss
  `IDSelectorBitmap`) and asks for the candidates of an unfiltered search;
- after: the scan computes every code's distance, as without a filter, and asks for as many
  more candidates as the filter admits fewer chunks; the bitmap then keeps the admitted ones
  before they are scored in SQL.
Which is faster depends on the machine: skipping saves the distances but tests a bit per code,
a branch the CPU cannot predict when about half pass (measured at a million, half admitted: on
an AMD EPYC the scan took 14.0 ms skipping and 8.9 after; on an Intel Xeon 19.5 and 25.8). So
each bitmap times both ways on its first searches, uses the faster, and times the other again
now and then (`WayChoice`); a filter admitting less than `AFTER_MIN_PASSING` always skips.

A bitmap is never the truth: the candidates it lets through are scored in SQL against what is
active now and what the filter admits, as any candidates are. It only has to hold every chunk
the filter admits (a chunk it holds that is no longer admitted costs a candidate, nothing
more), and it does:
- it is built from the database in one read transaction, with the vector log's top id in the
  same one (`applied`);
- each search that uses it first reads, in its own transaction, the log rows after `applied`
  (the chunks made searchable since: added), sets the bits of those its filter admits, and
  moves `applied` on. A document's filter fields (its metadata, file type, model) are set with
  the generation its chunks are logged with, and read at that search;
- the log's rows are pruned once the dataset's lists hold them (graphs.py): a bitmap behind the
  pruned rows (`Graphs.log_floor`, raised before each delete and read after the search read the
  rows) is dropped and built again, as is one with more rows to read than PENDING_MAX, or a
  dataset deleted whole.
A bitmap not built yet is built on a thread of its own (a million chunks: 0.7 s), and the
searches meanwhile go without.
"""

from __future__ import annotations

import collections
import logging
import statistics
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import faiss
import numpy as np
import numpy.typing as npt
from sqlalchemy import Connection

from knowledgeops.db.engine import Database
from knowledgeops.ingest.index.filters import SearchFilter, sqlite_passing, sqlite_where
from knowledgeops.ingest.index.graphs import PENDING_MAX, RESET

log = logging.getLogger(__name__)

BITMAPS_MAX = 16  # (dataset, filter) bitmaps kept, the least recently used dropped first
READ_BATCH = 100_000  # admitted seqs read per fetch while building
AFTER_MIN_PASSING = 0.25  # a filter admitting less always skips (after would ask 4× as many)
TRIALS = 5  # timed scans of each way kept (the last ones); a way timed fewer times is tried
RETRY_EVERY = 200  # searches between two trials of the way not chosen (the load changes)
SWITCH_BELOW = 0.9  # the other way's median scan against the current's, to take it over


class Way(StrEnum):
    SKIP = "skip"  # the scan's selector: the admitted codes' distances only
    AFTER = "after"  # every code's distance, more candidates, the bitmap applied to them


@dataclass(eq=False)
class WayChoice:
    """Which way a bitmap's searches take: each way timed `TRIALS` times first, then the one
    whose recent scans took less (their median), the other timed again every `RETRY_EVERY`
    searches and taken over only when its median is `SWITCH_BELOW` of the current's or less
    (timings taken minutes apart are noisy: without the margin the choice flapped)."""

    ways: tuple[Way, ...] = (Way.SKIP, Way.AFTER)
    timings: dict[Way, collections.deque[float]] = field(
        default_factory=lambda: {way: collections.deque(maxlen=TRIALS) for way in Way}
    )
    current: Way | None = None
    searches: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def pick(self, passing: float) -> Way:
        if Way.SKIP in self.ways and (passing < AFTER_MIN_PASSING or Way.AFTER not in self.ways):
            return Way.SKIP
        if Way.SKIP not in self.ways:
            return Way.AFTER
        with self.lock:
            self.searches += 1
            least = min(self.ways, key=lambda way: len(self.timings[way]))
            if len(self.timings[least]) < TRIALS:
                return least
            took = {way: statistics.median(self.timings[way]) for way in self.ways}
            if self.current is None:
                self.current = min(self.ways, key=took.__getitem__)
            other = Way.AFTER if self.current is Way.SKIP else Way.SKIP
            if took[other] <= SWITCH_BELOW * took[self.current]:
                self.current = other
                other = Way.AFTER if other is Way.SKIP else Way.SKIP
            return other if self.searches % RETRY_EVERY == 0 else self.current

    def timed(self, way: Way, seconds: float) -> None:
        with self.lock:
            self.timings[way].append(seconds)


@dataclass(eq=False)
class Bitmap:
    """One filter's admitted chunks of one dataset; `bits` and `selector` are what a scan uses
    (hold both while it runs: the selector points into the array)."""

    bits: npt.NDArray[np.uint8]
    applied: int  # the last log row taken in
    choice: WayChoice = field(default_factory=WayChoice)
    selector: Any = field(init=False)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.selector = _selector(self.bits)

    def set(self, seqs: npt.NDArray[np.int64]) -> None:
        if not len(seqs):
            return
        top = int(seqs.max())
        if top >> 3 >= len(self.bits):  # room for newer seqs, a half more than asked
            grown = np.zeros(((top >> 3) + 1) * 3 // 2 + 1, dtype=np.uint8)
            grown[: len(self.bits)] = self.bits
            self.bits = grown  # a scan running on the old array keeps it alive (its caller)
            self.selector = _selector(grown)
        np.bitwise_or.at(self.bits, seqs >> 3, np.left_shift(1, seqs & 7).astype(np.uint8))


@dataclass(frozen=True)
class Admitted:
    """What one search uses of a bitmap: its array and selector as of the search (hold both
    while the scan runs: the selector points into the array) and the way chosen for it."""

    bits: npt.NDArray[np.uint8]
    selector: Any
    way: Way
    choice: WayChoice

    def admits(self, seqs: Sequence[int]) -> list[int]:
        """The seqs whose bit is set, in their order."""
        found = np.asarray(seqs, dtype=np.int64)
        inside = found[(found >= 0) & ((found >> 3) < len(self.bits))]
        bit = (self.bits[inside >> 3] >> (inside & 7).astype(np.uint8)) & 1
        return [int(seq) for seq in inside[bit == 1]]

    def timed(self, seconds: float) -> None:
        self.choice.timed(self.way, seconds)


def _selector(bits: npt.NDArray[np.uint8]) -> Any:
    return faiss.IDSelectorBitmap(len(bits), faiss.swig_ptr(bits))


class AdmittedBitmaps:
    """The bitmaps of the filters searched, per dataset (`log`: the vector log's table;
    `log_floor(key)`: the highest log id of the dataset that may have been pruned)."""

    def __init__(
        self,
        db: Database,
        log_table: str,
        log_floor: Callable[[int], int],
        ways: tuple[Way, ...] = (Way.SKIP, Way.AFTER),
    ) -> None:
        self.db = db
        self.ways = ways  # the ways a bitmap built from now on may take (tests fix one)
        self.log = log_table
        self.log_floor = log_floor
        self._kept: collections.OrderedDict[tuple[int, SearchFilter], Bitmap] = (
            collections.OrderedDict()
        )
        self._building: set[tuple[int, SearchFilter]] = set()
        self._state = threading.Lock()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="kops-admitted")
        self.builds = 0  # for tests and the bench
        self.chosen: collections.Counter[Way] = collections.Counter()  # searches by way

    def of(
        self, conn: Connection, key: int, dataset_id: str, where: SearchFilter, passing: float
    ) -> Admitted | None:
        """The bitmap of the chunks `where` admits in the dataset, as of `conn`'s transaction,
        and the way this search uses it (`passing`: the share of the dataset admitted); None
        while it is being built (the search goes without)."""
        name = (key, where)
        with self._state:
            bitmap = self._kept.get(name)
            if bitmap is not None:
                self._kept.move_to_end(name)
        if bitmap is None:
            self._build_later(key, dataset_id, where)
            return None
        with bitmap.lock:
            rows = conn.exec_driver_sql(
                f"SELECT id, seq, added FROM {self.log} WHERE dataset_key = ? AND id > ? "
                "ORDER BY id LIMIT ?",
                (key, bitmap.applied, PENDING_MAX + 1),
            ).all()
            behind = self.log_floor(key) > bitmap.applied  # read after the rows: see above
            if behind or len(rows) > PENDING_MAX or any(seq == RESET for _, seq, _ in rows):
                self._drop(name, bitmap)
                self._build_later(key, dataset_id, where)
                return None
            added = [int(seq) for _, seq, is_added in rows if is_added]
            if added:  # active or not by now: a bit too many costs a candidate, no more
                kept = sqlite_passing(conn, added, dataset_id, where, active=False)
                bitmap.set(np.fromiter(kept, dtype=np.int64))
            if rows:
                bitmap.applied = max(bitmap.applied, int(rows[-1][0]))
            bits, selector = bitmap.bits, bitmap.selector
        way = bitmap.choice.pick(passing)
        self.chosen[way] += 1
        return Admitted(bits, selector, way, bitmap.choice)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def caught_up(self, timeout: float = 60.0) -> bool:
        """Wait for the bitmaps being built (tests, bench)."""
        done = self._pool.submit(lambda: None)
        try:
            done.result(timeout=timeout)
        except TimeoutError:
            return False
        return True

    def _drop(self, name: tuple[int, SearchFilter], bitmap: Bitmap) -> None:
        with self._state:
            if self._kept.get(name) is bitmap:
                del self._kept[name]

    def _build_later(self, key: int, dataset_id: str, where: SearchFilter) -> None:
        name = (key, where)
        with self._state:
            if name in self._building:
                return
            self._building.add(name)
        try:
            self._pool.submit(self._build, key, dataset_id, where)
        except RuntimeError:  # closed: the index is shutting down
            with self._state:
                self._building.discard(name)

    def _build(self, key: int, dataset_id: str, where: SearchFilter) -> None:
        name = (key, where)
        try:
            params: list[Any] = [dataset_id]
            conditions = sqlite_where(where, params)
            with self.db.read() as conn:
                # the last id the log gave (AUTOINCREMENT: never given again), even when its
                # rows were pruned: the floor is compared with it
                top = int(
                    conn.exec_driver_sql(
                        "SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = ?), 0)",
                        (self.log,),
                    ).scalar()
                    or 0
                )
                rows = conn.exec_driver_sql(
                    "SELECT c.seq FROM documents d JOIN chunks c ON c.document_id = d.id "
                    f"AND c.generation = d.active_generation WHERE d.dataset_id = ?{conditions}",
                    tuple(params),
                )
                parts = [np.zeros(0, dtype=np.int64)]
                while batch := rows.fetchmany(READ_BATCH):
                    parts.append(np.fromiter((seq for (seq,) in batch), dtype=np.int64))
            seqs = np.concatenate(parts)
            bitmap = Bitmap(np.zeros(1, dtype=np.uint8), top, WayChoice(self.ways))
            bitmap.set(seqs)
            with self._state:
                self._kept[name] = bitmap
                self._kept.move_to_end(name)
                while len(self._kept) > BITMAPS_MAX:
                    self._kept.popitem(last=False)
            self.builds += 1
        except Exception:  # the database busy or gone: the searches go without, and ask again
            log.exception("could not build the bitmap of a filter of dataset key %s", key)
        finally:
            with self._state:
                self._building.discard(name)
