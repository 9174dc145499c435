"""The embedded index: sqlite-vec for vectors, FTS5 for words, both in the SQLite database file.

Chunk rows live in the declared `chunks` table; the two virtual tables are keyed by its integer
primary key `seq` (SQLite's rowid, kept by VACUUM). The vector table carries `dataset_id` and
`active` as metadata columns, so a KNN query is filtered inside sqlite-vec (exact, not afterwards).
The keyword table's name carries the version of the terms it holds (terms.py): a start that finds
an older one fills the new one from the chunks' text and drops the old, in one transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from sqlalchemy import Connection, text, update

from knowledgeops.db.engine import Database, Tx
from knowledgeops.db.schema import documents
from knowledgeops.errors import IndexUnavailable
from knowledgeops.ingest.index.base import Hit, IndexedChunk, chunk_row
from knowledgeops.ingest.index.filters import SearchFilter, sqlite_where
from knowledgeops.ingest.index.terms import TERMS_VERSION, index_text, query_terms

SQLITE_MAX_VARS = 500  # ids per IN (...) list
_T = TypeVar("_T")
VEC_MAX_K = 4096  # sqlite-vec's limit on k
FTS_PREFIX = "chunk_fts"
REBUILD_BATCH = 2000  # chunks re-tokenized per statement when the terms change


class SqliteIndex:
    def __init__(self, db: Database, dimension: int) -> None:
        if not db.is_sqlite:
            raise ValueError("SqliteIndex needs a SQLite database")
        self.db = db
        self.dimension = dimension
        self.vec = f"chunk_vectors_{dimension}"
        self.fts = f"{FTS_PREFIX}_v{TERMS_VERSION}"

    def ensure(self) -> None:
        """Create the virtual tables if they are missing (idempotent; runs at start-up)."""
        with self.db.write() as conn:
            conn.exec_driver_sql(
                f"CREATE VIRTUAL TABLE IF NOT EXISTS {self.vec} USING vec0("
                f"embedding float[{self.dimension}] distance_metric=cosine, "
                "dataset_id text, active integer)"
            )
            older = [
                row[0]
                for row in conn.exec_driver_sql(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND sql LIKE "
                    "'CREATE VIRTUAL TABLE%fts5%' AND (name = ? OR name LIKE ?) AND name != ?",
                    (FTS_PREFIX, f"{FTS_PREFIX}_v%", self.fts),
                )
            ]
            conn.exec_driver_sql(
                f"CREATE VIRTUAL TABLE IF NOT EXISTS {self.fts} USING fts5(text, content='', "
                "contentless_delete=1, tokenize='unicode61 remove_diacritics 2')"
            )
            if older:
                self._rebuild_keywords(conn)
                for name in older:
                    conn.exec_driver_sql(f"DROP TABLE {name}")

    def _rebuild_keywords(self, conn: Connection) -> None:
        """Fill the keyword table from every chunk's text (the terms changed since it was made)."""
        conn.exec_driver_sql(f"DELETE FROM {self.fts}")
        last = 0
        while True:
            rows = conn.exec_driver_sql(
                "SELECT seq, text FROM chunks WHERE seq > ? ORDER BY seq LIMIT ?",
                (last, REBUILD_BATCH),
            ).all()
            if not rows:
                return
            conn.exec_driver_sql(
                f"INSERT INTO {self.fts} (rowid, text) VALUES (?, ?)",
                [(seq, index_text(body)) for seq, body in rows],
            )
            last = rows[-1][0]

    def verify(self) -> None:
        """The two virtual tables exist (`ensure` makes them)."""
        with self.db.read() as conn:
            found = {
                row[0]
                for row in conn.exec_driver_sql(
                    "SELECT name FROM sqlite_master WHERE name IN (?, ?)", (self.vec, self.fts)
                )
            }
        missing = sorted({self.vec, self.fts} - found)
        if missing:
            raise IndexUnavailable(
                f"the index tables {', '.join(missing)} do not exist: run `kops migrate`"
            )

    # --- writes ---------------------------------------------------------------------------------
    def upsert(self, tx: Tx, chunks: Sequence[IndexedChunk]) -> None:
        """Insert or overwrite `chunks` (a batch: one statement per table, executed many)."""
        if not chunks:
            return
        ids = [chunk.id for chunk in chunks]
        # a retry overwrites its own rows: their vector and keyword rows go first
        self._drop_index_rows(tx, list(self._seqs(tx, ids).values()))
        tx.execute(
            text(
                "INSERT INTO chunks (id, document_id, dataset_id, generation, ordinal, text, "
                "content_hash, token_count, page_start, page_end, section) VALUES (:id, "
                ":document_id, :dataset_id, :generation, :ordinal, :text, :content_hash, "
                ":token_count, :page_start, :page_end, :section) ON CONFLICT (id) DO UPDATE "
                "SET text = excluded.text, content_hash = excluded.content_hash, "
                "token_count = excluded.token_count, page_start = excluded.page_start, "
                "page_end = excluded.page_end, section = excluded.section"
            ),
            [chunk_row(chunk) for chunk in chunks],
        )
        seqs = self._seqs(tx, ids)
        tx.exec_driver_sql(
            f"INSERT INTO {self.vec} (rowid, embedding, dataset_id, active) VALUES (?, ?, ?, 0)",
            [(seqs[c.id], _blob(c.vector), c.dataset_id) for c in chunks],
        )
        tx.exec_driver_sql(
            f"INSERT INTO {self.fts} (rowid, text) VALUES (?, ?)",
            [(seqs[c.id], index_text(c.text)) for c in chunks],
        )

    @staticmethod
    def _seqs(conn: Connection, ids: Sequence[str]) -> dict[str, int]:
        """The rowid (`seq`) of each stored chunk among `ids`."""
        found: dict[str, int] = {}
        for part in _parts(ids):
            marks = ",".join("?" * len(part))
            rows = conn.exec_driver_sql(
                f"SELECT id, seq FROM chunks WHERE id IN ({marks})", tuple(part)
            ).all()
            found.update({row[0]: row[1] for row in rows})
        return found

    def activate(self, tx: Tx, document_id: str, generation: int) -> int:
        live = self._rowids(tx, "document_id = ? AND generation = ?", (document_id, generation))
        for part in _parts(live):
            marks = ",".join("?" * len(part))
            tx.exec_driver_sql(
                f"UPDATE {self.vec} SET active = 1 WHERE rowid IN ({marks})", tuple(part)
            )
        self._delete(tx, "document_id = ? AND generation != ?", (document_id, generation))
        tx.execute(
            update(documents)
            .where(documents.c.id == document_id)
            .values(active_generation=generation, chunk_count=len(live))
        )
        return len(live)

    def discard(
        self, tx: Tx, document_id: str, generation: int, ordinals: tuple[int, int] | None = None
    ) -> None:
        if ordinals is None:
            self._delete(tx, "document_id = ? AND generation = ?", (document_id, generation))
            return
        self._delete(
            tx,
            "document_id = ? AND generation = ? AND ordinal >= ? AND ordinal < ?",
            (document_id, generation, *ordinals),
        )

    def delete_document(self, tx: Tx, document_id: str) -> None:
        self._delete(tx, "document_id = ?", (document_id,))

    def delete_dataset(self, tx: Tx, dataset_id: str) -> None:
        self._delete(tx, "dataset_id = ?", (dataset_id,))

    def _rowids(self, conn: Connection, where: str, params: tuple[Any, ...]) -> list[int]:
        rows = conn.exec_driver_sql(f"SELECT seq FROM chunks WHERE {where}", params).all()
        return [row[0] for row in rows]

    def _delete(self, conn: Connection, where: str, params: tuple[Any, ...]) -> None:
        rowids = self._rowids(conn, where, params)
        self._drop_index_rows(conn, rowids)
        for part in _parts(rowids):
            marks = ",".join("?" * len(part))
            conn.exec_driver_sql(f"DELETE FROM chunks WHERE seq IN ({marks})", tuple(part))

    def _drop_index_rows(self, conn: Connection, rowids: Sequence[int]) -> None:
        for part in _parts(rowids):
            marks = ",".join("?" * len(part))
            conn.exec_driver_sql(f"DELETE FROM {self.vec} WHERE rowid IN ({marks})", tuple(part))
            conn.exec_driver_sql(f"DELETE FROM {self.fts} WHERE rowid IN ({marks})", tuple(part))

    # --- reads ----------------------------------------------------------------------------------
    def search_vector(
        self,
        dataset_id: str,
        vector: npt.NDArray[np.float32],
        k: int,
        where: SearchFilter | None = None,
    ) -> list[Hit]:
        if where is not None and not where.empty:
            return self._search_vector_filtered(dataset_id, vector, k, where)
        with self.db.read() as conn:
            rows = conn.exec_driver_sql(
                f"SELECT c.id, c.document_id, c.ordinal, c.text, c.page_start, c.page_end, "
                f"c.section, 1.0 - v.distance FROM (SELECT rowid, distance FROM {self.vec} "
                "WHERE embedding MATCH ? AND k = ? AND dataset_id = ? AND active = 1) v "
                "JOIN chunks c ON c.seq = v.rowid ORDER BY v.distance, c.seq",
                (_blob(vector), min(k, VEC_MAX_K), dataset_id),
            ).all()
        return [Hit(*row) for row in rows]

    def _search_vector_filtered(
        self, dataset_id: str, vector: npt.NDArray[np.float32], k: int, where: SearchFilter
    ) -> list[Hit]:
        """Exact cosine over the chunks of the documents the filter admits (sqlite-vec's KNN
        cannot filter on documents; it is a scan too, so this costs what it would)."""
        params: list[Any] = [_blob(vector), dataset_id]
        conditions = sqlite_where(where, params)
        params.append(k)
        with self.db.read() as conn:
            rows = conn.exec_driver_sql(
                "SELECT c.id, c.document_id, c.ordinal, c.text, c.page_start, c.page_end, "
                "c.section, 1.0 - vec_distance_cosine(v.embedding, ?) AS score "
                "FROM documents d JOIN chunks c ON c.document_id = d.id "
                "AND c.generation = d.active_generation "
                f"JOIN {self.vec} v ON v.rowid = c.seq WHERE d.dataset_id = ?{conditions} "
                "ORDER BY score DESC, c.seq LIMIT ?",
                tuple(params),
            ).all()
        return [Hit(*row) for row in rows]

    def search_keyword(
        self, dataset_id: str, query: str, k: int, where: SearchFilter | None = None
    ) -> list[Hit]:
        terms = query_terms(query)
        if not terms:
            return []
        match = " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)
        params: list[Any] = [match, dataset_id]
        conditions = sqlite_where(where, params)
        params.append(k)
        with self.db.read() as conn:
            rows = conn.exec_driver_sql(
                f"SELECT c.id, c.document_id, c.ordinal, c.text, c.page_start, c.page_end, "
                f"c.section, -bm25({self.fts}) AS score FROM {self.fts} "
                f"JOIN chunks c ON c.seq = {self.fts}.rowid "
                "JOIN documents d ON d.id = c.document_id AND d.active_generation = c.generation "
                f"WHERE {self.fts} MATCH ? AND c.dataset_id = ?{conditions} "
                "ORDER BY score DESC, c.seq LIMIT ?",
                tuple(params),
            ).all()
        return [Hit(*row) for row in rows]


def _blob(vector: npt.NDArray[np.float32]) -> bytes:
    return np.asarray(vector, dtype=np.float32).tobytes()


def _parts(ids: Sequence[_T]) -> Iterable[Sequence[_T]]:
    for start in range(0, len(ids), SQLITE_MAX_VARS):
        yield ids[start : start + SQLITE_MAX_VARS]
