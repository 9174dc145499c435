"""A filter's bitmap of admitted chunks (ingest/index/admitted.py): the lists' scan of a
filtered search skips the chunks the filter does not admit, or scans them all and the bitmap
keeps the admitted candidates, each bitmap timing both ways and taking the faster; the bitmap
follows the documents made searchable after it was built, and one behind the pruned log is
built again; every answer is exact's, on a real SQLite database and real faiss lists."""

from __future__ import annotations

import time
from typing import Any

import pytest

from knowledgeops.db.engine import Database
from knowledgeops.ingest.index import admitted, graphs, lists
from knowledgeops.ingest.index.admitted import Way, WayChoice
from knowledgeops.ingest.index.base import chunk_id
from knowledgeops.ingest.index.filters import SearchFilter
from knowledgeops.ingest.index.keys import dataset_key
from knowledgeops.ingest.index.sqlite import SqliteIndex
from tests.fixtures.rows import insert_dataset, insert_document
from tests.integration.test_index_graphs import EMBED, built, make, texts, write

SHELF_0 = SearchFilter(metadata=(("shelf", (0,)),))


@pytest.fixture(params=[(Way.SKIP,), (Way.AFTER,), (Way.SKIP, Way.AFTER)], ids=str)
def shelved(sqlite_db: Database, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest):
    """A dataset of ten documents on two shelves, its lists built; the scans recorded; the
    bitmaps' ways fixed to one, or both to choose from."""
    monkeypatch.setattr(lists, "REGROW", 10**9)
    index = make(sqlite_db)
    index.admitted.ways = request.param
    with sqlite_db.write() as conn:
        dataset = insert_dataset(conn)
        documents = [insert_document(conn, dataset, meta={"shelf": n % 2}) for n in range(10)]
    for n, document in enumerate(documents):
        write(index, dataset, document, 1, texts(70 + n, 30))
    built(index, dataset)
    scans: list[tuple[int, Any]] = []
    nearest = index.graphs.nearest

    def recorded(conn, key, vector, want, share=lists.PROBE_SHARE, selector=None):
        scans.append((want, selector))
        return nearest(conn, key, vector, want, share, selector)

    monkeypatch.setattr(index.graphs, "nearest", recorded)
    yield index, dataset, scans
    index.close()


def scores(index: SqliteIndex, dataset: str, query: str, k: int = 5) -> tuple[list, list]:
    vector = EMBED.vector(query)
    hits = index.search_vector(dataset, vector, k, SHELF_0)
    with index.db.read() as conn:
        best = index._exact(conn, dataset, vector, k, SHELF_0)
    return [(h.chunk_id, round(h.score, 5)) for h in hits], [
        (h.chunk_id, round(h.score, 5)) for h in best
    ]


SKIPPING = (graphs.candidate_asks(5, 1.0)[0], True)  # an unfiltered search's number, a selector
AFTER = (graphs.candidate_asks(5, 0.5)[0], False)  # half admitted: twice as many, every code


def taken(scans: list[tuple[int, Any]]) -> list[tuple[int, bool]]:
    return [(want, selector is not None) for want, selector in scans]


def test_a_filtered_scan_uses_the_bitmap_its_way(shelved) -> None:
    index, dataset, scans = shelved
    found, best = scores(index, dataset, "the first search")
    assert found == best  # without the bitmap (it is being built): half admitted, twice asked
    assert scans[-1] == (graphs.candidate_asks(5, 0.5)[0], None)
    assert index.admitted.caught_up(timeout=30)
    assert index.admitted.builds == 1
    scans.clear()
    for query in texts(90, 20):
        found, best = scores(index, dataset, query)
        assert found == best
    ways = index.admitted.ways
    if ways == (Way.SKIP,):  # the admitted codes only, an unfiltered search's number
        assert set(taken(scans)) == {SKIPPING}
    elif ways == (Way.AFTER,):  # every code, as many more candidates as the filter drops
        assert set(taken(scans)) == {AFTER}
    else:  # each way timed TRIALS times first, then the faster: both were taken
        assert set(taken(scans)) == {SKIPPING, AFTER}
        assert taken(scans).count(SKIPPING) >= admitted.TRIALS
        assert taken(scans).count(AFTER) >= admitted.TRIALS
    assert sum(index.admitted.chosen.values()) == 20
    # the bitmap holds shelf 0's chunks and none of shelf 1's
    with index.db.read() as conn:
        shelf = dict(
            conn.exec_driver_sql(
                "SELECT c.seq, json_extract(d.meta, '$.shelf') FROM chunks c "
                "JOIN documents d ON d.id = c.document_id"
            ).all()
        )
        view = index.admitted.of(conn, dataset_key(dataset), dataset, SHELF_0, 0.5)
    assert view is not None
    on_shelf_0 = {seq for seq, on in shelf.items() if on == 0}
    assert {seq for seq in shelf if view.selector.is_member(seq)} == on_shelf_0
    assert view.admits(sorted(shelf)) == sorted(on_shelf_0)
    assert view.admits([max(shelf) + 10**6, -1]) == []  # past the bitmap's end: not admitted
    assert len(view.bits) > max(shelf) >> 3


def test_the_bitmap_follows_documents_made_searchable_after_it_was_built(shelved) -> None:
    index, dataset, scans = shelved
    scores(index, dataset, "build it")
    assert index.admitted.caught_up(timeout=30)
    with index.db.write() as conn:
        kept = insert_document(conn, dataset, meta={"shelf": 0})
        other = insert_document(conn, dataset, meta={"shelf": 1})
    body = "okapi heron lantern " * 4
    write(index, dataset, kept, 1, [body, *texts(95, 9)])
    write(index, dataset, other, 1, [body, *texts(96, 9)])
    found, best = scores(index, dataset, body)  # the bitmap reads the two new documents' rows
    assert found == best
    assert found[0] == (chunk_id(kept, 1, 0), pytest.approx(1.0, abs=1e-4))  # shelf 1's: never
    # once the lists hold the new chunks, the bitmap's bits let shelf 0's through the scan
    assert index.graphs.caught_up(timeout=30)
    scans.clear()
    found, best = scores(index, dataset, body)
    assert found == best
    assert found[0] == (chunk_id(kept, 1, 0), pytest.approx(1.0, abs=1e-4))
    assert chunk_id(other, 1, 0) not in {hit for hit, _ in found}
    if index.admitted.ways == (Way.SKIP,):
        assert taken(scans) == [SKIPPING]
    if index.admitted.ways == (Way.AFTER,):
        assert taken(scans) == [AFTER]
    assert index.admitted.builds == 1  # followed, not built again


def test_a_bitmap_behind_the_pruned_log_is_built_again(
    shelved, monkeypatch: pytest.MonkeyPatch
) -> None:
    index, dataset, _ = shelved
    scores(index, dataset, "build it")
    assert index.admitted.caught_up(timeout=30)
    monkeypatch.setattr(graphs, "SNAPSHOT_CHANGES", 1)  # the lists saved after every change …
    monkeypatch.setattr(graphs, "SNAPSHOT_INTERVAL_S", 0.0)
    with index.db.write() as conn:
        kept = insert_document(conn, dataset, meta={"shelf": 0})
    body = "quokka marimba tundra " * 4
    write(index, dataset, kept, 1, [body, *texts(97, 9)])
    key = dataset_key(dataset)
    assert index.graphs.caught_up(timeout=30)  # the lists take the chunks in, spare core or not
    deadline = time.monotonic() + 30  # … and the log rows they hold pruned, before any search
    while rows_of(index, key):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    found, best = scores(index, dataset, body)  # behind: dropped, built again meanwhile
    assert found == best
    assert index.admitted.caught_up(timeout=30)
    assert index.admitted.builds == 2
    found, best = scores(index, dataset, body)
    assert found == best
    assert found[0] == (chunk_id(kept, 1, 0), pytest.approx(1.0, abs=1e-4))


def rows_of(index: SqliteIndex, key: int) -> int:
    with index.db.read() as conn:
        return int(
            conn.exec_driver_sql(
                f"SELECT count(*) FROM {index.log} WHERE dataset_key = ?", (key,)
            ).scalar()
            or 0
        )


def test_the_way_is_chosen_by_the_scans_timed() -> None:
    choice = WayChoice()
    tried = []
    for _ in range(2 * admitted.TRIALS):  # the way timed fewer times is tried
        tried.append(choice.pick(0.5))  # as on an AMD EPYC: skipping 14 ms, every code 9
        choice.timed(tried[-1], 0.014 if tried[-1] is Way.SKIP else 0.009)
    assert tried.count(Way.SKIP) == tried.count(Way.AFTER) == admitted.TRIALS
    picks = [choice.pick(0.5) for _ in range(admitted.RETRY_EVERY)]
    assert picks.count(Way.AFTER) == admitted.RETRY_EVERY - 1
    assert picks.count(Way.SKIP) == 1  # the other way timed again, once in RETRY_EVERY
    for _ in range(admitted.TRIALS):  # scanning everything a little slower: no change …
        choice.timed(Way.AFTER, 0.013)
    assert choice.pick(0.5) is Way.AFTER
    for _ in range(admitted.TRIALS):  # … much slower (the load changed): the other way
        choice.timed(Way.AFTER, 0.030)
    assert choice.pick(0.5) is Way.SKIP
    # a filter admitting too little always skips (after would ask for four times as many)
    assert choice.pick(admitted.AFTER_MIN_PASSING / 2) is Way.SKIP
    assert WayChoice((Way.AFTER,)).pick(0.01) is Way.AFTER  # unless it may not
