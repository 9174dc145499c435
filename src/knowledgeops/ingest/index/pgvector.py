"""The scale-out index: pgvector (HNSW, cosine) for vectors and PostgreSQL full-text (tsvector +
GIN) for words, in the same database as the chunks, fused by the search service (by score).

Chunk rows live in the declared `chunks` table; one row per chunk in `chunk_vectors_{dim}` holds
its vector, its words (`simple` configuration over the text with CJK runs cut into words by
terms.py, exactly as the SQLite index does) and whether its generation is active. The words'
column is named for the version of the terms (`words_v2`): `kops migrate` finds an older column,
fills the new one from the chunks' text and drops the old. Rows point
at `chunks.seq` with ON DELETE CASCADE, so deleting chunks deletes their index rows in the same
statement.

HNSW is approximate and filters after the graph walk: a query scoped to a small dataset inside a
large table may come back with fewer than k rows. When that happens the query is run again
exactly (index scans off, the dataset's rows found through the btree), so a dataset never looks
smaller than it is.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import DBAPIError

from knowledgeops.db.engine import Database, Tx
from knowledgeops.db.schema import chunks, documents
from knowledgeops.errors import IndexUnavailable
from knowledgeops.ingest.index.base import Hit, IndexedChunk, chunk_row
from knowledgeops.ingest.index.filters import SearchFilter, postgres_where
from knowledgeops.ingest.index.terms import TERMS_VERSION, index_text, query_terms

# chosen by measurement (docs/performance.md: Vector search at a million chunks)
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 64
HNSW_EF_SEARCH = 400  # for a dataset that is the whole table; more for a smaller share
HNSW_MAX_EF_SEARCH = 1000  # pgvector's limit
EXACT_SHARE = 0.1  # a dataset under this share of the table is searched exactly (its btree)
EXACT_MAX_ROWS = 20_000  # … or under this many chunks, whatever its share
TABLE_ROWS_TTL_S = 60.0  # how long the table's row estimate is reused
TS_CONFIG = "simple"  # no stemming, no stopword list: the same words in every language
REBUILD_BATCH = 2000  # chunks re-tokenized per statement when the terms change


class PgVectorMissing(IndexUnavailable):
    """The database has no pgvector extension (or may not create it), or no index table."""


class PgVectorIndex:
    def __init__(
        self, db: Database, dimension: int, *, exact_max_rows: int = EXACT_MAX_ROWS
    ) -> None:
        if db.dialect != "postgresql":
            raise ValueError("PgVectorIndex needs a PostgreSQL database")
        self.db = db
        self.dimension = dimension
        self.table = f"chunk_vectors_{dimension}"
        self.words = f"words_v{TERMS_VERSION}"
        self._table_rows: tuple[float, float] = (0.0, -1.0)  # (estimate, when)
        self.exact_max_rows = exact_max_rows

    def ensure(self) -> None:
        """Create the extension, the table and its indexes if missing (idempotent; `kops migrate`
        and every process start run it). Raises PgVectorMissing with what to do."""
        try:
            with self.db.write() as conn:
                conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS vector")
        except DBAPIError as exc:
            installed = self._installed_vector_version()
            if installed is None:
                raise PgVectorMissing(
                    "the database has no pgvector extension and it could not be created "
                    f"({_first_line(exc)}). Install pgvector ≥ 0.5 on the PostgreSQL server, "
                    "or let a superuser run CREATE EXTENSION vector in this database"
                ) from None
        with self.db.write() as conn:
            # two processes starting at once must not both create the table
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(hashtext('kops.index.ensure'))")
            conn.exec_driver_sql(
                f"CREATE TABLE IF NOT EXISTS {self.table} ("
                "seq integer PRIMARY KEY REFERENCES chunks (seq) ON DELETE CASCADE, "
                "dataset_id varchar(36) NOT NULL, "
                "active boolean NOT NULL DEFAULT false, "
                f"embedding vector({self.dimension}) NOT NULL, "
                f"{self.words} tsvector NOT NULL)"
            )
            self._upgrade_words(conn)
            conn.exec_driver_sql(self.hnsw_ddl())
            conn.exec_driver_sql(
                f"CREATE INDEX IF NOT EXISTS ix_{self.table}_{self.words} ON {self.table} "
                f"USING gin ({self.words})"
            )
            conn.exec_driver_sql(
                f"CREATE INDEX IF NOT EXISTS ix_{self.table}_dataset ON {self.table} "
                "(dataset_id, active)"
            )

    def hnsw_ddl(self) -> str:
        return (
            f"CREATE INDEX IF NOT EXISTS ix_{self.table}_hnsw ON {self.table} "
            f"USING hnsw (embedding vector_cosine_ops) WITH (m = {HNSW_M}, "
            f"ef_construction = {HNSW_EF_CONSTRUCTION})"
        )

    def _words_columns(self, conn: Tx) -> set[str]:
        rows = conn.exec_driver_sql(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %(t)s "
            "AND (column_name = 'words' OR column_name LIKE 'words\\_v%%')",
            {"t": self.table},
        )
        return {row[0] for row in rows}

    def _upgrade_words(self, conn: Tx) -> None:
        """Terms of an older version in the table: add this version's column, fill it from the
        chunks' text in batches, then drop the old columns (and their indexes with them)."""
        older = self._words_columns(conn) - {self.words}
        if not older:
            return
        conn.exec_driver_sql(
            f"ALTER TABLE {self.table} ADD COLUMN IF NOT EXISTS {self.words} tsvector"
        )
        last = 0
        while True:
            rows = conn.exec_driver_sql(
                f"SELECT v.seq, c.text FROM {self.table} v JOIN chunks c ON c.seq = v.seq "
                "WHERE v.seq > %(last)s ORDER BY v.seq LIMIT %(n)s",
                {"last": last, "n": REBUILD_BATCH},
            ).all()
            if not rows:
                break
            conn.execute(
                text(
                    f"UPDATE {self.table} SET {self.words} = to_tsvector('{TS_CONFIG}', :words) "
                    "WHERE seq = :seq"
                ),
                [{"seq": seq, "words": index_text(body)} for seq, body in rows],
            )
            last = rows[-1][0]
        conn.exec_driver_sql(f"ALTER TABLE {self.table} ALTER COLUMN {self.words} SET NOT NULL")
        for column in sorted(older):
            conn.exec_driver_sql(f"ALTER TABLE {self.table} DROP COLUMN {column}")

    def verify(self) -> None:
        """Check, without any DDL, that pgvector and this index's tables exist (every process
        start runs this; `kops migrate` runs `ensure`). Raises PgVectorMissing with what to do."""
        if self._installed_vector_version() is None:
            raise PgVectorMissing(
                "the database has no pgvector extension. Install pgvector ≥ 0.5 on the "
                "PostgreSQL server, then run `kops migrate` (it creates the extension)"
            )
        with self.db.read() as conn:
            present = conn.exec_driver_sql(
                "SELECT to_regclass(%(t)s) IS NOT NULL", {"t": self.table}
            ).scalar_one()
            if not present:
                raise PgVectorMissing(
                    f"the index table {self.table} does not exist: run `kops migrate` first"
                )
            if self.words not in self._words_columns(conn):
                raise PgVectorMissing(
                    f"the index table {self.table} holds keyword terms of an older version: "
                    "run `kops migrate` (it rebuilds them from the chunks' text)"
                )

    def _installed_vector_version(self) -> str | None:
        try:
            with self.db.read() as conn:
                row = conn.exec_driver_sql(
                    "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
                ).first()
        except DBAPIError:
            return None
        return None if row is None else str(row[0])

    def close(self) -> None:
        """Nothing is kept in the process: the database holds the graph."""

    # --- writes ---------------------------------------------------------------------------------
    def upsert(self, tx: Tx, rows: Sequence[IndexedChunk]) -> None:
        if not rows:
            return
        statement = pg_insert(chunks).values([chunk_row(chunk) for chunk in rows])
        upsert = statement.on_conflict_do_update(
            index_elements=[chunks.c.id],
            set_={
                name: statement.excluded[name]
                for name in (
                    "text",
                    "content_hash",
                    "token_count",
                    "page_start",
                    "page_end",
                    "section",
                )
            },
        ).returning(chunks.c.id, chunks.c.seq)
        seq_by_id = {row.id: row.seq for row in tx.execute(upsert)}
        tx.execute(
            text(
                f"INSERT INTO {self.table} (seq, dataset_id, active, embedding, {self.words}) "
                f"VALUES (:seq, :dataset_id, false, CAST(:embedding AS vector), "
                f"to_tsvector('{TS_CONFIG}', :words)) ON CONFLICT (seq) DO UPDATE SET "
                "dataset_id = excluded.dataset_id, active = false, "
                f"embedding = excluded.embedding, {self.words} = excluded.{self.words}"
            ),
            [
                {
                    "seq": seq_by_id[chunk.id],
                    "dataset_id": chunk.dataset_id,
                    "embedding": _literal(chunk.vector),
                    "words": index_text(chunk.text),
                }
                for chunk in rows
            ],
        )

    def activate(self, tx: Tx, document_id: str, generation: int) -> int:
        tx.execute(
            text(
                f"UPDATE {self.table} v SET active = true FROM chunks c WHERE c.seq = v.seq "
                "AND c.document_id = :document AND c.generation = :generation AND NOT v.active"
            ),
            {"document": document_id, "generation": generation},
        )
        tx.execute(
            text("DELETE FROM chunks WHERE document_id = :document AND generation <> :generation"),
            {"document": document_id, "generation": generation},
        )
        live = tx.execute(
            text(
                "SELECT count(*) FROM chunks WHERE document_id = :document "
                "AND generation = :generation"
            ),
            {"document": document_id, "generation": generation},
        ).scalar_one()
        tx.execute(
            update(documents)
            .where(documents.c.id == document_id)
            .values(active_generation=generation, chunk_count=live)
        )
        return int(live)

    def discard(
        self, tx: Tx, document_id: str, generation: int, ordinals: tuple[int, int] | None = None
    ) -> None:
        first, end = ordinals if ordinals is not None else (0, 2**31)
        tx.execute(
            text(
                "DELETE FROM chunks WHERE document_id = :document AND generation = :generation "
                "AND ordinal >= :first AND ordinal < :end"
            ),
            {"document": document_id, "generation": generation, "first": first, "end": end},
        )

    def delete_document(self, tx: Tx, document_id: str) -> None:
        tx.execute(text("DELETE FROM chunks WHERE document_id = :d"), {"d": document_id})

    def delete_dataset(self, tx: Tx, dataset_id: str) -> None:
        tx.execute(text("DELETE FROM chunks WHERE dataset_id = :d"), {"d": dataset_id})

    # --- reads ----------------------------------------------------------------------------------
    def search_vector(
        self,
        dataset_id: str,
        vector: npt.NDArray[np.float32],
        k: int,
        where: SearchFilter | None = None,
    ) -> list[Hit]:
        with self.db.read() as conn:
            ef_search = self.ef_search(conn, dataset_id, k, where)
            if ef_search is not None:
                query, params = self._vector_query(dataset_id, vector, k, where, walk=True)
                conn.exec_driver_sql(f"SET LOCAL hnsw.ef_search = {ef_search}")
                rows = conn.execute(text(query), params).all()
            if ef_search is None or len(rows) < k:
                # a small share of the table, or the walk found fewer than k of the dataset's
                # rows: exact, the dataset's rows found through its btree
                query, params = self._vector_query(dataset_id, vector, k, where, walk=False)
                conn.exec_driver_sql("SET LOCAL enable_indexscan = off")
                rows = conn.execute(text(query), params).all()
        hits = [_hit(row) for row in rows]
        return sorted(hits, key=lambda hit: -hit.score)  # stable: ties keep the seq order

    def explain_vector(
        self,
        dataset_id: str,
        vector: npt.NDArray[np.float32],
        k: int,
        where: SearchFilter | None = None,
    ) -> str:
        """The planner's plan for the first query `search_vector` runs (tests, diagnosis)."""
        with self.db.read() as conn:
            ef_search = self.ef_search(conn, dataset_id, k, where)
            query, params = self._vector_query(
                dataset_id, vector, k, where, walk=ef_search is not None
            )
            if ef_search is None:
                conn.exec_driver_sql("SET LOCAL enable_indexscan = off")
            else:
                conn.exec_driver_sql(f"SET LOCAL hnsw.ef_search = {ef_search}")
            rows = conn.execute(text("EXPLAIN " + query), params).all()
        return "\n".join(row[0] for row in rows)

    def _vector_query(
        self,
        dataset_id: str,
        vector: npt.NDArray[np.float32],
        k: int,
        where: SearchFilter | None,
        *,
        walk: bool,
    ) -> tuple[str, dict[str, Any]]:
        """The vector query; for the HNSW walk ordered by the distance alone (an index scan can
        give no other order: a second sort key, even the seq, makes the planner sort the
        whole dataset instead)."""
        params: dict[str, Any] = {"q": _literal(vector), "dataset": dataset_id, "k": k}
        conditions = postgres_where(where, params)
        documents_join = "JOIN documents d ON d.id = c.document_id " if conditions else ""
        query = (
            "SELECT c.id, c.document_id, c.ordinal, c.text, c.page_start, c.page_end, c.section, "
            f"1 - (v.embedding <=> CAST(:q AS vector)) AS score FROM {self.table} v "
            f"JOIN chunks c ON c.seq = v.seq {documents_join}"
            f"WHERE v.dataset_id = :dataset AND v.active{conditions} "
            "ORDER BY v.embedding <=> CAST(:q AS vector)"
            + ("" if walk else ", v.seq")
            + " LIMIT :k"
        )
        return query, params

    def ef_search(
        self, conn: Tx, dataset_id: str, k: int, where: SearchFilter | None
    ) -> int | None:
        """The HNSW walk's breadth for a search of `dataset_id`, or None for an exact search.

        The graph is shared by every dataset and pgvector (0.6) filters after the walk: of
        `ef_search` rows it finds, about the dataset's share (and the filter's) pass. So the
        breadth grows as the share shrinks, and a share so small that the walk would need
        more than pgvector allows (or a dataset small enough to scan) is searched exactly."""
        params: dict[str, Any] = {"dataset": dataset_id}
        conditions = postgres_where(where, params)
        admitted = conn.execute(
            text(
                "SELECT coalesce(sum(d.chunk_count), 0) FROM documents d "
                f"WHERE d.dataset_id = :dataset AND d.active_generation IS NOT NULL{conditions}"
            ),
            params,
        ).scalar_one()
        table = self._estimated_rows(conn)
        if admitted < self.exact_max_rows or table <= 0:
            return None
        share = min(1.0, float(admitted) / table)
        if share < EXACT_SHARE:
            return None
        wanted = max(HNSW_EF_SEARCH, 2 * k) / share
        return int(min(HNSW_MAX_EF_SEARCH, wanted))

    def _estimated_rows(self, conn: Tx) -> float:
        """The vector table's rows as the planner's statistics estimate them (cheap; refreshed
        by autovacuum), reused for TABLE_ROWS_TTL_S."""
        estimate, when = self._table_rows
        now = time.monotonic()
        if when >= 0 and now - when < TABLE_ROWS_TTL_S:
            return estimate
        found = conn.exec_driver_sql(
            "SELECT reltuples FROM pg_class WHERE oid = to_regclass(%(t)s)", {"t": self.table}
        ).scalar()
        estimate = float(found) if found is not None and float(found) > 0 else 0.0
        self._table_rows = (estimate, now)
        return estimate

    def search_keyword(
        self, dataset_id: str, query: str, k: int, where: SearchFilter | None = None
    ) -> list[Hit]:
        terms = query_terms(query)
        if not terms:
            return []
        params: dict[str, Any] = {"dataset": dataset_id, "k": k}
        conditions = postgres_where(where, params)
        documents_join = "JOIN documents d ON d.id = c.document_id " if conditions else ""
        parts = []
        for n, term in enumerate(terms):
            params[f"t{n}"] = term
            parts.append(f"phraseto_tsquery('{TS_CONFIG}', :t{n})")
        tsquery = " || ".join(parts)
        with self.db.read() as conn:
            rows = conn.execute(
                text(
                    "SELECT c.id, c.document_id, c.ordinal, c.text, c.page_start, c.page_end, "
                    f"c.section, ts_rank_cd(v.{self.words}, q.query) AS score FROM {self.table} v "
                    f"JOIN chunks c ON c.seq = v.seq {documents_join}, "
                    f"(SELECT {tsquery} AS query) q "
                    f"WHERE v.dataset_id = :dataset AND v.active AND v.{self.words} @@ q.query"
                    f"{conditions} ORDER BY score DESC, c.seq LIMIT :k"
                ),
                params,
            ).all()
        return [_hit(row) for row in rows]


def _hit(row: Any) -> Hit:
    chunk, document, ordinal, body, page_start, page_end, section, score = row
    return Hit(chunk, document, ordinal, body, page_start, page_end, section, float(score))


def _literal(vector: npt.NDArray[np.float32]) -> str:
    """pgvector's text form, '[x,y,…]' (float32 values printed exactly)."""
    values = np.asarray(vector, dtype=np.float32)
    return "[" + ",".join(map(repr, values.tolist())) + "]"


def _first_line(exc: BaseException) -> str:
    original = getattr(exc, "orig", exc)
    return str(original).strip().splitlines()[0] if str(original).strip() else type(exc).__name__
