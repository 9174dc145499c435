"""The counts every embedded search takes (ingest/index/counts.py), against a real SQLite file:
kept between two commits, taken again after any commit (of this process, another connection or
another process), so a search never decides from a count the database no longer holds."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, insert, update

from knowledgeops.db.engine import Database
from knowledgeops.db.schema import documents
from knowledgeops.ingest.index.filters import SearchFilter
from knowledgeops.ingest.index.sqlite import SqliteIndex
from tests.fixtures.rows import insert_dataset, insert_document
from tests.integration.test_index_graphs import EMBED, make, texts, write

SHELF_A = SearchFilter(metadata=(("shelf", ("a",)),))


@pytest.fixture
def counted(sqlite_db: Database) -> Iterator[tuple[SqliteIndex, list[str]]]:
    """An index and the count statements it sends to the database."""
    index = make(sqlite_db)
    sent: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if "sum(d.chunk_count)" in statement:
            sent.append(statement)

    event.listen(sqlite_db.engine, "before_cursor_execute", seen)
    yield index, sent
    index.close()


def document(index: SqliteIndex, dataset: str, shelf: str, chunks: int) -> str:
    with index.db.write() as tx:
        doc = insert_document(tx, dataset, meta={"shelf": shelf})
    write(index, dataset, doc, 1, texts(hash(doc) % 1000, chunks))
    return doc


def new_dataset(db: Database) -> str:
    with db.write() as tx:
        return insert_dataset(tx)


def test_counts_are_kept_until_something_commits(counted: tuple[SqliteIndex, list[str]]) -> None:
    index, sent = counted
    dataset = new_dataset(index.db)
    document(index, dataset, "a", 3)
    document(index, dataset, "b", 5)

    assert index.counts.of(dataset, SHELF_A) == (3, 8)
    assert index.counts.of(dataset, None) == (8, 8)
    assert len(sent) == 2
    # nothing committed since: the same answers, from what was kept
    assert index.counts.of(dataset, SHELF_A) == (3, 8)
    assert index.counts.of(dataset, None) == (8, 8)
    assert len(sent) == 2

    document(index, dataset, "a", 4)  # a commit through the index's own database
    assert index.counts.of(dataset, SHELF_A) == (7, 12)
    assert len(sent) == 3

    other = Database(index.db.url)  # another connection pool on the same file
    try:
        with other.write() as tx:
            tx.execute(update(documents).values(meta={"shelf": "a"}))
    finally:
        other.dispose()
    assert index.counts.of(dataset, SHELF_A) == (12, 12)
    assert len(sent) == 4


def test_a_commit_by_another_process_is_seen(counted: tuple[SqliteIndex, list[str]]) -> None:
    index, _sent = counted
    dataset = new_dataset(index.db)
    document(index, dataset, "a", 3)
    assert index.counts.of(dataset, SHELF_A) == (3, 3)
    path = index.db.engine.url.database
    script = textwrap.dedent(
        f"""
        import sqlean
        conn = sqlean.connect({path!r}, isolation_level=None)
        conn.execute("UPDATE documents SET meta = json_object('shelf', 'b')")
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert index.counts.of(dataset, SHELF_A) == (0, 3)


def test_a_search_finds_a_document_activated_after_its_dataset_was_counted_empty(
    counted: tuple[SqliteIndex, list[str]],
) -> None:
    """A count of 0 answers a search at once with nothing: it must not outlive the commit that
    makes the first document searchable, whether the filter admits it or not."""
    index, _sent = counted
    dataset = new_dataset(index.db)
    assert index.search_vector(dataset, EMBED.vector("w1 w2"), 5, SHELF_A) == []
    assert index.search_keyword(dataset, "w1", 5, SHELF_A) == []
    doc = document(index, dataset, "a", 2)
    found = index.search_vector(dataset, EMBED.vector("w1 w2"), 5, SHELF_A)
    assert {hit.document_id for hit in found} == {doc}
    assert len(found) == 2
    # a document added by a plain insert and activated without the index (no index write at all)
    with index.db.write() as tx:
        tx.execute(
            insert(documents).values(
                id=str(uuid.uuid4()),
                dataset_id=dataset,
                file_name="b.txt",
                file_size=1,
                content_type="text/plain",
                sha256="b",
                blob_key="b",
                meta={"shelf": "a"},
                active_generation=1,
                chunk_count=9,
            )
        )
    assert index.counts.of(dataset, SHELF_A) == (11, 11)


def test_a_watch_that_fails_costs_a_count_not_a_search(
    counted: tuple[SqliteIndex, list[str]],
) -> None:
    """The watching connection broken under it (closed here): the search counts afresh and the
    next one watches again."""
    index, sent = counted
    dataset = new_dataset(index.db)
    document(index, dataset, "a", 3)
    assert index.counts.of(dataset, SHELF_A) == (3, 3)
    assert index.counts._watch is not None
    index.counts._watch.close()
    assert index.counts.of(dataset, SHELF_A) == (3, 3)  # counted: nothing could be trusted
    assert len(sent) == 2
    assert index.counts.of(dataset, SHELF_A) == (3, 3)  # watched again, and kept
    assert index.counts.of(dataset, SHELF_A) == (3, 3)
    assert len(sent) == 3
    assert len(index.search_vector(dataset, EMBED.vector("w1"), 5, SHELF_A)) == 3
