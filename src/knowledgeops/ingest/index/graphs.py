"""The embedded index's HNSW graphs: one per large dataset, kept beside the SQLite database and
never trusted on their own (docs/architecture.md: Vector search at a million chunks).

The database stays the truth. Every change a graph must follow is a row of the vector log
(`<vector table>_log`), written by `SqliteIndex` in the transaction that makes it: the chunks a
generation's activation makes searchable (added), the chunks a delete or a new generation drops
(removed), a dataset deleted whole (a reset). A graph knows the last log row it reflects; a
background thread (one per index) builds the graphs of the datasets searched, applies the log to
them, and saves a snapshot now and then.

The thread stages the log's new chunks in memory first (stage.py) and adds them to the graph
while the machine has a core to spare, or when the stage is full: a graph's upkeep does not
slow the model embedding a burst of documents.

A search asks its dataset's graph for candidates, adds the staged chunks nearest to the
question (each scored exactly) and every chunk logged as added since the thread last looked
(so a document is found the moment its job completes), and then scores all of them exactly in
SQL against the chunks that are active now, in the same read transaction:
a chunk the graph still holds but the database dropped (a stale generation, a deleted document)
cannot answer, and every score is the exact cosine. A graph that is missing (not built yet,
being rebuilt) or too far behind answers nothing and the search is exact.

Snapshots are written to a temporary file, flushed and renamed to `<dataset key>-<log id>-<last
log id read>.linked.usearch`; only then does the database row in `<vector table>_snapshots`
point to them, and the log rows the snapshot holds are pruned. A process killed while writing
leaves at most a temporary file (swept at the next load) and the older snapshot, which is loaded
and caught up from the log; a snapshot that does not load, or holds another number of vectors
than its row says, is rebuilt from the database.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
import numpy.typing as npt
from sqlalchemy import Connection
from usearch.index import Index

from knowledgeops.db.engine import Database
from knowledgeops.ingest.index.keywords import state_table
from knowledgeops.ingest.index.stage import LOOK_S, STAGE_MAX, SpareCores, Stage

log = logging.getLogger(__name__)

# chosen by measurement (docs/performance.md: Vector search at a million chunks)
CONNECTIVITY = 32  # HNSW's M
EXPANSION_ADD = 256  # ef_construction of a build
EXPANSION_GROW = 192  # ef_construction of the chunks the log adds to a built graph
EXPANSION_SEARCH = 1024  # ef
EXPANSION_FUSED = 512  # ef of a hybrid search's vector list (SqliteIndex.search_vector)
# the graph's copy of the vectors (graph_dtype; i8 lost the order: recall 0.85 at 6k chunks)
DTYPES = ("bf16", "f16")
CANDIDATES_MIN = 40  # the graph's nearest asked for at least, then scored exactly
CANDIDATES_PER_K = 4
CANDIDATES_MAX = 4096
PENDING_MAX = 2000  # logged changes a search will score itself; more: exact search
APPLY_BATCH = 64  # vectors added per turn of a graph's lock at most …
APPLY_TURN_S = 0.005  # … and about this long: a search of the graph waits no longer for it
READ_BATCH = 10_000  # vectors read per fetch while building
SNAPSHOT_CHANGES = 50_000  # changes applied since the last snapshot that make a new one due
SNAPSHOT_INTERVAL_S = 300.0  # … or this long since it, with any change
PRUNE_INTERVAL_S = 60.0
PRUNE_AFTER_ROWS = 10_000  # log rows written that start a prune when no graph is kept
POLL_S = 0.5
# a build's sweep for the nodes no walk reaches (relink_orphans): each node is looked for with its
# own vector by a walk of ORPHAN_WALKS' first breadth among its nearest k, one missed by the next
# walk, and so on; the last is a search's walk (measured: docs/performance.md)
ORPHAN_WALKS = ((8, 1), (64, 16), (EXPANSION_SEARCH, 16))
ORPHAN_ROUNDS = 3
TWIN_DISTANCE = 1e-5  # a vector's distance to itself in the graph's type is under 3e-7
# a snapshot's file name ends in it: one without (written before the sweep) is swept when loaded
SNAPSHOT_SUFFIX = ".linked.usearch"
RESET = -1  # the seq of a log row that empties a dataset's graph (the dataset was deleted)


def log_tables(vec: str) -> tuple[str, str]:
    return f"{vec}_log", f"{vec}_snapshots"


def create_tables(conn: Connection, vec: str) -> None:
    changes, snapshots = log_tables(vec)
    conn.exec_driver_sql(
        f"CREATE TABLE IF NOT EXISTS {changes} (id INTEGER PRIMARY KEY AUTOINCREMENT, "
        "dataset_key INTEGER NOT NULL, seq INTEGER NOT NULL, added INTEGER NOT NULL)"
    )
    conn.exec_driver_sql(
        f"CREATE INDEX IF NOT EXISTS ix_{changes}_dataset ON {changes} (dataset_key, id)"
    )
    conn.exec_driver_sql(
        f"CREATE TABLE IF NOT EXISTS {snapshots} (dataset_key INTEGER PRIMARY KEY, "
        "log_id INTEGER NOT NULL, file TEXT NOT NULL, size INTEGER NOT NULL)"
    )


@functools.cache
def graph_dtype() -> str:
    """The graphs' vector type: bfloat16 where usearch has a kernel for it on this CPU (on one
    with AVX-512 BF16 it multiplies bfloat16 natively: at 100,000 chunks a graph built in 88 s
    against 154 for float16, a chunk taken in for 1.6 ms against 2.9, a walk at ef 1024 in
    6.4 ms against 8.6, the same recall; docs/performance.md), else float16. Both keep two bytes
    a dimension; a snapshot keeps the type it was built with."""
    for dtype in DTYPES:
        probe = Index(ndim=16, metric="cos", dtype=dtype)
        if probe.hardware_acceleration != "serial":
            return dtype
    return DTYPES[-1]


def relink_orphans(index: Index, threads: int, stop: threading.Event | None = None) -> int | None:
    """Add again, one thread alone, every node of the graph that no walk reaches: how many;
    None when `stop` was set before the sweep was done.

    usearch's add from several threads (a build) leaves a few: a node whose lower level still
    has no links can be taken by a concurrent insert as its only way in, and the link is pruned
    later (usearch issue #735, open in 2.26). Measured on 2 threads: some in 295 of 400 builds
    of 300 vectors in float16 (56 of 400 in bfloat16), up to 12 in one; 3 to 14 of 50,000; such
    a chunk is never a vector search's answer. Each node is looked for with its own vector by a
    short walk, one it misses by a broader one, and one a search's walk misses too is removed
    and added again by one thread, which links it as a serial build does (ORPHAN_WALKS). A node
    whose walk finds k vectors as near as its own (identical chunks) counts as found: any of
    them answers as well. The index must not be in use (a build, a load)."""
    try:
        return _relink(index, threads, stop)
    except _Stopped:
        return None
    finally:
        index.expansion_search = EXPANSION_SEARCH  # type: ignore[misc]


class _Stopped(Exception):
    """The graphs' thread was asked to stop during a sweep."""


def _relink(index: Index, threads: int, stop: threading.Event | None) -> int:
    lost = np.asarray(index.keys, dtype=np.uint64)
    for breadth, k in ORPHAN_WALKS:  # each walk broader than the last, for fewer keys
        lost = _unfound(index, lost, breadth, k, threads, stop)
    last, k = ORPHAN_WALKS[-1]
    relinked: set[int] = set()
    for _ in range(ORPHAN_ROUNDS):
        if not len(lost):
            break
        vectors = _stored(index, lost)
        index.remove(lost)
        index.expansion_add = EXPANSION_ADD  # type: ignore[misc]
        index.add(lost, vectors, threads=1)
        relinked.update(int(key) for key in lost)
        lost = _unfound(index, lost, last, k, threads, stop)
    if len(lost):
        log.warning(
            "%d vectors of a graph stay out of every walk after %d rounds of adding them again",
            len(lost),
            ORPHAN_ROUNDS,
        )
    return len(relinked)


def _unfound(
    index: Index,
    keys: npt.NDArray[np.uint64],
    breadth: int,
    k: int,
    threads: int,
    stop: threading.Event | None,
) -> npt.NDArray[np.uint64]:
    """The keys whose own vector's walk of `breadth` finds neither them among its k nearest
    nor k vectors as near as their own."""
    index.expansion_search = breadth  # type: ignore[misc]
    missed: list[npt.NDArray[np.uint64]] = []
    for start in range(0, len(keys), READ_BATCH):
        if stop is not None and stop.is_set():
            raise _Stopped
        part = keys[start : start + READ_BATCH]
        found = index.search(_stored(index, part), k, threads=threads)
        held = np.atleast_2d(np.asarray(found.keys))
        near = np.atleast_2d(np.asarray(found.distances))
        # a batch's results say how many of each row's k were found; one row's are cut to them
        counts = np.asarray(getattr(found, "counts", [held.shape[1]])).reshape(-1)
        valid = np.arange(held.shape[1])[None, :] < counts[:, None]
        itself = ((held == part[:, None]) & valid).any(axis=1)
        twins = (counts >= k) & (near[:, -1] <= TWIN_DISTANCE) if held.shape[1] else itself
        missed.append(part[~(itself | twins)])
    return np.concatenate(missed) if missed else keys[:0]


def _stored(index: Index, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.float32]:
    """The graph's own copies of the keys' vectors (all held), one row each, as float32."""
    rows = cast("tuple[npt.NDArray[np.float32], ...]", index.get(keys, dtype="f32"))
    return np.vstack(rows)


def candidates_for(k: int, share: float) -> int:
    """How many of the graph's nearest to score for k results, when `share` of the dataset's
    chunks pass the search's filter (1.0: no filter)."""
    wanted = max(CANDIDATES_MIN, CANDIDATES_PER_K * k) / max(share, 1e-9)
    return int(min(CANDIDATES_MAX, wanted))


@dataclass
class Graph:
    key: int
    index: Index
    applied: int  # the last log row it reflects (a snapshot holds the graph as of this row)
    stage: Stage
    staged: int = 0  # the last log row the graph and its stage reflect together
    changes: int = 0  # vectors added to or removed from the graph since the last snapshot
    saved_at: float = field(default_factory=time.monotonic)
    snapshot: int | None = None  # the log id of its last snapshot
    # a usearch index is used by one thread at a time: its Python calls all run in the same
    # per-thread context (usearch's thread 0), and the walk's breadth is the index's own setting
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    add_s: float = 0.0  # what adding a vector took in the last turn (0: not measured yet)


def turn_size(add_s: float) -> int:
    """How many vectors to add in one turn of the graph's lock: as many as take about
    APPLY_TURN_S at the cost of the last turn (one while it is not known), at most
    APPLY_BATCH. At a million chunks a vector takes 2–3 ms, so 64 held searches for 150 ms."""
    if add_s <= 0.0:
        return 1
    return max(1, min(APPLY_BATCH, int(APPLY_TURN_S / add_s)))


class Graphs:
    """The graphs of one vector table, and the thread that keeps them."""

    def __init__(
        self,
        db: Database,
        vec: str,
        rows: str,
        dimension: int,
        folder: Path | None,
        stage_max: int = STAGE_MAX,
    ) -> None:
        self.db = db
        self.vec = vec  # sqlite-vec's table: a build scans it
        self.rows = rows  # the vectors by seq: catching up reads a few from there
        self.log, self.snapshots = log_tables(vec)
        # the keyword index (keywords.py) follows the same log: rows after its id stay
        self.kept = f"coalesce((SELECT log_id FROM {state_table(vec)}), id)"
        self.dimension = dimension
        self.folder = folder
        self._graphs: dict[int, Graph] = {}
        self._wanted: set[int] = set()
        self._state = threading.Lock()  # _graphs, _wanted, the thread
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pruned_at = 0.0
        self.stage_max = stage_max  # staged chunks past which the graph takes them in anyway
        self._spare = SpareCores()
        self._flush_until = 0.0  # till then the graph takes staged chunks in at once (caught_up)
        self._logged = 0  # log rows written by this process since the last prune
        self.builds = 0  # graphs built from the database (not loaded): for tests and bench
        self.relinked = 0  # vectors relink_orphans added again (the bench reports it)

    # --- searches -------------------------------------------------------------------------------
    def nearest(
        self,
        conn: Connection,
        key: int,
        vector: npt.NDArray[np.float32],
        want: int,
        breadth: int = EXPANSION_SEARCH,
    ) -> list[int] | None:
        """Candidate seqs for a search of the dataset `key`: the graph's `want` nearest (a walk
        of `breadth`: HNSW's ef), the stage's `want` nearest (exactly), and the chunks logged
        as added since the thread last read the log, read in `conn`'s transaction (the one that
        scores them). None when there is no graph yet (one
        is built) or it is far behind."""
        graph = self._graphs.get(key)
        if graph is None:
            self.want(key)
            return None
        with graph.lock:
            seen = graph.staged
        pending = conn.exec_driver_sql(
            f"SELECT seq, added FROM {self.log} WHERE dataset_key = ? AND id > ? "
            "ORDER BY id LIMIT ?",
            (key, seen, PENDING_MAX + 1),
        ).all()
        if pending:
            self._wake.set()
        if len(pending) > PENDING_MAX or any(seq == RESET for seq, _ in pending):
            return None
        with graph.lock:
            index = graph.index
            index.expansion_search = breadth  # type: ignore[misc]
            found = index.search(np.asarray(vector, dtype=np.float32), want, threads=1)
            staged = graph.stage.nearest(_unit(vector), want)
        seqs = [int(seq) for seq in np.asarray(found.keys)]
        seqs.extend(staged)
        seqs.extend(seq for seq, added in pending if added)
        return list(dict.fromkeys(seqs))

    def want(self, key: int) -> None:
        with self._state:
            self._wanted.add(key)
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(
                    target=self._run, name=f"kops-graphs-{self.vec}", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def logged(self, rows: int) -> None:
        """`rows` log rows were written: prune the log now and then even when no graph is kept
        (a knowledge base of small datasets would otherwise keep every row it ever logged)."""
        self._logged += rows
        if self._logged < PRUNE_AFTER_ROWS or time.monotonic() - self._pruned_at < PRUNE_INTERVAL_S:
            return
        with self._state:
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(
                    target=self._run, name=f"kops-graphs-{self.vec}", daemon=True
                )
                self._thread.start()

    def ready(self, key: int) -> bool:
        return key in self._graphs

    def caught_up(self, timeout: float = 60.0) -> bool:
        """Wait until every wanted graph exists and holds the whole log, its stage taken in
        whether or not the machine has a core to spare (tests, bench)."""
        deadline = time.monotonic() + timeout
        self._flush_until = deadline
        try:
            return self._wait(deadline)
        finally:
            self._flush_until = 0.0

    def _wait(self, deadline: float) -> bool:
        while time.monotonic() < deadline:
            with self.db.read() as conn:
                behind = False
                for key in list(self._wanted):
                    graph = self._graphs.get(key)
                    if graph is None:
                        behind = True
                        break
                    newer = conn.exec_driver_sql(
                        f"SELECT 1 FROM {self.log} WHERE dataset_key = ? AND id > ? LIMIT 1",
                        (key, graph.applied),
                    ).first()
                    behind = behind or newer is not None
            if not behind:
                return True
            self._wake.set()
            time.sleep(0.05)
        return False

    def size(self, key: int) -> int:
        graph = self._graphs.get(key)
        return 0 if graph is None else len(graph.index)

    def staged(self, key: int) -> int:
        graph = self._graphs.get(key)
        return 0 if graph is None else len(graph.stage)

    def memory_bytes(self) -> int:
        return sum(
            int(graph.index.memory_usage) + graph.stage.memory_bytes()
            for graph in list(self._graphs.values())
        )

    def close(self) -> None:
        """Stop the thread and snapshot every graph with changes (a clean stop loads fast)."""
        self.stop()
        for graph in list(self._graphs.values()):
            if graph.changes:
                try:
                    self._save(graph)
                except Exception:  # a snapshot is an optimisation: the log still holds it all
                    log.exception("could not snapshot the graph of dataset key %s", graph.key)

    def stop(self) -> None:
        """Stop the thread (it ends the step it is in: an add turn, a snapshot); the graphs stay
        in memory and the log keeps what they have not taken in (`want` starts it again).
        Only while nothing else calls `want` (a bench, close)."""
        with self._state:
            thread = self._thread
            self._thread = None
        if thread is not None:
            self._stop.set()
            self._wake.set()
            thread.join(timeout=120)

    # --- the thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._turn()
            except Exception:  # the database busy, a disk full: try again next turn
                log.exception("keeping the vector graphs failed; trying again")
                time.sleep(1.0)
            with self._state:
                if not self._wanted:  # started to prune the log (logged): done
                    self._thread = None
                    return
            staged = any(len(graph.stage) for graph in list(self._graphs.values()))
            self._wake.wait(LOOK_S if staged else POLL_S)  # staged: look for a spare core soon
            self._wake.clear()

    def _turn(self) -> None:
        with self._state:
            missing = sorted(self._wanted - set(self._graphs))
        for key in missing:
            if self._stop.is_set():
                return
            graph = self._load(key)
            if graph is None and not self._stop.is_set():
                graph = self._build(key)
            if graph is None:  # stopped on the way: nothing half made is kept, or saved
                return
            with self._state:
                self._graphs[key] = graph
        for graph in list(self._graphs.values()):
            while not self._stop.is_set() and graph.key in self._graphs:
                staged = self._catch_up(graph)
                if not (self._drain(graph) or staged):
                    break
            if graph.key not in self._graphs:  # its dataset was deleted
                continue
            if self._due(graph):
                self._save(graph)
        if time.monotonic() - self._pruned_at >= PRUNE_INTERVAL_S:
            self._prune()

    def _new_index(self) -> Index:
        return Index(
            ndim=self.dimension,
            metric="cos",
            dtype=graph_dtype(),
            connectivity=CONNECTIVITY,
            expansion_add=EXPANSION_ADD,
            expansion_search=EXPANSION_SEARCH,
        )

    def _load(self, key: int) -> Graph | None:
        """The dataset's last snapshot, if there is one that loads and holds what its row says."""
        if self.folder is None:
            return None
        with self.db.read() as conn:
            row = conn.exec_driver_sql(
                f"SELECT log_id, file, size FROM {self.snapshots} WHERE dataset_key = ?", (key,)
            ).first()
        self._sweep(key, keep=None if row is None else row[1])
        if row is None:
            return None
        log_id, name, size = row
        path = self.folder / name
        try:
            index = Index.restore(str(path))
        except Exception as exc:
            log.warning("the graph snapshot %s does not load (%s): rebuilding it", path, exc)
            return None
        if index is None or index.ndim != self.dimension or len(index) != size:
            log.warning("the graph snapshot %s is not what was saved: rebuilding it", path)
            return None
        graph = Graph(key, index, int(log_id), Stage(self.dimension), int(log_id))
        graph.snapshot = int(log_id)
        if not name.endswith(SNAPSHOT_SUFFIX):  # saved before builds were swept: sweep it now
            relinked = relink_orphans(index, os.cpu_count() or 1, self._stop)
            if relinked is None:  # the sweep did not finish: the next start sweeps it
                return None
            self.relinked += relinked
            graph.changes, graph.saved_at = max(graph.changes, 1), -math.inf  # saved at once
        index.expansion_search = EXPANSION_SEARCH  # type: ignore[misc]
        index.expansion_add = EXPANSION_GROW  # type: ignore[misc]
        return graph

    def _build(self, key: int) -> Graph | None:
        """A graph of the dataset's active vectors as the database holds them now; None when
        the thread was stopped before it was whole (and swept)."""
        index = self._new_index()
        threads = os.cpu_count() or 1
        with self.db.read() as conn:
            top = conn.exec_driver_sql(f"SELECT coalesce(max(id), 0) FROM {self.log}").scalar()
            rows = conn.exec_driver_sql(
                f"SELECT rowid, embedding FROM {self.vec} WHERE dataset_key = ? AND active = 1",
                (key,),
            )
            while batch := rows.fetchmany(READ_BATCH):
                if self._stop.is_set():
                    return None
                keys = np.fromiter((row[0] for row in batch), dtype=np.uint64, count=len(batch))
                vectors = np.frombuffer(b"".join(row[1] for row in batch), dtype=np.float32)
                index.add(keys, vectors.reshape(len(batch), self.dimension), threads=threads)
        # one thread strands nothing (0 of 400 builds measured): no sweep needed
        relinked = relink_orphans(index, threads, self._stop) if threads > 1 else 0
        if relinked is None:
            return None
        self.relinked += relinked
        self.builds += 1
        index.expansion_add = EXPANSION_GROW  # type: ignore[misc]
        graph = Graph(key, index, int(top or 0), Stage(self.dimension), int(top or 0))
        graph.changes = len(index)
        graph.saved_at = -math.inf  # a fresh build is worth a snapshot at once
        return graph

    def _catch_up(self, graph: Graph) -> bool:
        """Take the next log rows in: the chunks added onto the stage, the chunks removed off
        the stage and out of the graph; False when there were none, or the stage holds twice
        its limit (a backlog: a restart far behind, a dataset embedded again) until the graph
        has taken some in, so that it stays bounded in memory and in what a search scores."""
        room = max(APPLY_BATCH, 2 * self.stage_max) - len(graph.stage)
        if room <= 0:
            return False
        with self.db.read() as conn:
            rows = conn.exec_driver_sql(
                f"SELECT id, seq, added FROM {self.log} WHERE dataset_key = ? AND id > ? "
                "ORDER BY id LIMIT ?",
                (graph.key, graph.staged, min(PENDING_MAX, room)),
            ).all()
            if not rows:
                return False
            wanted = [seq for _, seq, added in rows if added]
            vectors = self._vectors(conn, wanted)
        for log_id, seq, added in rows:
            if seq == RESET:
                self._forget(graph)
                return False
            with graph.lock:
                if graph.index.contains(seq):  # removed, or logged again (its row is the truth)
                    graph.index.remove(seq)
                    graph.changes += 1
                if not added:
                    graph.stage.drop(seq)
                elif seq in vectors:  # else gone since: a later row removes it
                    graph.stage.put(seq, log_id, np.frombuffer(vectors[seq], dtype=np.float32))
                graph.staged = int(log_id)
        self._settle(graph)
        return True

    def _drain(self, graph: Graph, force: bool = False) -> bool:
        """Add a turn of staged chunks to the graph, the longest staged first, when `force`d, the
        stage is over its limit, the log must be caught up now (caught_up), or the machine has a
        core to spare; False when it added none."""
        if not len(graph.stage):
            return False
        size = turn_size(graph.add_s)
        if not (force or time.monotonic() < self._flush_until or self._spare.allow()):
            size = min(size, len(graph.stage) - self.stage_max)  # what is over the limit
            if size <= 0:
                return False
        with graph.lock:
            began = time.perf_counter()  # the turn's own time, not its wait for the lock
            seqs, vectors = graph.stage.take(size)
            keys = np.asarray(seqs, dtype=np.uint64)
            graph.index.add(keys, vectors, threads=1)
            graph.add_s = (time.perf_counter() - began) / len(seqs)
            graph.changes += len(seqs)
        self._settle(graph)
        return True

    def _settle(self, graph: Graph) -> None:
        """The graph now reflects the log up to the row before the first one still staged."""
        with graph.lock:
            floor = graph.stage.floor()
            graph.applied = graph.staged if floor is None else floor

    def _vectors(self, conn: Connection, seqs: Sequence[int]) -> dict[int, bytes]:
        found: dict[int, bytes] = {}
        for start in range(0, len(seqs), 500):
            part = seqs[start : start + 500]
            marks = ",".join("?" * len(part))
            rows = conn.exec_driver_sql(
                f"SELECT seq, embedding FROM {self.rows} WHERE seq IN ({marks})", tuple(part)
            )
            found.update({int(rowid): blob for rowid, blob in rows})
        return found

    def _forget(self, graph: Graph) -> None:
        """The dataset was deleted: drop its graph, its snapshot and its log rows."""
        with self._state:
            self._graphs.pop(graph.key, None)
            self._wanted.discard(graph.key)
        with self.db.write() as tx:
            tx.exec_driver_sql(f"DELETE FROM {self.snapshots} WHERE dataset_key = ?", (graph.key,))
            tx.exec_driver_sql(
                f"DELETE FROM {self.log} WHERE dataset_key = ? AND id <= {self.kept}", (graph.key,)
            )
        self._sweep(graph.key, keep=None)

    # --- snapshots ------------------------------------------------------------------------------
    def _due(self, graph: Graph) -> bool:
        if self.folder is None or not graph.changes:
            return False
        return (
            graph.changes >= SNAPSHOT_CHANGES
            or time.monotonic() - graph.saved_at >= SNAPSHOT_INTERVAL_S
        )

    def _save(self, graph: Graph) -> None:
        if self.folder is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        applied, size = graph.applied, len(graph.index)
        # a graph can change without its log row moving (removes past its first staged chunk):
        # the last row read names it too, so a snapshot never takes the place of the recorded one
        name = f"{graph.key}-{applied}-{graph.staged}{SNAPSHOT_SUFFIX}"
        temporary = self.folder / f".{name}.tmp"
        # only this thread changes the graph, so it holds still while it is written
        graph.index.save(str(temporary))
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, self.folder / name)
        _fsync_folder(self.folder)
        with self.db.write() as tx:
            tx.exec_driver_sql(
                f"INSERT INTO {self.snapshots} (dataset_key, log_id, file, size) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (dataset_key) DO UPDATE SET "
                "log_id = excluded.log_id, file = excluded.file, size = excluded.size",
                (graph.key, applied, name, size),
            )
            tx.exec_driver_sql(
                f"DELETE FROM {self.log} WHERE dataset_key = ? AND id <= ? AND id <= {self.kept}",
                (graph.key, applied),
            )
        graph.changes = 0
        graph.saved_at = time.monotonic()
        graph.snapshot = applied
        self._sweep(graph.key, keep=name)

    def _sweep(self, key: int, keep: str | None) -> None:
        """Remove the dataset's snapshot files other than `keep` (older ones, temporary ones a
        killed process left)."""
        if self.folder is None or not self.folder.is_dir():
            return
        for path in self.folder.iterdir():
            plain = path.name.lstrip(".")
            if plain.startswith(f"{key}-") and path.name != keep:
                path.unlink(missing_ok=True)

    def _prune(self) -> None:
        """Drop log rows no graph needs: those a snapshot holds, those a graph in memory holds
        without a snapshot, and all rows of datasets with neither (a build reads the truth)."""
        self._pruned_at = time.monotonic()
        self._logged = 0
        with self.db.write() as tx:
            top = tx.exec_driver_sql(f"SELECT coalesce(max(id), 0) FROM {self.log}").scalar()
            held = {
                key: graph.snapshot if graph.snapshot is not None else graph.applied
                for key, graph in self._graphs.items()
            }
            snapshots: dict[int, int] = dict(
                tx.exec_driver_sql(f"SELECT dataset_key, log_id FROM {self.snapshots}").all()
            )
            floors = {**snapshots, **held}
            keys = ",".join(str(int(key)) for key in floors)
            others = f" AND dataset_key NOT IN ({keys})" if keys else ""
            tx.exec_driver_sql(
                f"DELETE FROM {self.log} WHERE id <= ? AND id <= {self.kept}{others}", (top,)
            )
            for key, floor in floors.items():
                tx.exec_driver_sql(
                    f"DELETE FROM {self.log} WHERE dataset_key = ? AND id <= ? "
                    f"AND id <= {self.kept}",
                    (key, floor),
                )


def _unit(vector: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    vector = np.asarray(vector, dtype=np.float32)
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0.0 else vector


def _fsync_folder(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
