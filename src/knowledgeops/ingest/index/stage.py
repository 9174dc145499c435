"""The chunks a graph has not taken in yet, and when it takes them (docs/architecture.md: Vector
search at a million chunks, "The graph's upkeep waits for a spare core").

At a million chunks a graph takes a chunk in for 2–5 ms of a core, while the model embeds one
for 30–60 ms of all of them: a graph kept up to date while documents are embedded cost ingestion
17% of its throughput (docs/performance.md, 2026-12-05). So the graphs' thread first puts the
log's new chunks on a stage, in memory, and adds them to the graph only while the machine has a
core to spare (`SpareCores`), or when the stage is full. Each search scores every staged chunk
exactly (a product of the matrix and the question), so a staged chunk is found as surely as one
in the graph; a burst of documents is embedded at the speed of a machine without the graph, and
the graph takes the burst in afterwards.
"""

from __future__ import annotations

import time

import numpy as np
import numpy.typing as npt

from knowledgeops.cpu import BusyCpu

# chunks staged per graph past which the graph takes them in anyway, down to it (15 MB at 384
# dimensions; a search scores them all)
STAGE_MAX = 10_000
LOOK_S = 0.25  # the machine watched this long at least, the graph left alone, before each slice …
SLICE_S = 0.5  # … of this long adding staged chunks to it while it had a core to spare
SPARE_CORES = 0.75  # of a core idle, on average over the look, that make a core to spare


class Stage:
    """Chunks the log added, not yet in the graph: their seqs, log ids and unit vectors, in the
    order logged. Used under the graph's lock."""

    def __init__(self, dimension: int) -> None:
        self.dimension = dimension
        self._vectors = np.zeros((0, dimension), dtype=np.float32)
        self._seqs = np.zeros(0, dtype=np.int64)
        self._log_ids = np.zeros(0, dtype=np.int64)
        self._live = np.zeros(0, dtype=bool)
        self._count = 0  # rows used, live or not
        self._first = 0  # rows before it are all taken or dropped
        self._row: dict[int, int] = {}  # seq → its live row

    def __len__(self) -> int:
        return len(self._row)

    def __contains__(self, seq: int) -> bool:
        return seq in self._row

    def put(self, seq: int, log_id: int, vector: npt.NDArray[np.float32]) -> None:
        """Stage the chunk `seq` as log row `log_id` added it (a seq staged already: this row
        is the truth now)."""
        self.drop(seq)
        if self._count == len(self._seqs):
            self._grow()
        norm = float(np.linalg.norm(vector))
        row = self._count
        self._vectors[row] = vector / norm if norm > 0.0 else vector
        self._seqs[row], self._log_ids[row], self._live[row] = seq, log_id, True
        self._row[seq] = row
        self._count += 1

    def drop(self, seq: int) -> None:
        """The chunk left the dataset's searchable set (a delete, a newer generation)."""
        row = self._row.pop(seq, None)
        if row is not None:
            self._live[row] = False
            self._advance()

    def take(self, n: int) -> tuple[list[int], npt.NDArray[np.float32]]:
        """The `n` staged longest (at most), off the stage: their seqs and vectors."""
        rows: list[int] = []
        row = self._first
        while row < self._count and len(rows) < n:
            if self._live[row]:
                rows.append(row)
            row += 1
        vectors = self._vectors[rows]
        seqs = [int(seq) for seq in self._seqs[rows]]
        for seq, row in zip(seqs, rows, strict=True):
            self._live[row] = False
            del self._row[seq]
        self._advance()
        return seqs, vectors

    def floor(self) -> int | None:
        """The log id before the first still staged (every row up to it is in the graph or was
        dropped); None when nothing is staged."""
        if not self._row:
            return None
        return int(self._log_ids[self._first]) - 1

    def nearest(self, vector: npt.NDArray[np.float32], want: int) -> list[int]:
        """The `want` staged chunks nearest to `vector` by cosine, exactly."""
        if not self._row:
            return []
        scores = self._vectors[self._first : self._count] @ vector.astype(np.float32)
        scores[~self._live[self._first : self._count]] = -np.inf
        live = len(self._row)
        if want < live:
            best = np.argpartition(-scores, want - 1)[:want]
        else:
            best = np.flatnonzero(self._live[self._first : self._count])
        return [int(seq) for seq in self._seqs[self._first + best]]

    def _advance(self) -> None:
        """The first row is the first live one; none live: the rows are used again from 0."""
        while self._first < self._count and not self._live[self._first]:
            self._first += 1
        if self._first == self._count:
            self._first = self._count = 0

    def memory_bytes(self) -> int:
        return int(self._vectors.nbytes + self._seqs.nbytes + self._log_ids.nbytes)

    def _grow(self) -> None:
        """Room for more rows: the live rows are kept, in their order, the dead ones go, and
        the arrays double when the live fill more than three quarters of them."""
        live = self._first + np.flatnonzero(self._live[self._first : self._count])
        kept = len(live)
        size = len(self._seqs)
        if kept > 0.75 * size or size == 0:
            size = max(64, 2 * size)
        vectors, seqs, log_ids = self._vectors[live], self._seqs[live], self._log_ids[live]
        self._vectors = np.zeros((size, self.dimension), dtype=np.float32)
        self._seqs = np.zeros(size, dtype=np.int64)
        self._log_ids = np.zeros(size, dtype=np.int64)
        self._live = np.zeros(size, dtype=bool)
        self._vectors[:kept], self._seqs[:kept], self._log_ids[:kept] = vectors, seqs, log_ids
        self._live[:kept] = True
        self._row = {int(seq): row for row, seq in enumerate(seqs)}
        self._first, self._count = 0, kept


class SpareCores:
    """Whether the machine has a core to spare for the graph: watched for LOOK_S or more while
    the caller adds nothing to the graph (the other threads' and processes' CPU on the cores this
    process may use, its own left out), then yes for a slice of SLICE_S, and watched again.
    While the model embeds on every core there is none; between bursts, or while one core
    parses, there is. A slice granted just before the model starts again costs the model that
    slice at most (its batch waits for the thread the graph slowed)."""

    def __init__(self) -> None:
        self.cpu = BusyCpu()
        self.capacity = self.cpu.capacity  # in cores: a fraction under a CPU quota
        self._since: tuple[float, float, float] | None = None  # wall, busy CPU, own CPU
        self._until = 0.0  # the end of the slice granted

    def allow(self) -> bool:
        """Called by the one thread that keeps the graphs."""
        now = time.monotonic()
        if now < self._until:
            return True
        busy, own = self.cpu.seconds(), time.thread_time()
        if busy is None:  # the machine's CPU cannot be read: the graph is kept as it comes
            return True
        if self._since is None:  # a slice ended, or the first look: watch from now
            self._since = (now, busy, own)
            return False
        began, busy_then, own_then = self._since
        if now - began < LOOK_S:
            return False
        others = ((busy - busy_then) - (own - own_then)) / (now - began)
        if others <= self.capacity - SPARE_CORES:
            self._since = None
            self._until = now + SLICE_S
            return True
        self._since = (now, busy, own)
        return False
