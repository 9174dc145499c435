"""One contract for every ChunkIndex: in memory, SQLite (sqlite-vec + FTS5) and PostgreSQL
(pgvector + tsvector) behave the same."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from knowledgeops.db.engine import Database
from knowledgeops.errors import IndexUnavailable
from knowledgeops.ingest.index import vector_rows
from knowledgeops.ingest.index.base import ChunkIndex, IndexedChunk, chunk_id, text_hash
from knowledgeops.ingest.index.counts import ACTIVE_CHUNKS
from knowledgeops.ingest.index.filters import SearchFilter
from knowledgeops.ingest.index.keys import dataset_key
from knowledgeops.ingest.index.memory import MemoryIndex
from knowledgeops.ingest.index.pgvector import PgVectorIndex, PgVectorMissing
from knowledgeops.ingest.index.sqlite import SqliteIndex
from knowledgeops.lab.embedders import HashingEmbedder
from tests.fixtures.rows import insert_dataset, insert_document

EMBED = HashingEmbedder(dimension=64)


class Harness:
    def __init__(
        self, index: ChunkIndex, db: Database | None, graphs: bool = False, keywords: bool = False
    ) -> None:
        self.index = index
        self.db = db
        self.graphs = graphs  # SQLite through its HNSW graphs, caught up before each search
        self.keywords = keywords  # SQLite through its Tantivy index, caught up before each search

    @contextmanager
    def tx(self) -> Iterator[Any]:
        if self.db is None:
            yield None
        else:
            with self.db.write() as conn:
                yield conn

    def dataset(self) -> str:
        if self.db is None:
            return str(uuid.uuid4())
        with self.db.write() as conn:
            return insert_dataset(conn)

    def document(
        self,
        dataset_id: str,
        content_type: str = "text/plain",
        meta: dict[str, Any] | None = None,
        model: str | None = None,
    ) -> str:
        if self.db is None:
            document_id = str(uuid.uuid4())
            assert isinstance(self.index, MemoryIndex)
            self.index.describe(document_id, content_type, meta or {}, model)
            return document_id
        with self.db.write() as conn:
            return insert_document(
                conn, dataset_id, content_type=content_type, meta=meta, embedding_model=model
            )

    def write(
        self, dataset_id: str, document_id: str, generation: int, texts: list[str], base: int = 0
    ) -> None:
        chunks = [
            IndexedChunk(
                id=chunk_id(document_id, generation, base + n),
                document_id=document_id,
                dataset_id=dataset_id,
                generation=generation,
                ordinal=base + n,
                text=text,
                content_hash=text_hash(text),
                token_count=len(text.split()),
                page_start=n + 1,
                page_end=n + 1,
                section="Intro",
                vector=EMBED.vector(text),
            )
            for n, text in enumerate(texts)
        ]
        with self.tx() as tx:
            self.index.upsert(tx, chunks)

    def activate(self, document_id: str, generation: int) -> int:
        with self.tx() as tx:
            return self.index.activate(tx, document_id, generation)

    def texts(
        self,
        dataset_id: str,
        query: str,
        mode: str = "vector",
        k: int = 10,
        where: SearchFilter | None = None,
    ) -> list[str]:
        if self.graphs:
            assert isinstance(self.index, SqliteIndex)
            self.index.graphs.want(dataset_key(dataset_id))
            assert self.index.graphs.caught_up()
        if self.keywords:
            assert isinstance(self.index, SqliteIndex | PgVectorIndex)
            keywords = self.index.keywords
            assert keywords is not None
            keywords.want()
            assert keywords.caught_up(timeout=60)
        if mode == "vector":
            hits = self.index.search_vector(dataset_id, EMBED.vector(query), k, where)
        else:
            hits = self.index.search_keyword(dataset_id, query, k, where)
        return [hit.text for hit in hits]


@pytest.fixture(
    params=[
        "memory",
        "sqlite",
        "sqlite-graphs",
        "sqlite-keywords",
        pytest.param("pgvector", marks=pytest.mark.postgres),
        pytest.param("pgvector-keywords", marks=pytest.mark.postgres),
    ]
)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    if request.param == "memory":
        yield Harness(MemoryIndex(), None)
        return
    index: SqliteIndex | PgVectorIndex
    if request.param.startswith("sqlite"):
        db: Database = request.getfixturevalue("sqlite_db")
        # every dataset through a graph, however small
        graphs = request.param == "sqlite-graphs"
        keywords = request.param == "sqlite-keywords"  # and every keyword search through Tantivy
        index = SqliteIndex(
            db,
            EMBED.dimension,
            graph_min_chunks=1 if graphs else 10**9,
            keyword_min_chunks=0 if keywords else 10**9,
        )
        index.ensure()
        yield Harness(index, db, graphs=graphs, keywords=keywords)
        index.close()
        return
    db = request.getfixturevalue("pgvector_db")
    keywords = request.param == "pgvector-keywords"  # every keyword search through Tantivy
    index = PgVectorIndex(
        db,
        EMBED.dimension,
        keyword_folder=tmp_path / "keywords" if keywords else None,
        keyword_min_chunks=0,
    )
    index.ensure()
    yield Harness(index, db, keywords=keywords)
    index.close()


DOC = [
    "ownership rules in rust move values between variables",
    "borrowing lets you refer to a value without taking ownership",
    "the cargo build tool compiles crates and fetches dependencies",
]


def test_nothing_is_searchable_before_activation(harness: Harness) -> None:
    ds = harness.dataset()
    doc = harness.document(ds)
    harness.write(ds, doc, 1, DOC)
    assert harness.texts(ds, "ownership") == []
    assert harness.texts(ds, "ownership", "keyword") == []
    assert harness.activate(doc, 1) == 3
    assert harness.texts(ds, "cargo build crates", k=1) == [DOC[2]]
    assert harness.texts(ds, "cargo", "keyword") == [DOC[2]]


def test_hits_carry_their_position(harness: Harness) -> None:
    ds = harness.dataset()
    doc = harness.document(ds)
    harness.write(ds, doc, 1, DOC)
    harness.activate(doc, 1)
    (hit,) = harness.index.search_keyword(ds, "borrowing", 5)
    assert (hit.document_id, hit.ordinal, hit.page_start, hit.section) == (doc, 1, 2, "Intro")
    assert hit.chunk_id == chunk_id(doc, 1, 1)
    assert hit.score > 0
    vector_hits = harness.index.search_vector(ds, EMBED.vector(DOC[0]), 3)
    assert vector_hits[0].text == DOC[0]
    assert vector_hits[0].score == pytest.approx(1.0, abs=1e-5)
    assert [h.score for h in vector_hits] == sorted((h.score for h in vector_hits), reverse=True)


def test_rewriting_a_generation_overwrites_instead_of_duplicating(harness: Harness) -> None:
    ds = harness.dataset()
    doc = harness.document(ds)
    harness.write(ds, doc, 1, DOC)
    harness.write(ds, doc, 1, DOC)  # a retried batch writes the same ids again
    assert harness.activate(doc, 1) == 3
    assert len(harness.texts(ds, "ownership rules cargo borrowing", k=10)) == 3
    assert harness.texts(ds, "ownership", "keyword").count(DOC[0]) == 1


def test_a_new_generation_replaces_the_old_only_when_activated(harness: Harness) -> None:
    ds = harness.dataset()
    doc = harness.document(ds)
    harness.write(ds, doc, 1, DOC)
    harness.activate(doc, 1)
    harness.write(ds, doc, 2, ["async await futures and tokio runtimes"])
    assert harness.texts(ds, "tokio", "keyword") == []
    assert harness.texts(ds, "cargo", "keyword") == [DOC[2]]
    assert harness.activate(doc, 2) == 1
    assert harness.texts(ds, "tokio", "keyword") == ["async await futures and tokio runtimes"]
    assert harness.texts(ds, "cargo", "keyword") == []
    assert len(harness.texts(ds, "anything at all", k=10)) == 1


def test_discarding_a_generation_keeps_the_active_one(harness: Harness) -> None:
    ds = harness.dataset()
    doc = harness.document(ds)
    harness.write(ds, doc, 1, DOC)
    harness.activate(doc, 1)
    harness.write(ds, doc, 2, ["half written reindex about macros"])
    with harness.tx() as tx:
        harness.index.discard(tx, doc, 2)
    assert harness.texts(ds, "cargo", "keyword") == [DOC[2]]
    assert harness.texts(ds, "macros", "keyword") == []
    assert harness.activate(doc, 1) == 3


def test_discarding_a_range_of_ordinals_keeps_the_rest_of_the_generation(
    harness: Harness,
) -> None:
    ds = harness.dataset()
    doc = harness.document(ds)
    harness.write(ds, doc, 1, DOC)  # ordinals 0..2: one part of a split job
    harness.write(ds, doc, 1, ["tokio runtimes", "macro hygiene"], base=100)  # another part
    with harness.tx() as tx:
        harness.index.discard(tx, doc, 1, (100, 200))
    assert harness.activate(doc, 1) == 3
    assert harness.texts(ds, "macro", "keyword") == []
    with harness.tx() as tx:
        harness.index.discard(tx, doc, 1, (1, 2))
    assert harness.activate(doc, 1) == 2
    assert harness.texts(ds, "borrowing", "keyword") == []
    assert harness.texts(ds, "cargo", "keyword") == [DOC[2]]


def test_deleting_a_document_removes_it_from_search_at_once(harness: Harness) -> None:
    ds = harness.dataset()
    keep, drop = harness.document(ds), harness.document(ds)
    harness.write(ds, keep, 1, ["traits define shared behaviour"])
    harness.write(ds, drop, 1, ["traits and generics in the dropped file"])
    harness.activate(keep, 1)
    harness.activate(drop, 1)
    with harness.tx() as tx:
        harness.index.delete_document(tx, drop)
    assert harness.texts(ds, "traits", "keyword") == ["traits define shared behaviour"]
    assert harness.texts(ds, "traits generics dropped", k=10) == ["traits define shared behaviour"]


def test_search_is_scoped_to_its_dataset_and_dataset_delete(harness: Harness) -> None:
    first, second = harness.dataset(), harness.dataset()
    a, b = harness.document(first), harness.document(second)
    harness.write(first, a, 1, ["lifetimes annotate references"])
    harness.write(second, b, 1, ["lifetimes in another dataset"])
    harness.activate(a, 1)
    harness.activate(b, 1)
    assert harness.texts(first, "lifetimes", "keyword") == ["lifetimes annotate references"]
    assert harness.texts(second, "lifetimes") == ["lifetimes in another dataset"]
    with harness.tx() as tx:
        harness.index.delete_dataset(tx, second)
    assert harness.texts(second, "lifetimes", "keyword") == []
    assert harness.texts(first, "lifetimes", "keyword") == ["lifetimes annotate references"]


def test_keyword_ranking_prefers_more_matching_words(harness: Harness) -> None:
    ds = harness.dataset()
    doc = harness.document(ds)
    harness.write(
        ds,
        doc,
        1,
        [
            "closures capture their environment",
            "iterators and closures work together lazily with iterators adapters",
            "smart pointers like box and rc",
        ],
    )
    harness.activate(doc, 1)
    texts = harness.texts(ds, "iterators closures", "keyword")
    assert texts[0].startswith("iterators and closures")
    assert set(texts) == {
        "closures capture their environment",
        "iterators and closures work together lazily with iterators adapters",
    }


def test_keyword_search_finds_chinese_words(harness: Harness) -> None:
    ds = harness.dataset()
    doc = harness.document(ds)
    harness.write(ds, doc, 1, ["任务状态机描述了导入流程", "重试需要分类", "幂等键避免重复"])
    harness.activate(doc, 1)
    assert harness.texts(ds, "状态机", "keyword") == ["任务状态机描述了导入流程"]
    assert harness.texts(ds, "如何重试", "keyword") == ["重试需要分类"]  # 如何: a function word
    assert harness.texts(ds, "重试", "keyword") == ["重试需要分类"]


def test_keyword_search_ranks_the_chunk_holding_most_of_a_chinese_query(harness: Harness) -> None:
    ds = harness.dataset()
    doc = harness.document(ds)
    harness.write(
        ds,
        doc,
        1,
        [
            "心跳超时以后，租约过期的任务会被检测出来并重新调度",  # 心跳 … 检测, not side by side
            "Node.js 的 worker 线程与主线程共享内存",
            "worker 进程崩溃时，任务由心跳检测发现并恢复",
        ],
    )
    harness.activate(doc, 1)
    found = harness.texts(ds, "Worker 崩溃后任务怎么恢复", "keyword")
    assert found[0] == "worker 进程崩溃时，任务由心跳检测发现并恢复"
    assert set(harness.texts(ds, "心跳检测", "keyword")) == {
        "心跳超时以后，租约过期的任务会被检测出来并重新调度",
        "worker 进程崩溃时，任务由心跳检测发现并恢复",
    }


def test_keyword_search_finds_japanese_and_korean_by_bigrams(harness: Harness) -> None:
    ds = harness.dataset()
    doc = harness.document(ds)
    texts = [
        "パッケージの設定ファイルは /etc にあります",
        "カーネルを再構築する方法",
        "데비안을 설치하려면 설치 이미지를 내려받으세요",
    ]
    harness.write(ds, doc, 1, texts)
    harness.activate(doc, 1)
    assert harness.texts(ds, "設定ファイルはどこ", "keyword")[0] == texts[0]
    assert harness.texts(ds, "カーネル", "keyword") == [texts[1]]
    assert harness.texts(ds, "데비안 설치", "keyword") == [texts[2]]


def test_queries_with_only_punctuation_or_fts_syntax_are_safe(harness: Harness) -> None:
    ds = harness.dataset()
    doc = harness.document(ds)
    harness.write(ds, doc, 1, DOC)
    harness.activate(doc, 1)
    assert harness.texts(ds, "?!", "keyword") == []
    assert harness.texts(ds, 'NEAR(" ^ * :', "keyword") == []
    assert harness.texts(ds, '"cargo" OR crates*', "keyword") == [DOC[2]]


def test_vectors_are_compared_by_cosine(harness: Harness) -> None:
    ds = harness.dataset()
    doc = harness.document(ds)
    harness.write(ds, doc, 1, DOC)
    harness.activate(doc, 1)
    query = EMBED.vector(DOC[1]) * np.float32(5.0)  # length does not matter for cosine
    assert harness.texts(ds, DOC[1], k=1) == [DOC[1]]
    assert harness.index.search_vector(ds, query / np.linalg.norm(query), 1)[0].text == DOC[1]


@pytest.mark.parametrize("engine", ["sqlite", pytest.param("pgvector", marks=pytest.mark.postgres)])
def test_keyword_terms_of_an_older_version_are_rebuilt_from_the_chunks_text(
    engine: str, request: pytest.FixtureRequest
) -> None:
    db: Database = request.getfixturevalue(f"{engine}_db")
    index: SqliteIndex | PgVectorIndex = (
        SqliteIndex(db, EMBED.dimension)
        if engine == "sqlite"
        else PgVectorIndex(db, EMBED.dimension)
    )
    index.ensure()
    harness = Harness(index, db)
    ds = harness.dataset()
    doc = harness.document(ds)
    harness.write(ds, doc, 1, ["心跳检测发现崩溃的任务", "ownership rules in rust"])
    harness.activate(doc, 1)
    # what an index of the first version looks like: its keyword rows under the old name, and
    # (emptied here) no terms this version's queries would find
    with db.write() as conn:
        if isinstance(index, SqliteIndex):
            conn.exec_driver_sql(f"ALTER TABLE {index.fts} RENAME TO chunk_fts")
            conn.exec_driver_sql("DELETE FROM chunk_fts")
        else:
            conn.exec_driver_sql(f"ALTER TABLE {index.table} RENAME COLUMN {index.words} TO words")
            conn.exec_driver_sql(f"UPDATE {index.table} SET words = ''::tsvector")
    if isinstance(index, PgVectorIndex):
        with pytest.raises(PgVectorMissing, match="older version: run `kops migrate`"):
            index.verify()
    index.ensure()
    index.verify()
    assert harness.texts(ds, "心跳检测", "keyword") == ["心跳检测发现崩溃的任务"]
    assert harness.texts(ds, "rust", "keyword") == ["ownership rules in rust"]
    with db.read() as conn:
        if isinstance(index, SqliteIndex):
            old = conn.exec_driver_sql(
                "SELECT count(*) FROM sqlite_master WHERE name IN ('chunk_fts', 'chunk_fts_data')"
            ).scalar_one()
        else:
            old = conn.exec_driver_sql(
                "SELECT count(*) FROM information_schema.columns WHERE table_name = %(t)s "
                "AND column_name = 'words'",
                {"t": index.table},
            ).scalar_one()
    assert old == 0


def test_keyword_search_finds_a_datasets_chunks_below_many_better_ones_elsewhere(
    harness: Harness,
) -> None:
    """The engines rank the words' matches of all datasets first, then keep this dataset's:
    150 better matches in another dataset (more than SQLite looks at first) must not hide
    this dataset's, nor its inactive rows count."""
    ds, other = harness.dataset(), harness.dataset()
    crowd = harness.document(other)
    harness.write(other, crowd, 1, [f"cargo cargo cargo crate {n}" for n in range(150)])
    harness.activate(crowd, 1)
    mine = harness.document(ds)
    harness.write(ds, mine, 1, ["the cargo tool", "cargo fetches dependencies", "no match"])
    harness.activate(mine, 1)
    harness.write(ds, mine, 2, ["cargo cargo cargo cargo not active"])
    found = harness.texts(ds, "cargo", "keyword", k=5)
    assert sorted(found) == ["cargo fetches dependencies", "the cargo tool"]
    assert len(harness.texts(other, "cargo", "keyword", k=200)) == 150
    assert len(harness.texts(other, "cargo crate", "keyword", k=3)) == 3


def test_vectors_of_the_table_keyed_by_dataset_id_are_moved_at_start(sqlite_db: Database) -> None:
    """An embedded index made before the vector table keyed datasets by a 64-bit key: its
    vectors (active or not) move to the new table at the next start, which drops the old."""
    index = SqliteIndex(sqlite_db, EMBED.dimension)
    index.ensure()
    harness = Harness(index, sqlite_db)
    ds, other = harness.dataset(), harness.dataset()
    doc, elsewhere = harness.document(ds), harness.document(other)
    harness.write(ds, doc, 1, ["ownership rules in rust", "borrowing lets you refer"])
    harness.activate(doc, 1)
    harness.write(ds, doc, 2, ["a generation not active yet"])
    harness.write(other, elsewhere, 1, ["ownership in another dataset"])
    harness.activate(elsewhere, 1)
    with sqlite_db.write() as conn:  # the table as the previous version made it
        conn.exec_driver_sql(
            f"CREATE VIRTUAL TABLE {index.legacy_vec} USING vec0(embedding float[64] "
            "distance_metric=cosine, dataset_id text, active integer)"
        )
        conn.exec_driver_sql(
            f"INSERT INTO {index.legacy_vec} (rowid, embedding, dataset_id, active) SELECT "
            f"v.rowid, v.embedding, c.dataset_id, v.active FROM {index.vec} v "
            "JOIN chunks c ON c.seq = v.rowid"
        )
        conn.exec_driver_sql(f"DROP TABLE {index.vec}")
    index.ensure()
    index.verify()
    assert harness.texts(ds, "ownership rules in rust", k=5) == [
        "ownership rules in rust",
        "borrowing lets you refer",
    ]
    assert harness.texts(other, "ownership", k=5) == ["ownership in another dataset"]
    harness.activate(doc, 2)  # the inactive row moved too, inactive
    assert harness.texts(ds, "generation", k=5) == ["a generation not active yet"]
    with sqlite_db.read() as conn:
        left = conn.exec_driver_sql(
            "SELECT count(*) FROM sqlite_master WHERE name = ?", (index.legacy_vec,)
        ).scalar_one()
    assert left == 0


def _vector_rows(db: Database, index: SqliteIndex) -> tuple[dict[int, bytes], dict[int, bytes]]:
    """Each seq's vector as sqlite-vec holds it and as the plain table holds it."""
    with db.read() as conn:
        vec = dict(conn.exec_driver_sql(f"SELECT rowid, embedding FROM {index.vec}").all())
        rows = dict(conn.exec_driver_sql(f"SELECT seq, embedding FROM {index.rows}").all())
    return vec, rows


def test_the_plain_vector_table_follows_every_write_and_delete(sqlite_db: Database) -> None:
    """The vectors read by seq for exact scoring are those sqlite-vec holds, row for row,
    through a retried write, a new generation, a discarded range, a document and a dataset
    deleted."""
    index = SqliteIndex(sqlite_db, EMBED.dimension)
    index.ensure()
    harness = Harness(index, sqlite_db)
    ds, other = harness.dataset(), harness.dataset()
    doc, gone, elsewhere = harness.document(ds), harness.document(ds), harness.document(other)
    harness.write(ds, doc, 1, DOC)
    harness.write(ds, doc, 1, ["a retry writes other text", *DOC[1:]])  # overwrites its rows
    harness.activate(doc, 1)
    harness.write(ds, doc, 2, ["the next generation", "and its second chunk", "a third"])
    with harness.tx() as tx:
        index.discard(tx, doc, 2, (2, 3))
    harness.write(ds, gone, 1, ["a document deleted later"])
    harness.activate(gone, 1)
    harness.write(other, elsewhere, 1, ["a dataset deleted later", "with two chunks"])
    harness.activate(elsewhere, 1)
    vec, rows = _vector_rows(sqlite_db, index)
    assert len(vec) == 3 + 2 + 1 + 2
    assert rows == vec
    with harness.tx() as tx:
        index.delete_document(tx, gone)
        index.delete_dataset(tx, other)
    harness.activate(doc, 2)
    vec, rows = _vector_rows(sqlite_db, index)
    assert len(vec) == 2
    assert rows == vec
    assert harness.texts(ds, "the next generation", k=5) == [
        "the next generation",
        "and its second chunk",
    ]


def _indexed(db: Database) -> tuple[SqliteIndex, Harness, str, str]:
    """An embedded index holding DOC, active, in one document of one dataset."""
    index = SqliteIndex(db, EMBED.dimension)
    index.ensure()
    harness = Harness(index, db)
    ds = harness.dataset()
    doc = harness.document(ds)
    harness.write(ds, doc, 1, DOC)
    harness.activate(doc, 1)
    return index, harness, ds, doc


def _drop_rows(db: Database, index: SqliteIndex) -> None:
    """The index as a version before the plain vector table left it."""
    with db.write() as conn:
        conn.exec_driver_sql(f"DROP TABLE {index.rows}")


def test_an_index_made_before_the_plain_vector_table_is_filled_at_start(
    sqlite_db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """A database whose index has only sqlite-vec's table (an earlier version): the next start
    fills the plain table with every vector, active or not, and searches score from it."""
    index, harness, ds, doc = _indexed(sqlite_db)
    harness.write(ds, doc, 2, ["a generation not active yet"])
    expected = harness.texts(ds, "ownership rules in rust", k=5)
    _drop_rows(sqlite_db, index)
    with pytest.raises(IndexUnavailable, match=index.rows):
        index.verify()
    with caplog.at_level(logging.INFO, logger=vector_rows.__name__):
        index.ensure()
    index.verify()
    assert "from sqlite-vec's storage" in caplog.text  # its shadow tables, read directly
    vec, rows = _vector_rows(sqlite_db, index)
    assert len(rows) == 4
    assert rows == vec
    assert harness.texts(ds, "ownership rules in rust", k=5) == expected
    harness.activate(doc, 2)
    assert harness.texts(ds, "generation", k=5) == ["a generation not active yet"]


def test_the_fill_from_storage_reads_every_chunk_of_vectors_around_deleted_rows(
    sqlite_db: Database,
) -> None:
    """2,500 vectors (three of sqlite-vec's 1,024-vector chunks), a document deleted from the
    middle: the fill from its storage holds exactly what sqlite-vec holds."""
    index = SqliteIndex(sqlite_db, EMBED.dimension)
    index.ensure()
    harness = Harness(index, sqlite_db)
    ds = harness.dataset()
    docs = [harness.document(ds) for _ in range(5)]
    for n, doc in enumerate(docs):
        harness.write(ds, doc, 1, [f"chunk {n} {m} of the fill" for m in range(500)])
        harness.activate(doc, 1)
    with harness.tx() as tx:
        index.delete_document(tx, docs[2])
    _drop_rows(sqlite_db, index)
    index.ensure()
    vec, rows = _vector_rows(sqlite_db, index)
    assert len(vec) == 2000
    assert rows == vec


def test_a_storage_layout_that_does_not_read_falls_back_to_sqlite_vecs_scan(
    sqlite_db: Database, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Another sqlite-vec layout (another version): the partial fill is cleared and the table
    filled through sqlite-vec's own scan, row for row the same."""
    index, _, _, _ = _indexed(sqlite_db)
    _drop_rows(sqlite_db, index)

    def unreadable(conn: Any, vec: str, rows: str, dimension: int) -> None:
        conn.exec_driver_sql(f"INSERT INTO {rows} (seq, embedding) VALUES (999999, x'00')")
        # what a layout it cannot read gives, after a partial fill

    monkeypatch.setattr(vector_rows, "_from_storage", unreadable)
    with caplog.at_level(logging.INFO, logger=vector_rows.__name__):
        index.ensure()
    assert "through sqlite-vec's scan" in caplog.text
    vec, rows = _vector_rows(sqlite_db, index)
    assert len(rows) == 3
    assert rows == vec


def test_a_filter_is_applied_inside_the_search_so_top_k_counts_only_what_passes(
    harness: Harness,
) -> None:
    ds = harness.dataset()
    # many near matches in documents the filter refuses, one far match in the one it admits
    refused = [harness.document(ds, "text/plain", {"team": "web", "year": 2024}) for _ in range(4)]
    for n, doc in enumerate(refused):
        harness.write(ds, doc, 1, [f"cargo build crates number {n} and more cargo"])
        harness.activate(doc, 1)
    admitted = harness.document(ds, "application/pdf", {"team": "infra", "year": 2025, "ok": True})
    harness.write(ds, admitted, 1, ["the cargo tool fetches dependencies"])
    harness.activate(admitted, 1)
    only = "the cargo tool fetches dependencies"
    for where in (
        SearchFilter(metadata=(("team", ("infra",)),)),
        SearchFilter(metadata=(("year", (2025, 2026)),)),
        SearchFilter(metadata=(("year", (2025.0,)),)),  # a number equals its float
        SearchFilter(metadata=(("ok", (True,)),)),
        SearchFilter(content_types=("application/pdf",)),
        SearchFilter(document_ids=(admitted,)),
    ):
        assert harness.texts(ds, "cargo build crates", k=1, where=where) == [only], where
        assert harness.texts(ds, "cargo", "keyword", k=1, where=where) == [only], where
    nothing = (
        SearchFilter(metadata=(("year", ("2025",)),)),  # the string is not the number
        SearchFilter(metadata=(("ok", (1,)),)),  # nor is true the number 1
        SearchFilter(metadata=(("missing", (None,)),)),  # an absent key is not null
        SearchFilter(metadata=(("team", ("infra",)), ("year", (2024,)))),  # every part holds
        SearchFilter(document_ids=()),
    )
    for where in nothing:
        assert harness.texts(ds, "cargo", k=5, where=where) == [], where
        assert harness.texts(ds, "cargo", "keyword", k=5, where=where) == [], where
    assert len(harness.texts(ds, "cargo", k=10, where=SearchFilter())) == 5  # empty: no filter


def test_a_model_filter_keeps_each_models_vectors_to_its_own_documents(harness: Harness) -> None:
    """While a re-embed is on its way, search asks for each model's documents apart: a query
    vector of one model must never be compared with another model's vectors."""
    ds = harness.dataset()
    on_a = [harness.document(ds, model="model-a") for _ in range(3)]
    on_b = harness.document(ds, model="model-b")
    for n, doc in enumerate(on_a):
        harness.write(ds, doc, 1, [f"cargo build crates number {n}"])
        harness.activate(doc, 1)
    harness.write(ds, on_b, 1, ["cargo fetches dependencies"])
    harness.activate(on_b, 1)
    only_b = SearchFilter(models=("model-b",))
    assert not only_b.empty
    assert harness.texts(ds, "cargo build crates", k=5, where=only_b) == [
        "cargo fetches dependencies"
    ]
    assert harness.texts(ds, "cargo", "keyword", k=5, where=only_b) == [
        "cargo fetches dependencies"
    ]
    only_a = harness.texts(ds, "cargo", k=5, where=SearchFilter(models=("model-a",)))
    assert sorted(only_a) == [f"cargo build crates number {n}" for n in range(3)]
    assert harness.texts(ds, "cargo", k=5, where=SearchFilter(models=())) == []


def test_equal_scores_come_back_in_one_stable_order(harness: Harness) -> None:
    ds = harness.dataset()
    docs = [harness.document(ds) for _ in range(3)]
    for doc in docs:
        harness.write(ds, doc, 1, ["the same sentence about cargo"] * 2)
        harness.activate(doc, 1)
    for mode in ("vector", "keyword"):
        hits = [
            [
                (h.document_id, h.ordinal)
                for h in (
                    harness.index.search_vector(ds, EMBED.vector("cargo sentence"), 6)
                    if mode == "vector"
                    else harness.index.search_keyword(ds, "cargo sentence", 6)
                )
            ]
            for _ in range(3)
        ]
        assert hits[0] == hits[1] == hits[2], mode
        # ties in the order the chunks were written
        assert hits[0] == [(doc, n) for doc in docs for n in (0, 1)], mode


def test_a_datasets_searchable_chunks_are_counted_from_an_index_alone(sqlite_db: Database) -> None:
    """Every search counts the dataset's searchable chunks: SQLite answers it from the covering
    index, without reading a document row (their metadata makes them wide)."""
    with sqlite_db.read() as conn:
        plan = " ".join(
            str(row[-1])
            for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {ACTIVE_CHUNKS}", ("any",))
        )
    assert "COVERING INDEX ix_documents_dataset_id_active_generation_chunk_count" in plan
