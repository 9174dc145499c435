"""The embedded index's HNSW graphs (ingest/index/graphs.py) against a real SQLite database:
a search never answers from a generation, document or dataset the database dropped, finds a
document the moment it is activated, and the snapshots beside the database survive a kill -9
(a torn or missing file is rebuilt from the database, an older one is caught up from the log)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from usearch.index import Index

from knowledgeops.db.engine import Database
from knowledgeops.ingest.index import graphs
from knowledgeops.ingest.index.base import IndexedChunk, chunk_id, text_hash
from knowledgeops.ingest.index.filters import SearchFilter
from knowledgeops.ingest.index.keys import dataset_key
from knowledgeops.ingest.index.pgvector import PgVectorIndex
from knowledgeops.ingest.index.sqlite import SqliteIndex, graph_folder
from knowledgeops.lab.embedders import HashingEmbedder
from tests.fixtures.rows import insert_dataset, insert_document

EMBED = HashingEmbedder(dimension=32)
WORDS = [f"w{n}" for n in range(400)]


def texts(seed: int, count: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=12)) for _ in range(count)]


def chunks(dataset: str, document: str, generation: int, bodies: list[str]) -> list[IndexedChunk]:
    return [
        IndexedChunk(
            id=chunk_id(document, generation, n),
            document_id=document,
            dataset_id=dataset,
            generation=generation,
            ordinal=n,
            text=body,
            content_hash=text_hash(body),
            token_count=12,
            page_start=None,
            page_end=None,
            section=None,
            vector=EMBED.vector(body),
        )
        for n, body in enumerate(bodies)
    ]


def write(
    index: SqliteIndex | PgVectorIndex,
    dataset: str,
    document: str,
    generation: int,
    bodies: list[str],
) -> None:
    """A generation of the document written and made searchable, as a job does."""
    with index.db.write() as tx:
        index.upsert(tx, chunks(dataset, document, generation, bodies))
        index.activate(tx, document, generation)


def make(db: Database) -> SqliteIndex:
    index = SqliteIndex(db, EMBED.dimension, graph_min_chunks=1)
    index.ensure()
    return index


def exact(index: SqliteIndex, dataset: str, query: str, k: int = 5) -> list[str]:
    with index.db.read() as conn:
        return [h.chunk_id for h in index._exact(conn, dataset, EMBED.vector(query), k, None)]


def found(index: SqliteIndex, dataset: str, query: str, k: int = 5) -> list[str]:
    return [h.chunk_id for h in index.search_vector(dataset, EMBED.vector(query), k)]


def as_exact(index: SqliteIndex, dataset: str, query: str, k: int = 5) -> None:
    """The search's k best are exact's: the same scores, and chunks among those that score
    as high (this bench's vectors of 12 words in 32 dimensions tie often, and a tie's order
    rests on the last bit of whichever float arithmetic scored it)."""
    vector = EMBED.vector(query)
    hits = index.search_vector(dataset, vector, k)
    with index.db.read() as conn:
        best = index._exact(conn, dataset, vector, k, None)
        last = best[-1].score
        tied = {h.chunk_id for h in index._exact(conn, dataset, vector, 4 * k, None)}
    assert [round(h.score, 5) for h in hits] == [round(h.score, 5) for h in best]
    assert all(h.chunk_id in tied for h in hits if h.score <= last + 1e-6)
    assert [h.chunk_id for h in hits if h.score > last + 1e-6] == [
        h.chunk_id for h in best if h.score > last + 1e-6
    ]


def built(index: SqliteIndex, dataset: str) -> None:
    index.graphs.want(dataset_key(dataset))
    assert index.graphs.caught_up(timeout=30)


def as_saved_before_the_sweep(index: SqliteIndex) -> Path:
    """Rename the index's one snapshot as a version before the sweep named it: its path."""
    folder = graph_folder(index.db)
    assert folder is not None
    (snapshot,) = folder.iterdir()
    assert snapshot.name.endswith(graphs.SNAPSHOT_SUFFIX)
    older = snapshot.with_name(snapshot.name.replace(graphs.SNAPSHOT_SUFFIX, ".usearch"))
    snapshot.rename(older)
    with index.db.write() as tx:
        tx.exec_driver_sql(f"UPDATE {index.graphs.snapshots} SET file = ?", (older.name,))
    return older


@pytest.fixture
def setup(sqlite_db: Database):
    index = make(sqlite_db)
    with sqlite_db.write() as conn:
        dataset = insert_dataset(conn)
    yield index, dataset
    index.close()


def test_a_graph_search_equals_exact_on_a_small_dataset(setup) -> None:
    index, dataset = setup
    with index.db.write() as conn:
        document = insert_document(conn, dataset)
    write(index, dataset, document, 1, texts(1, 300))
    built(index, dataset)
    assert index.graphs.size(dataset_key(dataset)) == 300
    for query in texts(2, 20):
        as_exact(index, dataset, query)


def test_a_fused_lists_short_walk_leaves_the_vector_searchs_walk_as_it_was(
    setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hybrid search's vector list walks the graph less far (EXPANSION_FUSED): the walk's
    breadth is the graph's own setting, so it must be set back for every other search."""
    index, dataset = setup
    with index.db.write() as conn:
        document = insert_document(conn, dataset)
    write(index, dataset, document, 1, texts(1, 300))
    built(index, dataset)
    monkeypatch.setattr(graphs, "EXPANSION_FUSED", 1)
    live = {chunk_id(document, 1, n) for n in range(300)}
    for query in texts(2, 20):
        fused = index.search_vector(dataset, EMBED.vector(query), 5, fused=True)
        assert len(fused) == 5
        assert {h.chunk_id for h in fused} <= live
        as_exact(index, dataset, query)
    graph = index.graphs._graphs[dataset_key(dataset)]
    assert graph.index.expansion_search == graphs.EXPANSION_SEARCH


def reached(index: Index) -> set[int]:
    """The keys a walk as broad as the graph reaches: every one when the graph is connected."""
    index.expansion_search = max(graphs.EXPANSION_SEARCH, len(index))
    probe = np.full(index.ndim, 1.0, dtype=np.float32)
    return {int(key) for key in np.asarray(index.search(probe, len(index), threads=1).keys)}


def test_a_graph_built_by_several_threads_reaches_every_vector_once_swept() -> None:
    """usearch's add from several threads leaves nodes no walk reaches (in about three builds
    of 300 float16 vectors in four, on 2 threads): relink_orphans adds them again, and then a
    walk as broad as the graph finds every vector, in every one of 30 builds."""
    rng = np.random.default_rng(3)
    keys = np.arange(300, dtype=np.uint64)
    for _ in range(30):
        vectors = rng.standard_normal((300, 32)).astype(np.float32)
        index = Index(ndim=32, metric="cos", dtype="f16", connectivity=graphs.CONNECTIVITY)
        index.expansion_add = graphs.EXPANSION_ADD
        index.add(keys, vectors, threads=2)
        graphs.relink_orphans(index, threads=2)
        assert reached(index) == set(range(300))
        assert index.expansion_search == graphs.EXPANSION_SEARCH  # set back for the searches
        found = index.search(vectors[:5], 1, threads=1)  # a vector added again is its own
        assert np.asarray(found.keys)[:, 0].tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("size", [1, 5, 300])
def test_the_sweep_adds_nothing_again_in_a_graph_built_by_one_thread(size: int) -> None:
    """One thread strands no vector (0 of 400 builds measured), so the sweep finds nothing to
    add again: not 40 identical vectors, whose walks find their twins as near as themselves,
    nor the vectors of a graph smaller than the walk's k."""
    rng = np.random.default_rng(4)
    vectors = rng.standard_normal((size, 32)).astype(np.float32)
    vectors[: min(size, 40)] = vectors[0]  # one chunk's text, many times
    index = Index(ndim=32, metric="cos", dtype=graphs.graph_dtype())
    index.add(np.arange(size, dtype=np.uint64), vectors, threads=1)
    assert graphs.relink_orphans(index, threads=2) == 0
    assert reached(index) == set(range(size))


def test_a_snapshot_saved_before_the_sweep_is_swept_when_loaded_and_saved_again(setup) -> None:
    """A snapshot file without SNAPSHOT_SUFFIX was written by a version whose builds were not
    swept: it loads (no rebuild), is swept, and is saved again under the new name."""
    index, dataset = setup
    with index.db.write() as conn:
        document = insert_document(conn, dataset)
    write(index, dataset, document, 1, texts(5, 200))
    built(index, dataset)
    index.close()
    folder = graph_folder(index.db)
    assert folder is not None
    older = as_saved_before_the_sweep(index)
    again = make(index.db)
    swept: list[int] = []
    sweep = graphs.relink_orphans
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(graphs, "relink_orphans", lambda *a, **k: swept.append(1) or sweep(*a, **k))
        built(again, dataset)
    assert again.graphs.builds == 0
    assert swept == [1]
    assert again.graphs.size(dataset_key(dataset)) == 200
    for query in texts(6, 10):
        as_exact(again, dataset, query)
    assert again.graphs.caught_up(timeout=30)
    deadline = time.monotonic() + 30
    while older.exists() and time.monotonic() < deadline:  # saved again at once, then swept
        time.sleep(0.05)
    (saved,) = folder.iterdir()
    assert saved.name.endswith(graphs.SNAPSHOT_SUFFIX)
    again.close()


@pytest.mark.parametrize("snapshot", [False, True])
def test_a_graph_stopped_before_it_is_whole_is_neither_kept_nor_saved(
    setup, monkeypatch: pytest.MonkeyPatch, snapshot: bool
) -> None:
    """The index closed while a graph is built, or while an older snapshot is swept: the
    half-made graph answers no search and is not saved (its snapshot row would claim the whole
    log); the next start builds it, or loads and sweeps the older snapshot, again."""
    index, dataset = setup
    with index.db.write() as conn:
        document = insert_document(conn, dataset)
    write(index, dataset, document, 1, texts(13, 200))
    key = dataset_key(dataset)
    folder = graph_folder(index.db)
    assert folder is not None
    if snapshot:  # an older snapshot, saved before the sweep: loading it sweeps it
        built(index, dataset)
        index.close()
        older = as_saved_before_the_sweep(index)
        index = make(index.db)
    sweep = graphs.relink_orphans

    def closed_meanwhile(graph: Index, threads: int, stop: threading.Event) -> int:
        stop.set()  # what close() does, arriving while the graph is swept
        return sweep(graph, threads, stop)

    monkeypatch.setattr(graphs, "relink_orphans", closed_meanwhile)
    monkeypatch.setattr(graphs.os, "cpu_count", lambda: 2)  # a build by one thread: no sweep
    index.graphs.want(key)
    deadline = time.monotonic() + 30
    while index.graphs._thread is not None and index.graphs._thread.is_alive():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert not index.graphs.ready(key)
    assert index.graphs.builds == 0
    index.close()
    files = sorted(path.name for path in folder.iterdir()) if folder.is_dir() else []
    with index.db.read() as conn:
        rows = conn.exec_driver_sql(f"SELECT file FROM {index.graphs.snapshots}").all()
    if snapshot:  # the older snapshot is kept as it was, to be swept at the next start
        assert files == [older.name]
        assert [row[0] for row in rows] == [older.name]
    else:
        assert files == []
        assert rows == []
    monkeypatch.setattr(graphs, "relink_orphans", sweep)
    again = make(index.db)
    built(again, dataset)
    assert again.graphs.builds == (0 if snapshot else 1)
    assert again.graphs.size(key) == 200
    for query in texts(14, 10):
        as_exact(again, dataset, query)
    again.close()


def test_an_add_turn_is_sized_to_what_adding_took() -> None:
    """The graph thread holds a graph's lock for about APPLY_TURN_S per turn: one vector
    while the cost is unknown, then as many as that cost allows, at most APPLY_BATCH."""
    assert graphs.turn_size(0.0) == 1
    assert graphs.turn_size(0.0025) == 2  # a million chunks: 2.5 ms a vector
    assert graphs.turn_size(0.02) == 1  # slower than a turn: still one at a time
    assert graphs.turn_size(1e-6) == graphs.APPLY_BATCH  # a small graph: the batch bounds it


def test_a_graph_being_changed_holds_up_no_other_datasets_search(setup) -> None:
    """Each graph has its own lock: while one dataset's graph takes in a batch (held here),
    another dataset's search walks its own graph and answers."""
    index, dataset = setup
    with index.db.write() as conn:
        other = insert_dataset(conn)
        document = insert_document(conn, dataset)
        elsewhere = insert_document(conn, other)
    write(index, dataset, document, 1, texts(1, 100))
    write(index, other, elsewhere, 1, texts(2, 100))
    built(index, dataset)
    built(index, other)
    busy = index.graphs._graphs[dataset_key(dataset)]
    walked = index.graphs._graphs[dataset_key(other)]
    answers: list[list[str]] = []

    def search() -> None:
        answers.append(found(index, other, "w1 w2"))

    with busy.lock:
        worker = threading.Thread(target=search)
        worker.start()
        worker.join(timeout=30)
        assert not worker.is_alive()  # it did not wait for the busy graph
        assert walked.lock.acquire(blocking=False)  # and left its own graph's lock free
        walked.lock.release()
    with walked.lock:  # its own graph's lock held: the search walks that graph, so it waits
        waiting = threading.Thread(target=search)
        waiting.start()
        waiting.join(timeout=0.5)
        assert waiting.is_alive()
    waiting.join(timeout=30)
    assert not waiting.is_alive()
    assert answers == [exact(index, other, "w1 w2")] * 2


def test_the_log_is_applied_in_turns_of_the_measured_size(
    setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Catching up 300 logged chunks takes as many turns of the graph's lock as their
    measured cost asks for, and ends holding all of them."""
    index, dataset = setup
    with index.db.write() as conn:
        document = insert_document(conn, dataset)
        later = insert_document(conn, dataset)
    write(index, dataset, document, 1, texts(1, 50))
    built(index, dataset)
    key = dataset_key(dataset)
    graph = index.graphs._graphs[key]
    turns: list[int] = []
    costs: list[float] = []
    sizes = iter([1, 7, 64] + [50] * 10)

    def size(add_s: float) -> int:
        costs.append(add_s)
        turns.append(next(sizes))
        return turns[-1]

    monkeypatch.setattr(graphs, "turn_size", size)
    graph.add_s = 0.0
    write(index, dataset, later, 1, texts(2, 300))
    assert index.graphs.caught_up(timeout=30)
    assert index.graphs.size(key) == 350
    assert turns[:3] == [1, 7, 64]
    assert sum(turns) >= 300
    assert costs[0] == 0.0  # not measured yet
    assert all(cost > 0.0 for cost in costs[1:])  # measured after each turn


def test_a_behind_graph_never_answers_from_a_dropped_generation(setup) -> None:
    index, dataset = setup
    with index.db.write() as conn:
        document = insert_document(conn, dataset)
        other = insert_document(conn, dataset)
    first, second = texts(3, 50), texts(4, 50)
    write(index, dataset, document, 1, first)
    write(index, dataset, other, 1, texts(5, 50))
    built(index, dataset)
    index.graphs.close()  # the thread stops: the graph stays at generation 1
    write(index, dataset, document, 2, second)  # generation 2 replaces 1
    with index.db.write() as tx:
        index.delete_document(tx, other)
    key = dataset_key(dataset)
    assert index.graphs.size(key) == 100  # still holds what the database dropped
    live = {chunk_id(document, 2, n) for n in range(50)}
    for query in first[:10] + second[:10]:
        hits = found(index, dataset, query)
        assert set(hits) <= live  # nothing of generation 1 nor of the deleted document
        assert hits == exact(index, dataset, query)  # and generation 2 is found at once
    index.graphs.want(key)  # the thread again: the graph catches up
    assert index.graphs.caught_up(timeout=30)
    assert index.graphs.size(key) == 50


def test_a_filter_that_admits_few_chunks_is_exact(setup) -> None:
    index, dataset = setup
    with index.db.write() as conn:
        documents = [insert_document(conn, dataset, meta={"n": n}) for n in range(6)]
    for n, document in enumerate(documents):
        write(index, dataset, document, 1, texts(10 + n, 40))
    built(index, dataset)
    where = SearchFilter(metadata=(("n", (3,)),))
    for query in texts(20, 10):
        hits = index.search_vector(dataset, EMBED.vector(query), 5, where)
        assert len(hits) == 5
        assert {h.document_id for h in hits} == {documents[3]}


def test_a_deleted_dataset_answers_nothing_and_its_snapshot_goes(setup) -> None:
    index, dataset = setup
    with index.db.write() as conn:
        document = insert_document(conn, dataset)
    write(index, dataset, document, 1, texts(6, 80))
    built(index, dataset)
    index.close()  # snapshots it
    folder = graph_folder(index.db)
    assert folder is not None
    assert any(folder.iterdir())
    index = make(index.db)
    with index.db.write() as tx:
        index.delete_dataset(tx, dataset)
    assert found(index, dataset, "w1 w2") == []
    index.graphs.want(dataset_key(dataset))
    deadline = time.monotonic() + 30
    while any(folder.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(folder.iterdir())
    index.close()


def test_a_snapshot_is_loaded_and_caught_up_not_rebuilt(setup) -> None:
    index, dataset = setup
    with index.db.write() as conn:
        document, later = insert_document(conn, dataset), insert_document(conn, dataset)
    write(index, dataset, document, 1, texts(7, 200))
    built(index, dataset)
    key = dataset_key(dataset)
    assert index.graphs._graphs[key].index.expansion_add == graphs.EXPANSION_GROW
    index.close()
    write(index, dataset, later, 1, texts(8, 30))  # after the snapshot: only in the log
    again = make(index.db)
    built(again, dataset)
    assert again.graphs.builds == 0  # loaded
    # built or loaded, a graph takes later chunks in at the breadth measured for growth
    assert again.graphs._graphs[key].index.expansion_add == graphs.EXPANSION_GROW
    assert again.graphs.size(dataset_key(dataset)) == 230
    for query in texts(9, 10):
        as_exact(again, dataset, query)
    again.close()
    with again.db.read() as conn:  # the snapshot holds the log: its rows are pruned
        left = conn.exec_driver_sql(f"SELECT count(*) FROM {again.log}").scalar()
    assert left == 0


@pytest.mark.parametrize("damage", ["truncated", "missing", "garbage"])
def test_a_damaged_snapshot_is_rebuilt_from_the_database(setup, damage: str) -> None:
    index, dataset = setup
    with index.db.write() as conn:
        document = insert_document(conn, dataset)
    write(index, dataset, document, 1, texts(11, 150))
    built(index, dataset)
    index.close()
    folder = graph_folder(index.db)
    assert folder is not None
    (snapshot,) = folder.iterdir()
    if damage == "truncated":
        snapshot.write_bytes(snapshot.read_bytes()[: snapshot.stat().st_size // 2])
    elif damage == "missing":
        snapshot.unlink()
    else:
        snapshot.write_bytes(os.urandom(4096))
    (folder / f".{snapshot.name}.tmp").write_bytes(b"half a snapshot")  # a killed writer's
    again = make(index.db)
    built(again, dataset)
    assert again.graphs.builds == 1
    assert again.graphs.size(dataset_key(dataset)) == 150
    assert not (folder / f".{snapshot.name}.tmp").exists()
    for query in texts(12, 10):
        as_exact(again, dataset, query)
    again.close()


WRITER = textwrap.dedent(
    """
    import sys, numpy as np
    from knowledgeops.db.engine import Database
    from knowledgeops.ingest.index import graphs
    from tests.integration.test_index_graphs import make, texts, write, built
    from tests.fixtures.rows import insert_document
    graphs.SNAPSHOT_CHANGES = 1  # a snapshot after every change
    graphs.SNAPSHOT_INTERVAL_S = 0.0
    db = Database(sys.argv[1])
    index = make(db)
    dataset = sys.argv[2]
    n = 0
    while True:
        with db.write() as conn:
            document = insert_document(conn, dataset)
        write(index, dataset, document, 1, texts(100 + n, 40))
        built(index, dataset)
        print(n, flush=True)
        n += 1
    """
)


def test_kill_9_while_snapshots_are_written_loses_nothing(setup, tmp_path: Path) -> None:
    index, dataset = setup
    index.close()
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, index.db.url, dataset],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert child.stdout is not None
    try:
        for _ in range(8):  # some rounds written and snapshotted, then killed mid-way
            assert child.stdout.readline(), "the writer died"
        time.sleep(float(np.random.default_rng().random() * 0.05))
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    with index.db.read() as conn:  # it was killed among snapshots, not before the first
        snapshots = conn.exec_driver_sql(f"SELECT count(*) FROM {index.graphs.snapshots}")
        assert snapshots.scalar() == 1
    again = make(index.db)
    built(again, dataset)
    with again.db.read() as conn:
        active = conn.exec_driver_sql(
            "SELECT count(*) FROM chunks c JOIN documents d ON d.id = c.document_id "
            "AND d.active_generation = c.generation WHERE c.dataset_id = ?",
            (dataset,),
        ).scalar()
    assert active >= 8 * 40
    assert again.graphs.size(dataset_key(dataset)) == active
    for query in texts(13, 15):
        as_exact(again, dataset, query)
    again.close()


def test_log_rows_of_datasets_without_a_graph_are_pruned(setup) -> None:
    index, dataset = setup
    with index.db.write() as conn:
        small = insert_dataset(conn, str(uuid.uuid4()))
        document = insert_document(conn, small)
        big_document = insert_document(conn, dataset)
    write(index, small, document, 1, texts(14, 10))
    write(index, dataset, big_document, 1, texts(15, 10))
    built(index, dataset)  # a graph for one dataset only
    index.graphs._prune()
    with index.db.read() as conn:
        rows = conn.exec_driver_sql(f"SELECT dataset_key, count(*) FROM {index.log} GROUP BY 1")
        left = dict(rows.all())
    assert dataset_key(small) not in left  # no graph wants them: a build reads the truth
    assert left.get(dataset_key(dataset), 0) == 0  # the graph holds them (applied)


class _NoSpareCore:
    """The answer of stage.SpareCores on a machine whose cores the model holds."""

    def allow(self) -> bool:
        return False


def staged_all(index: SqliteIndex, key: int, count: int) -> None:
    """Wait until the thread has read the whole log, and `count` chunks wait on the stage."""
    with index.db.read() as conn:
        top = conn.exec_driver_sql(f"SELECT max(id) FROM {index.log}").scalar()
    graph = index.graphs._graphs[key]
    deadline = time.monotonic() + 30
    while graph.staged < top:
        assert time.monotonic() < deadline, f"read the log to {graph.staged} of {top}"
        index.graphs.want(key)  # wakes the thread
        time.sleep(0.05)
    assert index.graphs.staged(key) == count


def on_a_busy_machine(index: SqliteIndex, dataset: str, seed: int) -> tuple[str, str, int]:
    """A graph of one document's 50 chunks, built; then no core is spare. The ids of that
    document and of one more (not written yet), and the dataset's key."""
    with index.db.write() as conn:
        first, later = insert_document(conn, dataset), insert_document(conn, dataset)
    write(index, dataset, first, 1, texts(seed, 50))
    built(index, dataset)
    index.graphs._spare = _NoSpareCore()  # type: ignore[assignment]
    return first, later, dataset_key(dataset)


def test_on_a_busy_machine_new_chunks_wait_on_the_stage_and_are_found_there(setup) -> None:
    """No core to spare: the graph's thread stages the log's chunks instead of adding them.
    A search finds them exactly, never a generation the database dropped; a snapshot taken
    meanwhile holds the graph without them, and a restart takes them in from the log."""
    index, dataset = setup
    first, later, key = on_a_busy_machine(index, dataset, 30)
    write(index, dataset, later, 1, texts(31, 300))
    staged_all(index, key, 300)
    assert index.graphs.size(key) == 50  # the graph took none of them in
    for query in texts(31, 300)[:10] + texts(32, 5):
        as_exact(index, dataset, query)
    write(index, dataset, later, 2, texts(33, 300))  # generation 2 replaces 1 on the stage
    staged_all(index, key, 300)
    graph = index.graphs._graphs[key]
    with graph.lock:
        on_stage = set(graph.stage.nearest(EMBED.vector("w1"), 1000))
    with index.db.read() as conn:
        newest = {
            seq
            for (seq,) in conn.exec_driver_sql(
                f"SELECT seq FROM {index.log} WHERE added = 1 ORDER BY id DESC LIMIT 300"
            )
        }
    assert on_stage == newest  # generation 2's chunks, none of generation 1's
    live = {chunk_id(first, 1, n) for n in range(50)} | {chunk_id(later, 2, n) for n in range(300)}
    for query in texts(31, 300)[:5] + texts(33, 300)[:5]:
        assert set(found(index, dataset, query)) <= live
        as_exact(index, dataset, query)
    assert graph.applied < graph.staged  # the graph reflects the log only up to the stage
    index.close()  # the graph holds none of the staged chunks; the log keeps them
    again = make(index.db)
    built(again, dataset)
    assert again.graphs.builds == 0  # loaded, and caught up from the log
    assert again.graphs.size(key) == 350
    assert again.graphs.staged(key) == 0
    for query in texts(33, 300)[:10]:
        as_exact(again, dataset, query)
    again.close()


def test_a_full_stage_goes_into_the_graph_even_on_a_busy_machine(setup) -> None:
    index, dataset = setup
    _first, later, key = on_a_busy_machine(index, dataset, 34)
    index.graphs.stage_max = 100
    write(index, dataset, later, 1, texts(35, 300))
    deadline = time.monotonic() + 30
    while index.graphs.size(key) < 250:
        assert time.monotonic() < deadline
        index.graphs.want(key)
        time.sleep(0.05)
    assert index.graphs.staged(key) == 100  # what the stage holds at most stays on it
    assert index.graphs.size(key) == 250
    for query in texts(35, 300)[:10]:
        as_exact(index, dataset, query)


def test_chunks_taken_in_after_a_snapshot_get_one_of_their_own(setup) -> None:
    """A snapshot taken while chunks wait on the stage holds the graph without them; once the
    graph takes them in, closing snapshots it again (under a new name) and prunes their log
    rows, so the next start has nothing to take in again."""
    index, dataset = setup
    _first, later, key = on_a_busy_machine(index, dataset, 36)
    write(index, dataset, later, 1, texts(37, 200))
    staged_all(index, key, 200)
    graph = index.graphs._graphs[key]
    index.graphs.stop()  # only the graphs' thread changes a graph: stopped, this one may save
    index.graphs._save(graph)  # what a due snapshot does meanwhile
    saved = graph.snapshot
    index.graphs.want(key)
    assert index.graphs.caught_up(timeout=30)  # the stage goes into the graph
    assert graph.changes == 200
    index.close()
    assert graph.snapshot is not None
    assert saved is not None
    assert graph.snapshot > saved
    folder = graph_folder(index.db)
    assert folder is not None
    assert len(list(folder.iterdir())) == 1  # the older snapshot swept
    with index.db.read() as conn:
        assert conn.exec_driver_sql(f"SELECT count(*) FROM {index.log}").scalar() == 0
    again = make(index.db)
    built(again, dataset)
    assert again.graphs.builds == 0
    assert again.graphs.size(key) == 250
    again.close()
