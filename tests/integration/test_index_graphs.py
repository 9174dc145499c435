"""The embedded index's side indexes of vectors (ingest/index/graphs.py: inverted lists, lists.py)
against a real SQLite database: a search never answers from a generation, document or dataset the
database dropped, finds a document the moment it is activated, lists a dataset has outgrown are
trained again, and the snapshots beside the database survive a kill -9 (a torn or missing file
is rebuilt from the database, an older one is caught up from the log).

Most tests here are about consistency, not recall: their datasets are under PROBE_MIN_VECTORS,
so every list is scanned (the int8 codes then rank candidates that are scored exactly, and a
search is exact), and their fixture trains lists again only where a test says so. Recall at
the shares chosen is tests/unit/test_lists.py's."""

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
from sqlalchemy import event

from knowledgeops.db.engine import Database
from knowledgeops.ingest.index import graphs, lists
from knowledgeops.ingest.index.base import IndexedChunk, chunk_id, text_hash
from knowledgeops.ingest.index.filters import SearchFilter
from knowledgeops.ingest.index.keys import dataset_key
from knowledgeops.ingest.index.lists import Lists
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


@pytest.fixture
def setup(sqlite_db: Database, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(lists, "REGROW", 10**9)
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


def test_a_fused_list_scans_fewer_lists_and_leaves_other_searches_as_they_were(
    setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hybrid search's vector list scans a smaller share of the lists (PROBE_SHARE_FUSED),
    given to each search: every other search still scans its own share."""
    index, dataset = setup
    with index.db.write() as conn:
        document = insert_document(conn, dataset)
    write(index, dataset, document, 1, texts(1, 300))
    built(index, dataset)
    monkeypatch.setattr(lists, "PROBE_SHARE_FUSED", 0.0)  # one list, the question's nearest
    monkeypatch.setattr(lists, "PROBE_MIN_VECTORS", 0)  # (a dataset this small is scanned whole)
    monkeypatch.setattr(lists, "PROBE_SHARE", 1.0)  # a vector search: every list
    graph = index.graphs._graphs[dataset_key(dataset)]
    live = {chunk_id(document, 1, n) for n in range(300)}
    narrower = 0
    for query in texts(2, 20):
        vector = EMBED.vector(query)
        fused = index.search_vector(dataset, vector, 5, fused=True)
        assert len(fused) == 5
        assert {h.chunk_id for h in fused} <= live
        assert len(graph.index.search(vector, 300, 0.0)) < 300  # one list holds fewer
        narrower += fused != index.search_vector(dataset, vector, 5)
        as_exact(index, dataset, query)
    assert narrower > 0  # one list of 16 misses some of the best


def test_a_snapshot_of_an_earlier_version_is_rebuilt_from_the_database(setup) -> None:
    """A snapshot file without SNAPSHOT_SUFFIX is an HNSW graph an earlier version saved: the
    start builds lists from the database, saves them, and sweeps the old file."""
    index, dataset = setup
    with index.db.write() as conn:
        document = insert_document(conn, dataset)
    write(index, dataset, document, 1, texts(5, 200))
    built(index, dataset)
    index.close()
    folder = graph_folder(index.db)
    assert folder is not None
    (snapshot,) = folder.iterdir()
    older = snapshot.with_name(f"{dataset_key(dataset)}-1-1.linked.usearch")
    snapshot.rename(older)
    with index.db.write() as tx:
        tx.exec_driver_sql(f"UPDATE {index.graphs.snapshots} SET file = ?", (older.name,))
    again = make(index.db)
    built(again, dataset)
    assert again.graphs.builds == 1
    assert again.graphs.size(dataset_key(dataset)) == 200
    for query in texts(6, 10):
        as_exact(again, dataset, query)
    again.close()
    (saved,) = folder.iterdir()
    assert saved.name.endswith(graphs.SNAPSHOT_SUFFIX)


@pytest.mark.parametrize("retrain", [False, True])
def test_lists_stopped_before_they_are_whole_are_neither_kept_nor_saved(
    setup, monkeypatch: pytest.MonkeyPatch, retrain: bool
) -> None:
    """The index closed while lists are built, first or again for a dataset that outgrew them:
    the half-made lists answer no search and are not saved (their snapshot row would claim the
    whole log); a first build is made again at the next start, and lists being trained again
    leave the old ones in place, saved as they were."""
    index, dataset = setup
    with index.db.write() as conn:
        document = insert_document(conn, dataset)
    write(index, dataset, document, 1, texts(13, 200))
    key = dataset_key(dataset)
    folder = graph_folder(index.db)
    assert folder is not None
    if retrain:
        built(index, dataset)
        index.graphs.stop()
        index.graphs._save(index.graphs._graphs[key])
        older = index.graphs._graphs[key]
        monkeypatch.setattr(lists, "REGROW", 1)  # the lists are due to be trained again
    fetch = graphs.Graphs._vectors

    def closed_meanwhile(keeper: graphs.Graphs, conn, seqs):
        keeper._stop.set()  # what close() does, arriving while the lists are built
        return fetch(keeper, conn, seqs)

    monkeypatch.setattr(graphs.Graphs, "_vectors", closed_meanwhile)
    index.graphs.want(key)
    deadline = time.monotonic() + 30
    while index.graphs._thread is not None and index.graphs._thread.is_alive():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert index.graphs.builds == (1 if retrain else 0)
    assert index.graphs.retrained == 0
    if retrain:
        assert index.graphs._graphs[key] is older  # the old lists still answer
    else:
        assert not index.graphs.ready(key)
    index.graphs.stop()
    files = sorted(path.name for path in folder.iterdir()) if folder.is_dir() else []
    with index.db.read() as conn:
        rows = conn.exec_driver_sql(f"SELECT file FROM {index.graphs.snapshots}").all()
    assert [row[0] for row in rows] == files
    assert len(files) == (1 if retrain else 0)
    monkeypatch.setattr(graphs.Graphs, "_vectors", fetch)
    monkeypatch.setattr(lists, "REGROW", 10**9)
    again = make(index.db)
    built(again, dataset)
    assert again.graphs.builds == (0 if retrain else 1)
    assert again.graphs.size(key) == 200
    for query in texts(14, 10):
        as_exact(again, dataset, query)
    again.close()


def test_lists_a_dataset_has_outgrown_are_trained_again_from_the_database(
    setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lists trained for 100 chunks serve the dataset as it grows; once they hold REGROW times
    that, new ones are trained on a sample of the database and take the old ones' place, with
    as many lists as the size asks for, every chunk in them once, and the searches exact."""
    index, dataset = setup
    monkeypatch.setattr(lists, "REGROW", 4)
    with index.db.write() as conn:
        first, later = insert_document(conn, dataset), insert_document(conn, dataset)
    write(index, dataset, first, 1, texts(40, 100))
    built(index, dataset)
    key = dataset_key(dataset)
    old = index.graphs._graphs[key]
    assert (old.index.trained_for, old.index.lists) == (100, lists.lists_for(100))
    write(index, dataset, later, 1, texts(41, 500))
    deadline = time.monotonic() + 30
    while index.graphs.retrained < 1:  # the stage taken in, whatever the machine's load
        assert time.monotonic() < deadline
        index.graphs.caught_up(timeout=1)
    assert index.graphs.caught_up(timeout=30)
    fresh = index.graphs._graphs[key]
    assert fresh is not old
    assert index.graphs.builds == 2
    assert (fresh.index.trained_for, fresh.index.lists) == (600, lists.lists_for(600))
    assert fresh.index.lists > old.index.lists
    assert index.graphs.size(key) == 600
    for query in texts(41, 500)[:10] + texts(42, 10):
        as_exact(index, dataset, query)
    index.close()  # saved with the size it was trained for, which a start reads back
    again = make(index.db)
    built(again, dataset)
    assert again.graphs.builds == 0
    assert again.graphs._graphs[key].index.trained_for == 600
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


def test_a_search_takes_every_core_only_through_built_lists(
    setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`scans_every_core`, which orders a hybrid search's two lists (the words first where it
    is true): true for a dataset whose search scans its lists, false where it is scored exactly
    in SQLite on one core (lists not built yet, too few chunks, a filter admitting too few) or
    the scan has one thread."""
    index, dataset = setup
    monkeypatch.setattr(lists, "SEARCH_THREADS", 2)
    with index.db.write() as conn:
        documents = [insert_document(conn, dataset, meta={"n": n}) for n in range(2)]
    write(index, dataset, documents[0], 1, texts(1, 300))
    write(index, dataset, documents[1], 1, texts(2, 5))
    assert not index.graphs.ready(dataset_key(dataset))
    assert not index.scans_every_core(dataset)
    built(index, dataset)
    assert index.scans_every_core(dataset)
    index.graph_min_chunks = 100
    assert index.scans_every_core(dataset, SearchFilter(metadata=(("n", (0,)),)))
    assert not index.scans_every_core(dataset, SearchFilter(metadata=(("n", (1,)),)))
    index.graph_min_chunks = 1000
    assert not index.scans_every_core(dataset)
    index.graph_min_chunks = 1
    monkeypatch.setattr(lists, "SEARCH_THREADS", 1)
    assert not index.scans_every_core(dataset)


def test_a_filter_that_passes_too_few_candidates_asks_the_lists_again_not_exact(
    setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The share a filter admits over the dataset need not hold near the question: when too
    few of the first candidates pass, the lists are asked for CANDIDATES_WIDEN times as many,
    and the search answers exact's hits from them, without the exact scan of every chunk the
    filter admits (which a million chunks makes take seconds)."""
    index, dataset = setup
    index.filter_bitmaps = False  # the filter's bitmap would leave only admitted candidates
    monkeypatch.setattr(graphs, "CANDIDATES_MIN", 1)
    monkeypatch.setattr(graphs, "CANDIDATES_PER_K", 1)  # k 5, half admitted: 10, then 40
    with index.db.write() as conn:
        documents = [insert_document(conn, dataset, meta={"shelf": n % 2}) for n in range(10)]
    for n, document in enumerate(documents):
        write(index, dataset, document, 1, texts(50 + n, 30))
    built(index, dataset)
    where = SearchFilter(metadata=(("shelf", (0,)),))
    asked: list[int] = []
    nearest = index.graphs.nearest

    def recorded(conn, key, vector, want, share=lists.PROBE_SHARE, selector=None):
        asked.append(want)
        return nearest(conn, key, vector, want, share, selector)

    exact_scans: list[str] = []

    def seen(conn, cursor, statement, parameters, context, executemany) -> None:
        if "FROM documents d JOIN chunks c" in statement:
            exact_scans.append(statement)

    monkeypatch.setattr(index.graphs, "nearest", recorded)
    event.listen(index.db.engine, "after_cursor_execute", seen)
    try:
        for query in texts(60, 20):
            vector = EMBED.vector(query)
            hits = index.search_vector(dataset, vector, 5, where)
            with index.db.read() as conn:
                best = index._exact(conn, dataset, vector, 5, where)
            assert [round(h.score, 5) for h in hits] == [round(h.score, 5) for h in best]
    finally:
        event.remove(index.db.engine, "after_cursor_execute", seen)
    assert set(asked) == {10, 40}  # some first asks left fewer than 5 on shelf 0
    assert len(exact_scans) == 20  # the test's own, none of the search's


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
    index.close()
    write(index, dataset, later, 1, texts(8, 30))  # after the snapshot: only in the log
    again = make(index.db)
    built(again, dataset)
    assert again.graphs.builds == 0  # loaded
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


def test_the_log_is_pruned_a_batch_a_write(setup, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a bulk write the prune deletes the log PRUNE_BATCH rows a write, not in one
    transaction that holds the write lock while it deletes a million rows; all go still."""
    index, dataset = setup
    monkeypatch.setattr(graphs, "PRUNE_BATCH", 7)
    with index.db.write() as conn:
        small = insert_dataset(conn, str(uuid.uuid4()))
        documents = [insert_document(conn, small) for _ in range(3)]
        big_document = insert_document(conn, dataset)
    for n, document in enumerate(documents):
        write(index, small, document, 1, texts(30 + n, 10))
    write(index, dataset, big_document, 1, texts(33, 10))  # no graph wants either dataset
    with index.db.read() as conn:
        logged = conn.exec_driver_sql(f"SELECT count(*) FROM {index.log}").scalar()
    deletes: list[int] = []

    def counted(conn, cursor, statement, parameters, context, executemany) -> None:
        if statement.startswith(f"DELETE FROM {index.log}"):
            deletes.append(cursor.rowcount)

    event.listen(index.db.engine, "after_cursor_execute", counted)
    try:
        index.graphs._prune()
    finally:
        event.remove(index.db.engine, "after_cursor_execute", counted)
    with index.db.read() as conn:
        left = conn.exec_driver_sql(f"SELECT count(*) FROM {index.log}").scalar()
    assert logged >= 4 * 10
    assert left == 0
    assert sum(deletes) == logged
    assert max(deletes) == 7
    assert len(deletes) >= logged // 7


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


def test_lists_trained_again_on_their_own_thread_leave_every_dataset_kept_meanwhile(
    setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a dataset's new lists are trained (held here), its old lists and another
    dataset's keep taking in what is written; the new ones then take the old ones' place and
    catch up from their build, every chunk in them once."""
    index, dataset = setup
    monkeypatch.setattr(lists, "REGROW", 4)
    with index.db.write() as conn:
        other = insert_dataset(conn)
        first, later, last = (insert_document(conn, dataset) for _ in range(3))
        elsewhere = insert_document(conn, other)
    write(index, dataset, first, 1, texts(50, 100))
    write(index, other, elsewhere, 1, texts(51, 50))
    built(index, dataset)
    built(index, other)
    key = dataset_key(dataset)
    old = index.graphs._graphs[key]
    release = threading.Event()
    training = threading.Event()
    trained = Lists.trained

    def held(sample, planned):
        if threading.current_thread().name.startswith("kops-lists-"):
            training.set()
            assert release.wait(timeout=30)
        return trained(sample, planned)

    monkeypatch.setattr(Lists, "trained", held)
    write(index, dataset, later, 1, texts(52, 400))  # 500: four times what it was trained for
    assert index.graphs.caught_up(timeout=30)
    assert training.wait(timeout=30)
    write(index, dataset, last, 1, texts(53, 30))  # while the new lists are trained
    write(index, other, elsewhere, 2, texts(54, 60))
    assert index.graphs.caught_up(timeout=30)  # the old lists and the other dataset's
    assert index.graphs._graphs[key] is old
    assert index.graphs.size(key) == 530
    assert index.graphs.size(dataset_key(other)) == 60
    release.set()
    deadline = time.monotonic() + 30
    while index.graphs.retrained < 1:
        assert time.monotonic() < deadline
        index.graphs.caught_up(timeout=1)
    assert index.graphs.caught_up(timeout=30)
    fresh = index.graphs._graphs[key]
    assert fresh is not old
    assert index.graphs.size(key) == 530
    for query in texts(53, 30)[:10] + texts(52, 400)[:10]:
        as_exact(index, dataset, query)
