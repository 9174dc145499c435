"""The scale-out keyword index (Tantivy beside PostgreSQL, ingest/index/pg_changes.py) against a
real PostgreSQL with pgvector and a real Tantivy index on disk: searches answer from it, a chunk
activated a moment ago is found before it holds it and nothing the database dropped answers, a
transaction that commits after a later one is applied all the same, a restart opens the saved
index and catches up, and an index the log was pruned past, or made for another database, or
damaged, is built again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import text

from knowledgeops.db.engine import Database
from knowledgeops.ingest.index import keywords as keywords_module
from knowledgeops.ingest.index import pg_changes
from knowledgeops.ingest.index.filters import SearchFilter
from knowledgeops.ingest.index.pgvector import PgVectorIndex
from tests.fixtures.rows import insert_dataset, insert_document
from tests.integration.test_index_graphs import EMBED, chunks, write
from tests.integration.test_index_keywords import texts

pytestmark = pytest.mark.postgres


def make(db: Database, folder: Path) -> PgVectorIndex:
    index = PgVectorIndex(db, EMBED.dimension, keyword_folder=folder, keyword_min_chunks=0)
    index.ensure()
    return index


def kept(index: PgVectorIndex) -> None:
    """The keyword index built and holding the whole log."""
    keywords = index.keywords
    assert keywords is not None
    keywords.want()
    assert keywords.caught_up(timeout=60)


def without_gin(index: PgVectorIndex) -> None:
    """Empty every chunk's tsvector: whatever a keyword search finds now, Tantivy found."""
    with index.db.write() as tx:
        tx.exec_driver_sql(f"UPDATE {index.table} SET {index.words} = ''::tsvector")


def found(index: PgVectorIndex, dataset: str, query: str, k: int = 5, where=None) -> list[str]:
    return [hit.text for hit in index.search_keyword(dataset, query, k, where)]


def documents(db: Database, dataset: str, count: int) -> list[str]:
    with db.write() as conn:
        return [insert_document(conn, dataset) for _ in range(count)]


@pytest.fixture
def setup(pgvector_db: Database, tmp_path: Path) -> Iterator[tuple[PgVectorIndex, str]]:
    index = make(pgvector_db, tmp_path / "keywords")
    with pgvector_db.write() as conn:
        dataset = insert_dataset(conn)
    yield index, dataset
    index.close()


def test_searches_answer_from_tantivy_within_their_dataset(setup) -> None:
    index, dataset = setup
    with index.db.write() as conn:
        other = insert_dataset(conn, str(uuid.uuid4()))
        document = insert_document(conn, dataset)
        elsewhere = insert_document(conn, other)
    write(index, dataset, document, 1, [*texts(1, 200), "the okapi grazes at dawn"])
    write(index, other, elsewhere, 1, ["the okapi sleeps at noon"] * 20)
    kept(index)
    without_gin(index)
    assert found(index, dataset, "okapi dawn") == ["the okapi grazes at dawn"]
    assert found(index, other, "okapi grazes", k=3) == ["the okapi sleeps at noon"] * 3
    assert found(index, dataset, "tapir") == []
    keywords = index.keywords
    assert keywords is not None
    assert keywords.builds == 1


def test_a_chunk_is_found_before_the_index_holds_it_and_a_dropped_one_never(setup) -> None:
    index, dataset = setup
    document, other = documents(index.db, dataset, 2)
    write(index, dataset, document, 1, [*texts(2, 100), "a heron waits in the reeds"])
    write(index, dataset, other, 1, ["the heron flies over the reeds"])
    kept(index)
    keywords = index.keywords
    assert keywords is not None
    keywords.close()  # the thread stops: the index stays as it is
    without_gin(index)
    write(index, dataset, document, 2, ["a heron fishes at dusk", *texts(3, 50)])  # replaces 1
    with index.db.write() as tx:
        index.delete_document(tx, other)
    pending = found(index, dataset, "heron reeds dusk")
    assert pending == ["a heron fishes at dusk"]  # generation 2 at once; 1 and the deleted gone
    without_gin(index)
    kept(index)  # the thread again: the index applies the log
    assert found(index, dataset, "heron reeds dusk") == pending
    view = keywords._view
    assert view is not None
    assert view.searcher.num_docs == 51  # generation 1 and the deleted document are gone


def test_a_transaction_that_commits_after_a_later_one_is_applied(setup) -> None:
    """Transaction A logs its chunk first and commits last; B commits in between and the index
    applies what is final. A row below the oldest running transaction is never passed over:
    once A commits, its chunk is in the index too (found with the GIN index emptied)."""
    index, dataset = setup
    first, second = documents(index.db, dataset, 2)
    write(index, dataset, first, 1, texts(4, 30))
    kept(index)
    logged, release = threading.Event(), threading.Event()

    def slow() -> None:
        with index.db.write() as tx:
            index.upsert(tx, chunks(dataset, first, 2, ["the slow loris climbs"]))
            index.activate(tx, first, 2)  # its log row takes A's transaction id now
            logged.set()
            release.wait(30)

    writer = threading.Thread(target=slow)
    writer.start()
    assert logged.wait(30)
    write(index, dataset, second, 1, ["the quick hare runs"])  # B commits first
    keywords = index.keywords
    assert keywords is not None
    keywords.close()
    keywords._apply()  # what its thread would do now (apply only what is final: not B yet)
    assert found(index, dataset, "hare") == ["the quick hare runs"]  # pending: B is visible
    release.set()
    writer.join(30)
    kept(index)
    without_gin(index)
    assert found(index, dataset, "loris") == ["the slow loris climbs"]
    assert found(index, dataset, "hare") == ["the quick hare runs"]
    view = keywords._view
    assert view is not None
    assert view.searcher.num_docs == 2  # A's generation 2 replaced its 30 chunks


def test_a_filter_that_admits_few_chunks_still_fills_top_k(setup) -> None:
    index, dataset = setup
    with index.db.write() as conn:
        made = [insert_document(conn, dataset, meta={"n": n}) for n in range(8)]
    for n, document in enumerate(made):
        write(index, dataset, document, 1, [f"marmot {body}" for body in texts(10 + n, 60)])
    kept(index)
    without_gin(index)
    hits = index.search_keyword(dataset, "marmot w7", 10, SearchFilter(metadata=(("n", (5,)),)))
    assert len(hits) == 10
    assert {hit.document_id for hit in hits} == {made[5]}


def test_a_restart_opens_the_saved_index_and_catches_up(setup, tmp_path: Path) -> None:
    index, dataset = setup
    document, later = documents(index.db, dataset, 2)
    write(index, dataset, document, 1, ["the ibis wades", *texts(5, 80)])
    kept(index)
    index.close()
    writer = PgVectorIndex(index.db, EMBED.dimension)  # a worker: it logs, keeps no index
    write(writer, dataset, later, 1, ["the ibis sleeps standing"])
    again = make(index.db, tmp_path / "keywords")
    try:
        kept(again)
        keywords = again.keywords
        assert keywords is not None
        assert keywords.builds == 0  # opened, not rebuilt
        without_gin(again)
        assert set(found(again, dataset, "ibis")) == {"the ibis wades", "the ibis sleeps standing"}
    finally:
        again.close()


def test_two_processes_keep_an_index_each(setup, tmp_path: Path) -> None:
    index, dataset = setup
    (document,) = documents(index.db, dataset, 1)
    write(index, dataset, document, 1, ["the tapir swims", *texts(6, 20)])
    other = make(index.db, tmp_path / "keywords")
    try:
        kept(index)
        kept(other)
        ours, theirs = index._slot, other._slot
        assert ours is not None
        assert theirs is not None
        assert ours.folder != theirs.folder
        without_gin(index)
        assert (
            found(other, dataset, "tapir") == found(index, dataset, "tapir") == ["the tapir swims"]
        )
    finally:
        other.close()


@pytest.mark.parametrize(
    "reason", ["pruned", "another database", "damaged", "unsaved", "older terms"]
)
def test_an_index_that_cannot_be_trusted_is_built_again(setup, tmp_path: Path, reason: str) -> None:
    index, dataset = setup
    first, later = documents(index.db, dataset, 2)
    write(index, dataset, first, 1, ["the civet climbs", *texts(7, 40)])
    kept(index)
    index.close()
    slot = tmp_path / "keywords" / "slot-0"
    write(PgVectorIndex(index.db, EMBED.dimension), dataset, later, 1, ["the civet naps"])
    if reason == "pruned":  # the rows after the saved position are gone
        assert pg_changes.Pruner(index.db, index.table).prune(older_than_s=0) > 0
    elif reason == "another database":
        with index.db.write() as tx:
            tx.exec_driver_sql(f"UPDATE {index.table}_log_origin SET origin = gen_random_uuid()")
    elif reason == "damaged":
        (slot / "index" / "meta.json").write_text("{ torn")
    elif reason == "older terms":  # made before the terms or their shards changed
        state = json.loads((slot / pg_changes.STATE_FILE).read_text("utf-8"))
        assert state["terms"] == keywords_module.terms_version()
        state["terms"] = "t2k2"
        (slot / pg_changes.STATE_FILE).write_text(json.dumps(state), "utf-8")
    else:  # killed during a build: the state is written only after the build's commit
        (slot / pg_changes.STATE_FILE).unlink()
    again = make(index.db, tmp_path / "keywords")
    try:
        kept(again)
        keywords = again.keywords
        assert keywords is not None
        assert keywords.builds == 1
        without_gin(again)
        assert set(found(again, dataset, "civet")) == {"the civet climbs", "the civet naps"}
    finally:
        again.close()


def test_an_index_the_log_was_pruned_past_while_it_ran_is_built_again(setup) -> None:
    index, dataset = setup
    first, later = documents(index.db, dataset, 2)
    write(index, dataset, first, 1, ["the quoll hunts", *texts(12, 20)])
    kept(index)
    keywords = index.keywords
    assert keywords is not None
    keywords.close()  # its thread stops (a process stalled for longer than the log is kept)
    write(index, dataset, later, 1, ["the quoll sleeps"])
    assert pg_changes.Pruner(index.db, index.table).prune(older_than_s=0) > 0
    kept(index)
    assert keywords.builds == 2
    without_gin(index)
    assert set(found(index, dataset, "quoll")) == {"the quoll hunts", "the quoll sleeps"}


WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from knowledgeops.db.engine import Database
    from knowledgeops.ingest.index import keywords
    from tests.integration.test_pg_keywords import documents, make, texts, write
    keywords.COMMIT_EVERY_S = 0.0  # a commit (and its state) after every change
    db = Database(sys.argv[1])
    index = make(db, Path(sys.argv[3]))
    dataset = sys.argv[2]
    index.keywords.want()
    n = 0
    while True:
        (document,) = documents(db, dataset, 1)
        write(index, dataset, document, 1, texts(100 + n, 40))
        index.keywords.want()
        print(n, flush=True)
        n += 1
    """
)


def test_kill_9_while_the_index_is_kept_loses_nothing(setup, tmp_path: Path) -> None:
    """A process killed (SIGKILL) while it builds, applies and commits its keyword index: the
    next process takes the slot, opens what was committed (or builds again) and catches up,
    every active chunk in it once."""
    index, dataset = setup
    index.close()
    folder = tmp_path / "keywords"
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, index.db.url, dataset, str(folder)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert child.stdout is not None
    try:
        for _ in range(12):  # some rounds written and applied, then killed mid-way
            assert child.stdout.readline(), "the writer died"
        time.sleep(float(np.random.default_rng().random() * 0.05))
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    again = make(index.db, folder)
    try:
        kept(again)
        with again.db.read() as conn:
            active = conn.execute(
                text(
                    "SELECT count(*) FROM chunks c JOIN documents d ON d.id = c.document_id "
                    "AND d.active_generation = c.generation"
                )
            ).scalar_one()
        keywords = again.keywords
        assert keywords is not None
        view = keywords._view
        assert view is not None
        assert active >= 12 * 40
        assert view.searcher.num_docs == active
        gin = PgVectorIndex(again.db, EMBED.dimension)  # the database's own answer
        for query in ("w7 w8", "w42", "w3"):
            matches = set(found(gin, dataset, query, k=5000))
            assert matches
            assert set(found(again, dataset, query, k=5000)) == matches
    finally:
        again.close()


def test_pruning_keeps_recent_rows_and_marks_how_far_it_went(setup) -> None:
    index, dataset = setup
    (document,) = documents(index.db, dataset, 1)
    write(index, dataset, document, 1, texts(8, 10))
    pruner = pg_changes.Pruner(index.db, index.table)
    assert pruner.prune() == 0  # a day's rows are kept
    with index.db.read() as conn:
        last = conn.execute(text(f"SELECT max(id) FROM {index.log}")).scalar_one()
    assert pruner.prune(older_than_s=0) == 10
    with index.db.read() as conn:
        left = conn.execute(text(f"SELECT count(*) FROM {index.log}")).scalar_one()
        mark = conn.execute(text(f"SELECT pruned_id FROM {index.log}_origin")).scalar_one()
    assert left == 0
    assert mark == last


def test_a_deleted_dataset_answers_nothing(setup) -> None:
    index, dataset = setup
    (document,) = documents(index.db, dataset, 1)
    write(index, dataset, document, 1, ["the lynx hunts in snow", *texts(9, 30)])
    kept(index)
    with index.db.write() as tx:
        index.delete_dataset(tx, dataset)
    assert found(index, dataset, "lynx snow") == []
    kept(index)
    keywords = index.keywords
    assert keywords is not None
    view = keywords._view
    assert view is not None
    assert view.searcher.num_docs == 0
