"""The embedded index's side indexes of vectors: inverted lists (lists.py), one per large
dataset, kept beside the SQLite database and never trusted on their own (docs/architecture.md:
Vector search at a million chunks). They were HNSW graphs until their upkeep proved too dear
for ingestion; the names here (`Graphs`, a dataset's "graph") stayed.

The database stays the truth. Every change a dataset's lists must follow is a row of the vector
log (`<vector table>_log`), written by `SqliteIndex` in the transaction that makes it: the chunks
a generation's activation makes searchable (added), the chunks a delete or a new generation
drops (removed), a dataset deleted whole (a reset). The lists know the last log row they
reflect; a background thread (one per index) builds the lists of the datasets searched, applies
the log to them and saves a snapshot now and then; lists a dataset has outgrown are trained
again from the database on a thread of their own, the old ones kept meanwhile.

The thread stages the log's new chunks in memory first (stage.py) and adds them to the lists
while the machine has a core to spare, or when the stage is full.

A search asks its dataset's lists for candidates, adds the staged chunks nearest to the
question (each scored exactly) and every chunk logged as added since the thread last looked
(so a document is found the moment its job completes), and then scores all of them exactly in
SQL against the chunks that are active now, in the same read transaction:
a chunk the lists still hold but the database dropped (a stale generation, a deleted document)
cannot answer, and every score is the exact cosine. Lists that are missing (not built yet) or
too far behind answer nothing and the search is exact.

Snapshots are written to a temporary file, flushed and renamed to `<dataset key>-<log id>-<last
log id read>-<trained for>.lists.faiss`; only then does the database row in `<vector
table>_snapshots` point to them, and the log rows the snapshot holds are pruned. A process
killed while writing leaves at most a temporary file (swept at the next load) and the older
snapshot, which is loaded and caught up from the log; a snapshot that does not load, holds
another number of vectors than its row says, or is a graph of an earlier version, is rebuilt
from the database.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import Connection

from knowledgeops.db.engine import Database
from knowledgeops.ingest.index.keywords import state_table
from knowledgeops.ingest.index.lists import PROBE_SHARE, Lists, sample_size, units
from knowledgeops.ingest.index.stage import LOOK_S, STAGE_MAX, SpareCores, Stage

log = logging.getLogger(__name__)

CANDIDATES_MIN = 40  # the graph's nearest asked for at least, then scored exactly
CANDIDATES_PER_K = 2  # the 8-bit codes rank well: 40 candidates for 10 find what 160 do, and
# a hybrid search's 40 from 80 what it found from 160 (docs/performance.md)
CANDIDATES_MAX = 4096
CANDIDATES_WIDEN = 4  # a second ask, when too few of the first pass (candidate_asks)
PENDING_MAX = 2000  # logged changes a search will score itself; more: exact search
APPLY_BATCH = 64  # vectors added per turn of a graph's lock at most …
APPLY_TURN_S = 0.005  # … and about this long: a search of the graph waits no longer for it
READ_BATCH = 10_000  # vectors read per fetch while building
SNAPSHOT_CHANGES = 50_000  # changes applied since the last snapshot that make a new one due
SNAPSHOT_INTERVAL_S = 300.0  # … or this long since it, with any change
PRUNE_INTERVAL_S = 60.0
PRUNE_AFTER_ROWS = 10_000  # log rows written that start a prune when no graph is kept
PRUNE_BATCH = 20_000  # log rows deleted a write at most
POLL_S = 0.5
# a snapshot's file name ends in it; one without (an HNSW graph of an earlier version) is rebuilt
SNAPSHOT_SUFFIX = ".lists.faiss"
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


def candidate_asks(k: int, share: float) -> tuple[int, ...]:
    """How many of the lists' nearest a search scores, in turn, for k results when `share` of
    the dataset's chunks pass its filter (1.0: no filter): as many as the share should leave k
    of, then, when too few of those pass (the filter admits fewer near the question than over
    the dataset, or chunks have just been replaced), CANDIDATES_WIDEN times as many, before
    the search is exact."""
    first = int(min(CANDIDATES_MAX, max(CANDIDATES_MIN, CANDIDATES_PER_K * k) / max(share, 1e-9)))
    wider = min(CANDIDATES_MAX, first * CANDIDATES_WIDEN)
    return (first,) if wider <= first else (first, wider)


@dataclass
class Graph:
    key: int
    index: Lists
    applied: int  # the last log row it reflects (a snapshot holds the graph as of this row)
    stage: Stage
    staged: int = 0  # the last log row the graph and its stage reflect together
    changes: int = 0  # vectors added to or removed from the graph since the last snapshot
    saved_at: float = field(default_factory=time.monotonic)
    snapshot: int | None = None  # the log id of its last snapshot
    # a search must not scan the lists while the thread adds to them or removes from them
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    add_s: float = 0.0  # what adding a vector took in the last turn (0: not measured yet)


def turn_size(add_s: float) -> int:
    """How many vectors to add in one turn of the graph's lock: as many as take about
    APPLY_TURN_S at the cost of the last turn (one while it is not known), at most
    APPLY_BATCH (a search waits for the turn)."""
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
        self._trainers: dict[int, threading.Thread] = {}  # lists trained again, by dataset
        # (monotonic time counts from boot: a machine up less than a minute still prunes)
        self._pruned_at = -PRUNE_INTERVAL_S
        self.stage_max = stage_max  # staged chunks past which the graph takes them in anyway
        self._spare = SpareCores()
        self._flush_until = 0.0  # till then the graph takes staged chunks in at once (caught_up)
        self._logged = 0  # log rows written by this process since the last prune
        # the highest log id of each dataset that may have been pruned (raised before each
        # delete), and of the datasets without lists (admitted.py reads them)
        self._log_floors: dict[int, int] = {}
        self._others_floor = 0
        self.builds = 0  # lists built from the database (not loaded): for tests and bench
        self.retrained = 0  # of those, built again because the dataset had outgrown its lists

    # --- searches -------------------------------------------------------------------------------
    def nearest(
        self,
        conn: Connection,
        key: int,
        vector: npt.NDArray[np.float32],
        want: int,
        share: float = PROBE_SHARE,
        selector: Any = None,
    ) -> list[int] | None:
        """Candidate seqs for a search of the dataset `key`: the lists' `want` nearest (a scan
        of the `share` of its lists nearest to the question; of the codes `selector` admits
        only, where given: admitted.py), the stage's `want` nearest (exactly), and the chunks
        logged as added since the thread last read the log, read in `conn`'s transaction (the
        one that scores them). None when there are no lists yet (they are built) or they are
        far behind."""
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
            seqs = graph.index.search(vector, want, share, selector)
            staged = graph.stage.nearest(units(vector)[0], want)
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

    def log_floor(self, key: int) -> int:
        """The highest log id of the dataset whose row may have been pruned: rows after it are
        all still there."""
        floor = self._log_floors.get(key, 0)
        return floor if key in self._graphs else max(floor, self._others_floor)

    def _raise_floor(self, key: int, log_id: int) -> None:
        self._log_floors[key] = max(self._log_floors.get(key, 0), log_id)

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
            graph.index.memory_bytes + graph.stage.memory_bytes()
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
            trainers = list(self._trainers.values())
        if thread is not None or trainers:
            self._stop.set()
            self._wake.set()
        for each in ([thread] if thread is not None else []) + trainers:
            each.join(timeout=120)

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
        for kept in list(self._graphs.values()):
            if kept.index.stale:
                self._train_again(kept)
            graph = kept
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
        if not name.endswith(SNAPSHOT_SUFFIX):
            log.info("the snapshot %s is a graph of an earlier version: building lists", path)
            return None
        try:
            trained_for = int(name.removesuffix(SNAPSHOT_SUFFIX).rsplit("-", 1)[1])
            index = Lists.restore(str(path), trained_for)
        except Exception as exc:
            log.warning("the snapshot %s does not load (%s): rebuilding it", path, exc)
            return None
        if index.dimension != self.dimension or len(index) != size:
            log.warning("the snapshot %s is not what was saved: rebuilding it", path)
            return None
        graph = Graph(key, index, int(log_id), Stage(self.dimension), int(log_id))
        graph.snapshot = int(log_id)
        return graph

    def _build(self, key: int) -> Graph | None:
        """Lists of the dataset's active vectors as the database holds them now, trained on a
        random sample of them; None when the thread was stopped before they were whole."""
        with self.db.read() as conn:
            top = conn.exec_driver_sql(f"SELECT coalesce(max(id), 0) FROM {self.log}").scalar()
            seqs = [
                int(seq)
                for (seq,) in conn.exec_driver_sql(
                    f"SELECT rowid FROM {self.vec} WHERE dataset_key = ? AND active = 1", (key,)
                )
            ]
            rng = np.random.default_rng(key & 0xFFFFFFFF)
            picked = sorted(rng.choice(seqs, sample_size(len(seqs)), replace=False).tolist())
            blobs = self._vectors(conn, picked)
            sample = [np.frombuffer(blobs[seq], dtype=np.float32) for seq in picked]
            index = Lists.trained(
                np.vstack(sample) if sample else np.zeros((1, self.dimension), np.float32),
                len(seqs),
            )
            rows = conn.exec_driver_sql(
                f"SELECT rowid, embedding FROM {self.vec} WHERE dataset_key = ? AND active = 1",
                (key,),
            )
            while batch := rows.fetchmany(READ_BATCH):
                if self._stop.is_set():
                    return None
                keys = [row[0] for row in batch]
                vectors = np.frombuffer(b"".join(row[1] for row in batch), dtype=np.float32)
                index.add(keys, vectors.reshape(len(batch), self.dimension))
        with self._state:  # the keeper's thread builds, and a dataset's trainer
            self.builds += 1
        graph = Graph(key, index, int(top or 0), Stage(self.dimension), int(top or 0))
        # a fresh build is worth a snapshot at once, empty too (it replaces an older one)
        graph.changes = max(1, len(index))
        graph.saved_at = -math.inf
        return graph

    def _train_again(self, graph: Graph) -> None:
        """The dataset has outgrown its lists (Lists.stale): build new ones on a thread of their
        own (a million chunks take a minute), while this one keeps every dataset's lists,
        these included, caught up."""
        with self._state:
            if graph.key in self._trainers or self._stop.is_set():
                return
            trainer = threading.Thread(
                target=self._retrain, args=(graph,), name=f"kops-lists-{graph.key}", daemon=True
            )
            self._trainers[graph.key] = trainer
        trainer.start()

    def _retrain(self, graph: Graph) -> None:
        """Build the dataset's lists from the database and put them in the old ones' place
        (which answer meanwhile). The new lists hold the database as of their build: what the
        old ones staged since is in it, and the log after it is caught up as always."""
        try:
            fresh = self._build(graph.key)
            with self._state:
                # not when stopped, nor when the dataset was deleted meanwhile
                if fresh is not None and self._graphs.get(graph.key) is graph:
                    self._graphs[graph.key] = fresh
                    self.retrained += 1
        except Exception:  # the database busy, a disk full: the next turn tries again
            log.exception("training the lists of dataset key %s again failed", graph.key)
        finally:
            with self._state:
                self._trainers.pop(graph.key, None)
        self._wake.set()

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
                if seq in graph.index:  # removed, or logged again (its row is the truth)
                    graph.index.remove([seq])
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
            graph.index.add(seqs, vectors)
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
        self._raise_floor(graph.key, 2**62)
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
        # the lists can change without their log row moving (removes past the first staged
        # chunk): the last row read names them too, so a snapshot never takes the place of the
        # recorded one; the size they were trained for is read back from the name
        trained_for = graph.index.trained_for
        name = f"{graph.key}-{applied}-{graph.staged}-{trained_for}{SNAPSHOT_SUFFIX}"
        temporary = self.folder / f".{name}.tmp"
        # only this thread changes the graph, so it holds still while it is written
        graph.index.save(str(temporary))
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, self.folder / name)
        _fsync_folder(self.folder)
        self._raise_floor(graph.key, applied)
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
        without a snapshot, and all rows of datasets with neither (a build reads the truth).
        They are deleted PRUNE_BATCH at a time, each batch its own write: after a bulk write
        (a million rows) one delete would hold the database's write lock for many seconds."""
        self._pruned_at = time.monotonic()
        self._logged = 0
        # read under the write lock: the write whose log rows started this prune (`logged` runs
        # inside its transaction) has committed by then, so its rows are below `top`; a read
        # could run before that commit, see none of them, and leave them for PRUNE_INTERVAL_S
        with self.db.write() as conn:
            top = conn.exec_driver_sql(f"SELECT coalesce(max(id), 0) FROM {self.log}").scalar()
            snapshots: dict[int, int] = dict(
                conn.exec_driver_sql(f"SELECT dataset_key, log_id FROM {self.snapshots}").all()
            )
        held = {
            key: graph.snapshot if graph.snapshot is not None else graph.applied
            for key, graph in self._graphs.items()
        }
        # rows after a recorded snapshot stay while lists built since have none of their own: a
        # start would load that snapshot and need them. Every floor only rises while the batches
        # run (this thread builds and saves; a retrain's lists start from their own build), so
        # rows below it stay unneeded
        floors = {**snapshots, **held}
        for key, log_id in snapshots.items():
            floors[key] = min(log_id, floors[key])
        keys = ",".join(str(int(key)) for key in floors)
        others = f" AND dataset_key NOT IN ({keys})" if keys else ""
        self._others_floor = max(self._others_floor, int(top or 0))
        self._delete_batched(f"id <= ? AND id <= {self.kept}{others}", (top,))
        for key, floor in floors.items():
            self._raise_floor(key, floor)
            self._delete_batched(f"dataset_key = ? AND id <= ? AND id <= {self.kept}", (key, floor))

    def _delete_batched(self, where: str, params: tuple[Any, ...]) -> None:
        """Delete the log rows matching `where`, PRUNE_BATCH a write, oldest first."""
        while not self._stop.is_set():
            with self.db.write() as tx:
                gone = tx.exec_driver_sql(
                    f"DELETE FROM {self.log} WHERE id IN (SELECT id FROM {self.log} "
                    f"WHERE {where} ORDER BY id LIMIT {PRUNE_BATCH})",
                    params,
                ).rowcount
            if gone < PRUNE_BATCH:
                return


def _fsync_folder(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
