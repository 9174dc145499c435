"""The scale-out search's counts, kept for a moment (pg_counts.py), on a real PostgreSQL: kept
while fresh, taken again after, never kept when a filter admits nothing, and one filter's count
never answers for another's."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from knowledgeops.db.engine import Database
from knowledgeops.db.schema import documents
from knowledgeops.ingest.index.filters import SearchFilter
from knowledgeops.ingest.index.pg_counts import KeptCounts
from tests.fixtures.rows import insert_dataset, insert_document

pytestmark = pytest.mark.postgres


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def searchable(db: Database, dataset: str, chunks: int, **meta: object) -> str:
    """A document of `chunks` chunks whose first generation is active."""
    with db.write() as tx:
        document = insert_document(tx, dataset, meta=dict(meta))
        tx.execute(
            update(documents)
            .where(documents.c.id == document)
            .values(active_generation=1, chunk_count=chunks)
        )
    return document


def of(kept: KeptCounts, db: Database, dataset: str, where: SearchFilter | None = None):
    with db.read() as conn:
        return kept.of(conn, dataset, where)


def shelf(*values: object) -> SearchFilter:
    return SearchFilter(metadata=(("shelf", tuple(values)),))  # type: ignore[arg-type]


def test_a_count_is_kept_while_fresh_and_taken_again_after(postgres_db: Database) -> None:
    clock = Clock()
    kept = KeptCounts(kept_s=2.0, clock=clock)
    with postgres_db.write() as tx:
        dataset = insert_dataset(tx)
    searchable(postgres_db, dataset, 30, shelf=1)
    searchable(postgres_db, dataset, 10, shelf=2)
    assert of(kept, postgres_db, dataset) == (40, 40)
    assert of(kept, postgres_db, dataset, shelf(1)) == (30, 40)

    searchable(postgres_db, dataset, 5, shelf=1)
    clock.now += 1.9
    assert of(kept, postgres_db, dataset) == (40, 40)  # kept: the walk's breadth, not an answer
    assert of(kept, postgres_db, dataset, shelf(1)) == (30, 40)
    clock.now += 0.2
    assert of(kept, postgres_db, dataset) == (45, 45)
    assert of(kept, postgres_db, dataset, shelf(1)) == (35, 45)


def test_a_filter_that_admitted_nothing_is_counted_again_at_once(postgres_db: Database) -> None:
    """A search whose filter admits nothing answers at once with no hits: that count decides
    an answer, so a document made searchable a moment later must be found by the next search."""
    clock = Clock()
    kept = KeptCounts(kept_s=60.0, clock=clock)
    with postgres_db.write() as tx:
        dataset, empty = insert_dataset(tx), insert_dataset(tx)
    searchable(postgres_db, dataset, 20, shelf=1)
    assert of(kept, postgres_db, dataset, shelf(3)) == (0, 20)
    assert of(kept, postgres_db, empty) == (0, 0)
    searchable(postgres_db, dataset, 7, shelf=3)
    searchable(postgres_db, empty, 4)
    assert of(kept, postgres_db, dataset, shelf(3)) == (7, 27)
    assert of(kept, postgres_db, empty) == (4, 4)


def test_each_dataset_and_filter_has_its_own_count(postgres_db: Database) -> None:
    kept = KeptCounts(kept_s=60.0, clock=Clock())
    with postgres_db.write() as tx:
        first, second = insert_dataset(tx), insert_dataset(tx)
    searchable(postgres_db, first, 12, shelf=1)
    searchable(postgres_db, first, 8, shelf=True)
    searchable(postgres_db, second, 3, shelf=1)
    # 1 and True are one key to a Python dict, two values to JSON (and to the filter)
    assert of(kept, postgres_db, first, shelf(1)) == (12, 20)
    assert of(kept, postgres_db, first, shelf(True)) == (8, 20)
    assert of(kept, postgres_db, first, shelf(1, True)) == (20, 20)
    assert of(kept, postgres_db, second, shelf(1)) == (3, 3)
    assert of(kept, postgres_db, first, SearchFilter(content_types=("text/html",))) == (0, 20)
