"""The embedded index: sqlite-vec for vectors, FTS5 for words, both in the SQLite database file.

Chunk rows live in the declared `chunks` table; the two virtual tables are keyed by its integer
primary key `seq` (SQLite's rowid, kept by VACUUM). The vector table carries the dataset (as a
64-bit key derived from its id: sqlite-vec keeps a text value longer than 12 bytes out of line,
and comparing a UUID there doubled the time of a 10,000-vector search) and `active` as metadata
columns, so a KNN query is filtered inside sqlite-vec (exact, not afterwards); the join with the
chunk checks the dataset id itself. A start that finds the older table keyed by the dataset's id
(`chunk_vectors_<dim>`) moves its vectors over and drops it, in one transaction.
Each vector is also kept in a plain table keyed by `seq` (`<vector table>_rows`), written and
deleted in the same transactions: sqlite-vec reads one vector by rowid in about 325 µs at a
million chunks (it unpacks a 1.5 MB chunk of vectors), the plain table in 9 µs, so the exact
scoring of a graph's candidates and of a small dataset reads from there. A start that finds no
plain table fills it from sqlite-vec's in the transaction that creates it (vector_rows.py).
Datasets of `GRAPH_MIN_CHUNKS` chunks or more are searched through inverted lists of int8 codes
kept beside the database (graphs.py, lists.py), every candidate scored exactly here against what
is active; smaller ones,
and searches whose filter admits few chunks, are exact over the dataset's own rows (their cost
grows with the dataset, not with the table). The changes a graph follows are logged by the
writes below, in their own transactions.
Once the whole table holds `KEYWORD_MIN_CHUNKS` active chunks, keyword searches go through a
Tantivy index kept beside the database from the same log (keywords.py), its candidates kept here
when active and admitted; FTS5 answers until it is built and whenever it cannot answer alone.
The keyword table's name carries the version of the terms it holds (terms.py): a start that finds
an older one fills the new one from the chunks' text and drops the old, in one transaction.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from sqlalchemy import Connection, text, update
from sqlalchemy.engine import make_url

from knowledgeops.db.engine import Database, Tx
from knowledgeops.db.schema import documents
from knowledgeops.errors import IndexUnavailable
from knowledgeops.ingest.index import lists, vector_rows
from knowledgeops.ingest.index.admitted import AdmittedBitmaps, Way
from knowledgeops.ingest.index.base import Hit, IndexedChunk, chunk_row
from knowledgeops.ingest.index.counts import ActiveCounts
from knowledgeops.ingest.index.filters import SearchFilter, sqlite_passing, sqlite_where
from knowledgeops.ingest.index.graphs import RESET, Graphs, candidate_asks, create_tables
from knowledgeops.ingest.index.keys import dataset_key
from knowledgeops.ingest.index.keywords import (
    KEYWORD_MIN_CHUNKS,
    Keywords,
    SqliteChanges,
    TableChunks,
)
from knowledgeops.ingest.index.keywords import asks as keyword_asks
from knowledgeops.ingest.index.keywords import create_table as create_keyword_table
from knowledgeops.ingest.index.terms import TERMS_VERSION, index_text, query_terms

SQLITE_MAX_VARS = 500  # ids per IN (...) list
_T = TypeVar("_T")
VEC_MAX_K = 4096  # sqlite-vec's limit on k
FTS_PREFIX = "chunk_fts"
VEC_VERSION = "v2"  # the dataset as a 64-bit key (v1: its id as text)
REBUILD_BATCH = 2000  # rows re-written per statement when the terms or the vector table change
KEYWORD_HEADROOM = 4  # the FTS table's best k · this are joined first (search_keyword)
KEYWORD_MIN_HEAD = 100
KEYWORD_MAX_HEAD = 4000
GRAPH_MIN_CHUNKS = 1000  # a dataset's active chunks from which its search goes through a graph
# (the exact search pays about 12 µs a chunk: 12 ms at 1,000, 37 ms at 3,000; docs/performance.md)


class SqliteIndex:
    def __init__(
        self,
        db: Database,
        dimension: int,
        *,
        graph_min_chunks: int = GRAPH_MIN_CHUNKS,
        keyword_min_chunks: int = KEYWORD_MIN_CHUNKS,
        filter_bitmaps: bool = True,
    ) -> None:
        if not db.is_sqlite:
            raise ValueError("SqliteIndex needs a SQLite database")
        self.db = db
        self.dimension = dimension
        self.vec = f"chunk_vectors_{dimension}_{VEC_VERSION}"
        self.legacy_vec = f"chunk_vectors_{dimension}"  # keyed by the dataset's id as text
        self.rows = f"{self.vec}_rows"  # each vector by seq, for exact scoring
        self.fts = f"{FTS_PREFIX}_v{TERMS_VERSION}"
        self.graph_min_chunks = graph_min_chunks
        self.graphs = Graphs(db, self.vec, self.rows, dimension, side_folder(db, "graphs"))
        self.log = self.graphs.log
        self.keyword_min_chunks = keyword_min_chunks
        self.keyword_log = SqliteChanges(db, self.vec, self.log)
        self.keywords = Keywords(self.keyword_log, side_folder(db, "keywords"))
        self.counts = ActiveCounts(db)  # each search's counts, kept between two commits
        self.table_chunks = TableChunks(db)
        # the chunks each filter admits in a large dataset: its scan skips the rest (off: a
        # filtered search scans every code and asks for as many more as the filter drops)
        self.admitted = AdmittedBitmaps(db, self.log, self.graphs.log_floor)
        self.filter_bitmaps = filter_bitmaps

    def close(self) -> None:
        """Stop keeping the graphs (they are snapshotted, so the next start loads them) and the
        keyword index (committed: the next start opens it)."""
        self.admitted.close()
        self.graphs.close()
        self.keywords.close()
        self.counts.close()

    def ensure(self) -> None:
        """Create the virtual tables if they are missing (idempotent; runs at start-up); a
        keyword index made before is opened and followed again (its state row says so), and the
        state of one made of older terms is dropped (it is rebuilt when searches need it)."""
        with self.db.write() as conn:
            conn.exec_driver_sql(
                f"CREATE VIRTUAL TABLE IF NOT EXISTS {self.vec} USING vec0("
                f"embedding float[{self.dimension}] distance_metric=cosine, "
                "dataset_key integer, active integer)"
            )
            create_tables(conn, self.vec)
            create_keyword_table(conn, self.vec)
            kept = conn.exec_driver_sql(f"SELECT 1 FROM {self.keyword_log.state}").first()
            stale = conn.exec_driver_sql(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE ? AND name != ?",
                (f"{self.vec}_keywords%", self.keyword_log.state),
            ).all()
            for (name,) in stale:
                conn.exec_driver_sql(f"DROP TABLE {name}")
            self._move_legacy_vectors(conn)
            vector_rows.create(conn, self.vec, self.rows, self.dimension)
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
        if kept is not None:  # a keyword index was made: follow the log from the start
            self.keywords.want()

    def _move_legacy_vectors(self, conn: Connection) -> None:
        found = conn.exec_driver_sql(
            "SELECT 1 FROM sqlite_master WHERE name = ?", (self.legacy_vec,)
        ).first()
        if found is None:
            return
        last = 0
        while True:
            rows = conn.exec_driver_sql(
                f"SELECT rowid, embedding, dataset_id, active FROM {self.legacy_vec} "
                "WHERE rowid > ? ORDER BY rowid LIMIT ?",
                (last, REBUILD_BATCH),
            ).all()
            if not rows:
                break
            conn.exec_driver_sql(
                f"INSERT INTO {self.vec} (rowid, embedding, dataset_key, active) "
                "VALUES (?, ?, ?, ?)",
                [(seq, blob, dataset_key(dataset), active) for seq, blob, dataset, active in rows],
            )
            last = rows[-1][0]
        conn.exec_driver_sql(f"DROP TABLE {self.legacy_vec}")

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
        """The index's tables exist (`ensure` makes them)."""
        tables = (
            self.vec,
            self.rows,
            self.fts,
            self.log,
            self.graphs.snapshots,
            self.keyword_log.state,
        )
        with self.db.read() as conn:
            found = {
                row[0]
                for row in conn.exec_driver_sql(
                    f"SELECT name FROM sqlite_master WHERE name IN ({','.join('?' * len(tables))})",
                    (*tables,),
                )
            }
        missing = sorted(set(tables) - found)
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
        stored = list(self._seqs(tx, ids).values())
        if stored:
            self._log_active_removed(tx, stored, dataset_key(chunks[0].dataset_id))
        self._drop_index_rows(tx, stored)
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
        blobs = [(seqs[c.id], _blob(c.vector), dataset_key(c.dataset_id)) for c in chunks]
        tx.exec_driver_sql(
            f"INSERT INTO {self.vec} (rowid, embedding, dataset_key, active) VALUES (?, ?, ?, 0)",
            blobs,
        )
        tx.exec_driver_sql(
            f"INSERT INTO {self.rows} (seq, embedding) VALUES (?, ?)",
            [(seq, blob) for seq, blob, _ in blobs],
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
        dataset = tx.exec_driver_sql(
            "SELECT dataset_id FROM documents WHERE id = ?", (document_id,)
        ).scalar()
        key = dataset_key(str(dataset))
        older = self._rowids(tx, "document_id = ? AND generation != ?", (document_id, generation))
        self._log(tx, key, older, added=False)
        for part in _parts(live):
            marks = ",".join("?" * len(part))
            tx.exec_driver_sql(
                f"UPDATE {self.vec} SET active = 1 WHERE rowid IN ({marks})", tuple(part)
            )
        self._log(tx, key, live, added=True)
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
        rows = tx.exec_driver_sql(
            "SELECT seq, dataset_id FROM chunks WHERE document_id = ?", (document_id,)
        ).all()
        if rows:
            self._log(tx, dataset_key(rows[0][1]), [row[0] for row in rows], added=False)
        self._delete(tx, "document_id = ?", (document_id,))

    def delete_dataset(self, tx: Tx, dataset_id: str) -> None:
        self._log(tx, dataset_key(dataset_id), [RESET], added=False)
        self._delete(tx, "dataset_id = ?", (dataset_id,))

    def _log(self, tx: Connection, key: int, seqs: Sequence[int], *, added: bool) -> None:
        """What the dataset's graph must follow (graphs.py), in the change's transaction."""
        if seqs:
            tx.exec_driver_sql(
                f"INSERT INTO {self.log} (dataset_key, seq, added) VALUES (?, ?, ?)",
                [(key, seq, int(added)) for seq in seqs],
            )
            self.graphs.logged(len(seqs))

    def _log_active_removed(self, tx: Connection, seqs: Sequence[int], key: int) -> None:
        for part in _parts(seqs):
            marks = ",".join("?" * len(part))
            active = tx.exec_driver_sql(
                f"SELECT rowid FROM {self.vec} WHERE rowid IN ({marks}) AND active = 1",
                tuple(part),
            ).all()
            self._log(tx, key, [row[0] for row in active], added=False)

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
            conn.exec_driver_sql(f"DELETE FROM {self.rows} WHERE seq IN ({marks})", tuple(part))
            conn.exec_driver_sql(f"DELETE FROM {self.fts} WHERE rowid IN ({marks})", tuple(part))

    # --- reads ----------------------------------------------------------------------------------
    def scans_every_core(self, dataset_id: str, where: SearchFilter | None = None) -> bool:
        """The search will scan the dataset's lists, on every core (lists.SEARCH_THREADS): it
        admits enough chunks for them and they are built. A smaller dataset is scored exactly
        in SQLite, on one core, and a lookup beside it takes no turn from it."""
        if lists.SEARCH_THREADS < 2:
            return False
        admitted, total = self.counts.of(dataset_id, where)
        large = min(admitted, total) >= self.graph_min_chunks
        return large and self.graphs.ready(dataset_key(dataset_id))

    def search_vector(
        self,
        dataset_id: str,
        vector: npt.NDArray[np.float32],
        k: int,
        where: SearchFilter | None = None,
        *,
        fused: bool = False,
    ) -> list[Hit]:
        """Through the dataset's lists when it is large (candidates scored exactly against
        what is active now), else exact over the dataset's rows; exact also when the lists are
        not there yet or answer fewer than they must, asked twice (graphs.candidate_asks). A
        `fused` list scans fewer of the dataset's lists (lists.PROBE_SHARE_FUSED)."""
        filtered = where is not None and not where.empty
        admitted, total = self.counts.of(dataset_id, where)
        if admitted == 0:
            return []
        with self.db.read() as conn:
            if total >= self.graph_min_chunks and admitted >= self.graph_min_chunks:
                key = dataset_key(dataset_id)
                share = lists.PROBE_SHARE_FUSED if fused else lists.PROBE_SHARE
                # a filter's bitmap, once built (admitted.py): the scan skips what the filter
                # does not admit and asks for an unfiltered search's candidates, or scans it
                # all and the bitmap keeps the admitted candidates, whichever is faster here
                bitmap = None
                if (
                    where is not None
                    and filtered
                    and self.filter_bitmaps
                    and self.graphs.ready(key)
                ):
                    bitmap = self.admitted.of(conn, key, dataset_id, where, admitted / total)
                skip = bitmap is not None and bitmap.way is Way.SKIP
                passing = 1.0 if skip else admitted / total
                selector = bitmap.selector if bitmap is not None and skip else None
                for ask, want in enumerate(candidate_asks(k, passing)):
                    began = time.perf_counter()
                    seqs = self.graphs.nearest(conn, key, vector, want, share, selector)
                    if seqs is None:
                        break
                    if bitmap is not None:
                        if ask == 0:
                            bitmap.timed(time.perf_counter() - began)
                        if not skip:
                            seqs = bitmap.admits(seqs)
                    hits = self._scored(conn, dataset_id, vector, seqs, where, k)
                    if len(hits) >= min(k, admitted):
                        return hits
                if not filtered:  # the graph is being built: sqlite-vec's scan is the fastest
                    return self._scan(conn, dataset_id, vector, k)
            return self._exact(conn, dataset_id, vector, k, where)

    def _scored(
        self,
        conn: Connection,
        dataset_id: str,
        vector: npt.NDArray[np.float32],
        seqs: Sequence[int],
        where: SearchFilter | None,
        k: int,
    ) -> list[Hit]:
        """The best k of the candidate chunks `seqs` that are active now in the dataset and
        pass `where`, by exact cosine."""
        if not seqs:
            return []
        params: list[Any] = [_blob(vector), json.dumps(list(seqs)), dataset_id]
        conditions = sqlite_where(where, params)
        params.append(k)
        best = conn.exec_driver_sql(
            "SELECT c.seq, 1.0 - vec_distance_cosine(v.embedding, ?) AS score "
            "FROM chunks c JOIN documents d ON d.id = c.document_id "
            "AND d.active_generation = c.generation "
            f"JOIN {self.rows} v ON v.seq = c.seq "
            "WHERE c.seq IN (SELECT value FROM json_each(?)) AND c.dataset_id = ?"
            f"{conditions} ORDER BY score DESC, c.seq LIMIT ?",
            tuple(params),
        ).all()
        return _hits(conn, [(seq, score) for seq, score in best])

    def _scan(
        self, conn: Connection, dataset_id: str, vector: npt.NDArray[np.float32], k: int
    ) -> list[Hit]:
        """sqlite-vec's exact KNN (a scan of the whole vector table, filtered inside it)."""
        rows = conn.exec_driver_sql(
            f"SELECT c.id, c.document_id, c.ordinal, c.text, c.page_start, c.page_end, "
            f"c.section, 1.0 - v.distance FROM (SELECT rowid, distance FROM {self.vec} "
            "WHERE embedding MATCH ? AND k = ? AND dataset_key = ? AND active = 1) v "
            "JOIN chunks c ON c.seq = v.rowid WHERE c.dataset_id = ? "
            "ORDER BY v.distance, c.seq",
            (_blob(vector), min(k, VEC_MAX_K), dataset_key(dataset_id), dataset_id),
        ).all()
        return [Hit(*row) for row in rows]

    def _exact(
        self,
        conn: Connection,
        dataset_id: str,
        vector: npt.NDArray[np.float32],
        k: int,
        where: SearchFilter | None,
    ) -> list[Hit]:
        """Exact cosine over the chunks of the dataset's documents that `where` admits (found
        through the documents and chunks indexes: the cost grows with what is admitted)."""
        params: list[Any] = [_blob(vector), dataset_id]
        conditions = sqlite_where(where, params)
        params.append(k)
        best = conn.exec_driver_sql(
            "SELECT c.seq, 1.0 - vec_distance_cosine(v.embedding, ?) AS score "
            "FROM documents d JOIN chunks c ON c.document_id = d.id "
            "AND c.generation = d.active_generation "
            f"JOIN {self.rows} v ON v.seq = c.seq WHERE d.dataset_id = ?{conditions} "
            "ORDER BY score DESC, c.seq LIMIT ?",
            tuple(params),
        ).all()
        return _hits(conn, [(seq, score) for seq, score in best])

    def search_keyword(
        self, dataset_id: str, query: str, k: int, where: SearchFilter | None = None
    ) -> list[Hit]:
        """The best chunks by BM25: through the Tantivy index once the table is large
        (keywords.py), else FTS5's. Ranking every chunk that holds a word of the question is
        FTS5's own work; joining each of them to its chunk and document to keep those of this
        dataset's active generations cost as much again (10,000 chunks: 10 ms, then 19). So
        the FTS table's best `k · KEYWORD_HEADROOM` are taken first and joined: when at least k
        of them pass, they are exactly the best k that pass (any other passing chunk ranks
        below them); otherwise (other datasets, a filter) the full query runs."""
        terms = query_terms(query)
        if not terms:
            return []
        if self._keywords_wanted():
            found = self._keyword_index(dataset_id, terms, k, where)
            if found is not None:
                return found
        match = " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)
        if where is None or where.empty:
            headroom = min(max(k * KEYWORD_HEADROOM, KEYWORD_MIN_HEAD), KEYWORD_MAX_HEAD)
            hits, ranked = self._keyword_head(dataset_id, match, k, headroom)
            if len(hits) >= k or ranked < headroom:
                return hits
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

    def _keywords_wanted(self) -> bool:
        """Whether searches go through the keyword index: once it is made, or once the table
        holds `keyword_min_chunks` active chunks (counted again every minute)."""
        return self.keywords.ready or self.table_chunks.count() >= self.keyword_min_chunks

    def _keyword_index(
        self, dataset_id: str, terms: list[str], k: int, where: SearchFilter | None
    ) -> list[Hit] | None:
        """The best k by the keyword index's candidates, kept when active and admitted; None
        when the index cannot answer alone (not built, far behind, short under a filter)."""
        share = 1.0
        if where is not None and not where.empty:
            admitted, total = self.counts.of(dataset_id, where)
            if admitted == 0:
                return []
            share = admitted / max(total, 1)
        key = dataset_key(dataset_id)
        with self.db.read() as conn:
            for want in keyword_asks(k, share):
                found = self.keywords.candidates(conn, key, terms, want)
                if found is None:
                    return None
                scores = dict(found.scored)
                passing = sqlite_passing(conn, list(scores), dataset_id, where)
                best = sorted(passing, key=lambda seq: (-scores[seq], seq))[:k]
                if len(best) >= k or found.ranked < want:  # exactly the best k that pass
                    return _hits(conn, [(seq, scores[seq]) for seq in best])
            return None  # more may pass below the widest ask: FTS5 decides

    def _keyword_head(
        self, dataset_id: str, match: str, k: int, headroom: int
    ) -> tuple[list[Hit], int]:
        """The best k of the FTS table's best `headroom` that are this dataset's and active,
        and how many the FTS table ranked (fewer than `headroom`: every match was seen)."""
        with self.db.read() as conn:
            head = conn.exec_driver_sql(
                f"SELECT rowid, -bm25({self.fts}) AS score FROM {self.fts} WHERE {self.fts} "
                "MATCH ? ORDER BY score DESC, rowid LIMIT ?",
                (match, headroom),
            ).all()
            if not head:
                return [], 0
            scores: dict[int, float] = dict(head)
            marks = ",".join("?" * len(head))
            passing = conn.exec_driver_sql(
                "SELECT c.seq FROM chunks c JOIN documents d ON d.id = c.document_id "
                f"AND d.active_generation = c.generation WHERE c.seq IN ({marks}) "
                "AND c.dataset_id = ?",
                (*scores, dataset_id),
            ).scalars()
            best = sorted(passing, key=lambda seq: (-scores[seq], seq))[:k]
            return _hits(conn, [(seq, scores[seq]) for seq in best]), len(head)


def side_folder(db: Database, kind: str) -> Path | None:
    """Where the index's side structures live beside the database file: `<file>.graphs/`
    (the graphs' snapshots), `<file>.keywords/` (the keyword index); none for a database in
    memory."""
    name = make_url(db.url).database
    if not name or name == ":memory:" or name.startswith("file::memory:"):
        return None
    return Path(name).with_name(f"{Path(name).name}.{kind}")


def graph_folder(db: Database) -> Path | None:
    return side_folder(db, "graphs")


def _hits(conn: Connection, best: Sequence[tuple[int, float]]) -> list[Hit]:
    """The chunks `best` names (seq, score), as hits in that order. A search ranks its
    candidates by their seq alone and reads the texts of the k it keeps only: sorting 160
    candidates with their texts cost twice as long (5.0 ms against 3.6 at 100,000 chunks)."""
    if not best:
        return []
    rows = {
        row[0]: row
        for row in conn.exec_driver_sql(
            "SELECT c.seq, c.id, c.document_id, c.ordinal, c.text, c.page_start, c.page_end, "
            "c.section FROM chunks c WHERE c.seq IN (SELECT value FROM json_each(?))",
            (json.dumps([seq for seq, _ in best]),),
        )
    }
    return [
        Hit(row[1], row[2], row[3], row[4], row[5], row[6], row[7], score)
        for row, score in ((rows[seq], score) for seq, score in best)
    ]


def _blob(vector: npt.NDArray[np.float32]) -> bytes:
    return np.asarray(vector, dtype=np.float32).tobytes()


def _parts(ids: Sequence[_T]) -> Iterable[Sequence[_T]]:
    for start in range(0, len(ids), SQLITE_MAX_VARS):
        yield ids[start : start + SQLITE_MAX_VARS]
