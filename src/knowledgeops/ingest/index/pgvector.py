"""The scale-out index: pgvector (HNSW, cosine) for vectors and PostgreSQL full-text (tsvector +
GIN) for words, in the same database as the chunks, fused by the search service (by score).

Chunk rows live in the declared `chunks` table; one row per chunk in `chunk_vectors_{dim}` holds
its vector, its words (`simple` configuration over the text with CJK runs cut into words by
terms.py, exactly as the SQLite index does) and whether its generation is active. The words'
column is named for the version of the terms (`words_v2`): `kops migrate` finds an older column,
fills the new one from the chunks' text and drops the old.

The table is partitioned by dataset (LIST, one partition per dataset, made at the dataset's
first write), so every dataset has its own HNSW graph and GIN index, as the embedded index has
a graph per dataset (docs/architecture.md, "Vector search at a million chunks"): pgvector 0.6
filters after the walk, and over one graph shared by every dataset a small dataset's
neighbours were a few of the rows the walk found. A query names its dataset, so the planner
reads that partition alone. Rows are deleted with their chunks by this adapter (every delete of
chunks goes through it), not by a foreign key: a cascade into a partitioned table probes every
partition for each row.

HNSW filters after the walk still for a metadata filter: a walk that comes back with fewer than
k rows is run again exactly, so a filter never makes a dataset look smaller than it is.

Keyword search at scale goes through a Tantivy index that each process serving searches keeps
beside the database (keywords.py, pg_changes.py): `ts_rank_cd` ranks every GIN match before it
keeps the best, seconds at 200,000 chunks. Every write logs the chunks it makes searchable or
drops in its own transaction; the index follows that log and its candidates are checked here.
The GIN index answers until it is built, and whenever it cannot answer alone.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import literal_column, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import DBAPIError

from knowledgeops.db.engine import Database, Tx
from knowledgeops.db.schema import chunks, documents
from knowledgeops.errors import IndexUnavailable
from knowledgeops.ingest.index.base import Hit, IndexedChunk, chunk_row
from knowledgeops.ingest.index.filters import SearchFilter, postgres_where
from knowledgeops.ingest.index.keys import dataset_key
from knowledgeops.ingest.index.keywords import (
    KEYWORD_MIN_CHUNKS,
    RESET,
    Keywords,
    TableChunks,
    asks,
)
from knowledgeops.ingest.index.pg_changes import (
    PgChanges,
    Pruner,
    Slot,
    create_tables,
    log_tables,
    take_slot,
    write_log,
)
from knowledgeops.ingest.index.pg_counts import KeptCounts
from knowledgeops.ingest.index.terms import TERMS_VERSION, index_text, query_terms

# chosen by measurement (docs/performance.md: Search at scale): at 200,000 chunks M 24 and
# ef_construction 128 searched at ef_search 200 find 0.965 of the exact top 10, where the former
# 16 and 64 found 0.939 at 400, in less time; 32 and 256 reach 0.98 for twice the build
HNSW_M = 24
HNSW_EF_CONSTRUCTION = 128
HNSW_EF_SEARCH = 200  # for a search the whole dataset passes; more for a filter's share:
# ef_search / share ** this (pgvector 0.6 filters after the walk). Measured at 200,000 chunks
# with a filter admitting half (docs/performance.md): 1 (ef 400) found 0.970 of the filtered
# exact top 10, 0.5 (ef 282) 0.9635, as much as the unfiltered walk at 200 (0.9605), for 30%
# less walk
FILTER_WIDEN_POWER = 0.5
# a hybrid search's vector list walks less far (widened for a filter alike): what hybrid must get
# right is the fused top 10, and its vector list is one of two votes on it. At a million chunks
# (docs/performance.md) 100 keeps 0.9495 of the fused top 10 that the exact vector list and every
# word of the question give, 200 0.9585; hybrid's p95 fell from 26.9 to 22.0 ms (2 cores)
HNSW_EF_FUSED = 100
HNSW_MAX_EF_SEARCH = 1000  # pgvector's limit
EXACT_SHARE = 0.1  # a filter admitting under this share of the dataset is searched exactly
EXACT_MAX_ROWS = 5_000  # … and so is a dataset (or a filter's share) under this many chunks
TS_CONFIG = "simple"  # no stemming, no stopword list: the same words in every language
REBUILD_BATCH = 2000  # chunks re-tokenized per statement when the terms change
LOCK = "SELECT pg_advisory_xact_lock(hashtext('kops.index.ensure'))"  # DDL, one process at once
log = logging.getLogger(__name__)


class PgVectorMissing(IndexUnavailable):
    """The database has no pgvector extension (or may not create it), or no index table."""


class PgVectorIndex:
    def __init__(
        self,
        db: Database,
        dimension: int,
        *,
        exact_max_rows: int = EXACT_MAX_ROWS,
        keyword_folder: Path | None = None,
        keyword_min_chunks: int = KEYWORD_MIN_CHUNKS,
    ) -> None:
        """`keyword_folder`: where this process keeps its keyword index once the table holds
        `keyword_min_chunks` active chunks (a slot of its own under it); None: never, the GIN
        index answers every keyword search."""
        if db.dialect != "postgresql":
            raise ValueError("PgVectorIndex needs a PostgreSQL database")
        self.db = db
        self.dimension = dimension
        self.table = f"chunk_vectors_{dimension}"
        self.words = f"words_v{TERMS_VERSION}"
        self.log = log_tables(self.table)[0]
        self.exact_max_rows = exact_max_rows
        self.keyword_folder = keyword_folder
        self.keyword_min_chunks = keyword_min_chunks
        self.pruner = Pruner(db, self.table)
        self._partitions: set[str] = set()  # datasets whose partition this process has seen
        self._keywords: Keywords | None = None
        self._slot: Slot | None = None
        self._keywords_lock = threading.Lock()
        self.table_chunks = TableChunks(db)
        self.counts = KeptCounts()  # each search's counts, kept for a moment (pg_counts.py)

    def partition(self, dataset_id: str) -> str:
        """The name of a dataset's partition (its id hashed: ids are not identifiers)."""
        digest = hashlib.md5(dataset_id.encode(), usedforsecurity=False).hexdigest()
        return f"{self.table}_{digest[:24]}"

    # --- the tables -----------------------------------------------------------------------------
    def ensure(self) -> None:
        """Create the extension, the table and its indexes if missing, move a table of the older
        shared layout into partitions, and drop the partitions of deleted datasets (idempotent;
        `kops migrate` runs it). Raises PgVectorMissing with what to do."""
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
            conn.exec_driver_sql(LOCK)  # two processes starting at once must not both create it
            shared = self._kind(conn) == "r"
            if shared:
                self._upgrade_words(conn, self.table)
                shared_table = self._retire_shared(conn)
            conn.exec_driver_sql(
                f"CREATE TABLE IF NOT EXISTS {self.table} ("
                "seq integer NOT NULL, "
                "dataset_id varchar(36) NOT NULL, "
                "active boolean NOT NULL DEFAULT false, "
                f"embedding vector({self.dimension}) NOT NULL, "
                f"{self.words} tsvector NOT NULL, "
                "PRIMARY KEY (seq, dataset_id)) PARTITION BY LIST (dataset_id)"
            )
            if shared:
                self._move_shared(conn, shared_table)
            else:
                self._upgrade_words(conn, self.table)
            self._drop_other_hnsw(conn)
            conn.exec_driver_sql(self.hnsw_ddl())  # on every partition, and each one made later
            conn.exec_driver_sql(
                f"CREATE INDEX IF NOT EXISTS ix_{self.table}_{self.words} ON {self.table} "
                f"USING gin ({self.words})"
            )
            create_tables(conn, self.table)
            self._drop_deleted_partitions(conn)

    def hnsw_options(self, conn: Tx) -> dict[str, int] | None:
        """The HNSW index's build parameters (m, ef_construction), None when it is missing."""
        found = conn.exec_driver_sql(
            "SELECT reloptions FROM pg_class WHERE oid = to_regclass(%(i)s)",
            {"i": f"ix_{self.table}_hnsw"},
        ).first()
        if found is None:
            return None
        options = dict(option.split("=", 1) for option in found[0] or [])
        return {name: int(value) for name, value in options.items()}

    def _drop_other_hnsw(self, conn: Tx) -> None:
        """An HNSW index built with other parameters than this version's is dropped, so that it
        is built again with them (every partition's graph, in `kops migrate`'s transaction)."""
        found = self.hnsw_options(conn)
        wanted = {"m": HNSW_M, "ef_construction": HNSW_EF_CONSTRUCTION}
        if found is not None and found != wanted:
            log.warning(
                "the HNSW index %s was built with %s: building it again with %s",
                f"ix_{self.table}_hnsw",
                found,
                wanted,
            )
            conn.exec_driver_sql(f"DROP INDEX ix_{self.table}_hnsw")

    def hnsw_ddl(self, m: int = HNSW_M, ef_construction: int = HNSW_EF_CONSTRUCTION) -> str:
        return (
            f"CREATE INDEX IF NOT EXISTS ix_{self.table}_hnsw ON {self.table} "
            f"USING hnsw (embedding vector_cosine_ops) WITH (m = {m}, "
            f"ef_construction = {ef_construction})"
        )

    def _kind(self, conn: Tx, table: str | None = None) -> str | None:
        """'p' for the partitioned table, 'r' for one of the older shared layout (or a plain
        table), None if none."""
        found = conn.exec_driver_sql(
            "SELECT relkind FROM pg_class WHERE oid = to_regclass(%(t)s)",
            {"t": table or self.table},
        ).scalar()
        return None if found is None else str(found)

    def _retire_shared(self, conn: Tx) -> str:
        """Rename a table of the older layout (one table, one HNSW graph for every dataset, rows
        deleted by a foreign key's cascade) out of the way, its indexes dropped."""
        old = f"{self.table}_shared"
        conn.exec_driver_sql(f"ALTER TABLE {self.table} RENAME TO {old}")
        for index in (f"ix_{self.table}_hnsw", f"ix_{self.table}_dataset"):
            conn.exec_driver_sql(f"DROP INDEX IF EXISTS {index}")
        conn.exec_driver_sql(f"DROP INDEX IF EXISTS ix_{self.table}_{self.words}")
        conn.exec_driver_sql(f"ALTER TABLE {old} DROP CONSTRAINT IF EXISTS {self.table}_pkey")
        return old

    def _move_shared(self, conn: Tx, old: str) -> None:
        """Every dataset's rows of the older table into its partition; then the table is
        dropped (the indexes are built after, each partition's graph at once)."""
        datasets = conn.exec_driver_sql(f"SELECT DISTINCT dataset_id FROM {old}").scalars()
        for dataset_id in list(datasets):
            self._attach(conn, str(dataset_id))
        conn.exec_driver_sql(
            f"INSERT INTO {self.table} (seq, dataset_id, active, embedding, {self.words}) "
            f"SELECT seq, dataset_id, active, embedding, {self.words} FROM {old}"
        )
        conn.exec_driver_sql(f"DROP TABLE {old}")

    def _attach(self, conn: Tx, dataset_id: str) -> None:
        """Make a dataset's partition (under LOCK). Made apart and attached: ATTACH PARTITION
        takes a SHARE UPDATE EXCLUSIVE lock on the table, which lets searches and writes of
        other datasets go on, where CREATE TABLE … PARTITION OF would take an exclusive one."""
        name = self.partition(dataset_id)
        present = conn.exec_driver_sql(
            "SELECT to_regclass(%(p)s) IS NOT NULL", {"p": name}
        ).scalar_one()
        if present:
            return
        value = "'" + dataset_id.replace("'", "''") + "'"
        conn.exec_driver_sql(f"CREATE TABLE {name} (LIKE {self.table} INCLUDING DEFAULTS)")
        conn.exec_driver_sql(
            f"ALTER TABLE {self.table} ATTACH PARTITION {name} FOR VALUES IN ({value})"
        )

    def _drop_deleted_partitions(self, conn: Tx) -> None:
        """A deleted dataset's partition is emptied in the deleting transaction (dropping it
        there would lock the whole table until that commits); the next `ensure` drops it."""
        prefix = f"{self.table}_"
        names = conn.exec_driver_sql(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass(%(t)s) AND NOT EXISTS (SELECT 1 FROM datasets d "
            "WHERE %(prefix)s || left(md5(d.id), 24) = c.relname)",
            {"t": self.table, "prefix": prefix},
        ).scalars()
        for name in list(names):
            conn.exec_driver_sql(f"DROP TABLE {name}")

    def _words_columns(self, conn: Tx, table: str) -> set[str]:
        rows = conn.exec_driver_sql(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %(t)s "
            "AND (column_name = 'words' OR column_name LIKE 'words\\_v%%')",
            {"t": table},
        )
        return {row[0] for row in rows}

    def _upgrade_words(self, conn: Tx, table: str) -> None:
        """Terms of an older version in the table: add this version's column, fill it from the
        chunks' text in batches, then drop the old columns (and their indexes with them)."""
        older = self._words_columns(conn, table) - {self.words}
        if not older:
            return
        conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {self.words} tsvector")
        last = 0
        while True:
            rows = conn.exec_driver_sql(
                f"SELECT v.seq, v.dataset_id, c.text FROM {table} v JOIN chunks c "
                "ON c.seq = v.seq WHERE v.seq > %(last)s ORDER BY v.seq LIMIT %(n)s",
                {"last": last, "n": REBUILD_BATCH},
            ).all()
            if not rows:
                break
            conn.execute(
                text(
                    f"UPDATE {table} SET {self.words} = to_tsvector('{TS_CONFIG}', :words) "
                    "WHERE seq = :seq AND dataset_id = :dataset"
                ),
                [
                    {"seq": seq, "dataset": dataset, "words": index_text(body)}
                    for seq, dataset, body in rows
                ],
            )
            last = rows[-1][0]
        conn.exec_driver_sql(f"ALTER TABLE {table} ALTER COLUMN {self.words} SET NOT NULL")
        for column in sorted(older):
            conn.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN {column}")

    def verify(self) -> None:
        """Check, without any DDL, that pgvector and this index's tables exist (every process
        start runs this; `kops migrate` runs `ensure`). Raises PgVectorMissing with what to do."""
        if self._installed_vector_version() is None:
            raise PgVectorMissing(
                "the database has no pgvector extension. Install pgvector ≥ 0.5 on the "
                "PostgreSQL server, then run `kops migrate` (it creates the extension)"
            )
        with self.db.read() as conn:
            kind = self._kind(conn)
            if kind is None:
                raise PgVectorMissing(
                    f"the index table {self.table} does not exist: run `kops migrate` first"
                )
            if kind != "p":
                raise PgVectorMissing(
                    f"the index table {self.table} has the older layout, one graph shared by "
                    "every dataset: run `kops migrate` (it moves each dataset into its own "
                    "partition and builds its graph)"
                )
            if self.words not in self._words_columns(conn, self.table):
                raise PgVectorMissing(
                    f"the index table {self.table} holds keyword terms of an older version: "
                    "run `kops migrate` (it rebuilds them from the chunks' text)"
                )
            if self._kind(conn, self.log) is None:
                raise PgVectorMissing(
                    f"the index table {self.table} has no change log ({self.log}), which the "
                    "keyword index follows: run `kops migrate` (it creates it)"
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
        """Stop keeping the keyword index (committed: a process that takes its slot opens it)
        and let its slot go; the database holds everything else."""
        with self._keywords_lock:
            keywords, self._keywords = self._keywords, None
            slot, self._slot = self._slot, None
        if keywords is not None:
            keywords.close()
        if slot is not None:
            slot.release()

    @property
    def keywords(self) -> Keywords | None:
        """This process's keyword index (its slot taken at first use), or None without a
        folder for it."""
        if self.keyword_folder is None:
            return None
        with self._keywords_lock:
            if self._keywords is None:
                self._slot = take_slot(self.keyword_folder)
                self._keywords = Keywords(
                    PgChanges(self.db, self.table, self._slot.folder), self._slot.folder / "index"
                )
            return self._keywords

    # --- writes ---------------------------------------------------------------------------------
    def _ensure_partition(self, dataset_id: str) -> None:
        """A dataset's partition, made at its first write in a transaction of its own (short,
        committed before the job's rows go in; the job's transaction holds no lock it needs)."""
        if dataset_id in self._partitions:
            return
        with self.db.write() as conn:
            conn.exec_driver_sql(LOCK)
            self._attach(conn, dataset_id)
        self._partitions.add(dataset_id)

    def upsert(self, tx: Tx, rows: Sequence[IndexedChunk]) -> None:
        if not rows:
            return
        for dataset_id in sorted({chunk.dataset_id for chunk in rows}):
            self._ensure_partition(dataset_id)
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
        ).returning(chunks.c.id, chunks.c.seq, literal_column("(xmax = 0)"))
        returned = tx.execute(upsert).all()
        seq_by_id = {row[0]: row[1] for row in returned}
        overwritten = {row[1] for row in returned if not row[2]}
        if overwritten:  # a retry overwrites its own rows: an active one leaves search until
            # its generation is activated again
            for dataset_id in sorted({chunk.dataset_id for chunk in rows}):
                self._log_change(
                    tx,
                    dataset_id,
                    f"WITH was AS (SELECT seq FROM {self.table} WHERE dataset_id = :dataset "
                    "AND seq = ANY(:seqs) AND active) "
                    f"INSERT INTO {self.log} (dataset_key, seq, added) "
                    "SELECT :key, seq, false FROM was",
                    {"seqs": sorted(overwritten)},
                )
        tx.execute(
            text(
                f"INSERT INTO {self.table} (seq, dataset_id, active, embedding, {self.words}) "
                f"VALUES (:seq, :dataset_id, false, CAST(:embedding AS vector), "
                f"to_tsvector('{TS_CONFIG}', :words)) ON CONFLICT (seq, dataset_id) DO UPDATE "
                f"SET active = false, embedding = excluded.embedding, "
                f"{self.words} = excluded.{self.words}"
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
        dataset_id = _dataset_of(tx, document_id)
        if dataset_id is not None:
            self._log_change(
                tx,
                dataset_id,
                f"WITH made AS (UPDATE {self.table} v SET active = true FROM chunks c "
                "WHERE v.dataset_id = :dataset AND c.seq = v.seq "
                "AND c.document_id = :document AND c.generation = :generation "
                "AND NOT v.active RETURNING v.seq) "
                f"INSERT INTO {self.log} (dataset_key, seq, added) "
                "SELECT :key, seq, true FROM made",
                {"document": document_id, "generation": generation},
            )
            self._delete(
                tx,
                dataset_id,
                "c.document_id = :document AND c.generation <> :generation",
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
        dataset_id = _dataset_of(tx, document_id)
        if dataset_id is None:
            return
        first, end = ordinals if ordinals is not None else (0, 2**31)
        self._delete(
            tx,
            dataset_id,
            "c.document_id = :document AND c.generation = :generation "
            "AND c.ordinal >= :first AND c.ordinal < :end",
            {"document": document_id, "generation": generation, "first": first, "end": end},
        )

    def delete_document(self, tx: Tx, document_id: str) -> None:
        dataset_id = _dataset_of(tx, document_id)
        if dataset_id is not None:
            self._delete(tx, dataset_id, "c.document_id = :document", {"document": document_id})

    def delete_dataset(self, tx: Tx, dataset_id: str) -> None:
        write_log(tx, self.table, dataset_key(dataset_id), [RESET], added=False)
        tx.execute(text(f"DELETE FROM {self.table} WHERE dataset_id = :d"), {"d": dataset_id})
        tx.execute(text("DELETE FROM chunks WHERE dataset_id = :d"), {"d": dataset_id})

    def _delete(self, tx: Tx, dataset_id: str, where: str, params: dict[str, Any]) -> None:
        """Chunks matching `where` (on `c`) and their rows in the dataset's partition (the
        dataset named, so the planner reads that partition alone); the active ones logged."""
        self._log_change(
            tx,
            dataset_id,
            f"WITH gone AS (DELETE FROM {self.table} v USING chunks c "
            f"WHERE v.dataset_id = :dataset AND v.seq = c.seq AND {where} "
            "RETURNING v.seq, v.active) "
            f"INSERT INTO {self.log} (dataset_key, seq, added) "
            "SELECT :key, seq, false FROM gone WHERE active",
            params,
        )
        tx.execute(text(f"DELETE FROM chunks c WHERE {where}"), params)

    def _log_change(self, tx: Tx, dataset_id: str, sql: str, params: dict[str, Any]) -> None:
        """Run `sql`, a change of the dataset's rows that logs what it changed (`:dataset` and
        `:key` given here), and count the rows it logged toward the log's next prune."""
        result = tx.execute(
            text(sql), {**params, "dataset": dataset_id, "key": dataset_key(dataset_id)}
        )
        self.pruner.logged(max(result.rowcount, 0))

    # --- reads ----------------------------------------------------------------------------------
    def scans_every_core(self, dataset_id: str, where: SearchFilter | None = None) -> bool:
        """Never: PostgreSQL searches each list on a server backend of its own."""
        return False

    def search_vector(
        self,
        dataset_id: str,
        vector: npt.NDArray[np.float32],
        k: int,
        where: SearchFilter | None = None,
        *,
        fused: bool = False,  # a hybrid search's list: walks from HNSW_EF_FUSED
    ) -> list[Hit]:
        with self.db.read() as conn:
            ef_search = self.ef_search(conn, dataset_id, k, where, fused=fused)
            if ef_search is not None:
                query, params = self._vector_query(dataset_id, vector, k, where, walk=True)
                conn.exec_driver_sql(f"SET LOCAL hnsw.ef_search = {ef_search}")
                rows = conn.execute(text(query), params).all()
            if ef_search is None or len(rows) < k:
                # a small dataset or filter, or the walk found fewer than k rows the filter
                # admits: exact, over the dataset's partition
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
        self,
        conn: Tx,
        dataset_id: str,
        k: int,
        where: SearchFilter | None,
        *,
        fused: bool = False,
    ) -> int | None:
        """The HNSW walk's breadth for a search of `dataset_id`, or None for an exact search
        (from HNSW_EF_FUSED for a hybrid search's vector list, `fused`).

        The walk covers the dataset's own partition; a metadata filter is applied after it
        (pgvector 0.6): of `ef_search` rows it finds, about the filter's share pass. So the
        breadth grows as that share shrinks: by FILTER_WIDEN_POWER of it for the recall (the
        filtered top 10 lie among the nearest 10 / share of the whole, which a walk finds
        more easily than the whole's own top 10 at that breadth), and at least far enough
        that twice k of its rows pass, up to pgvector's HNSW_MAX_EF_SEARCH. A share under
        EXACT_SHARE, or so few chunks that a scan is cheaper, is exact; a walk that returns
        fewer than k rows all the same is run again exactly (search_vector)."""
        admitted, dataset = self.counts.of(conn, dataset_id, where)
        if admitted < self.exact_max_rows or dataset <= 0:
            return None
        share = min(1.0, float(admitted) / float(dataset))
        if share < EXACT_SHARE:
            return None
        base = HNSW_EF_FUSED if fused else HNSW_EF_SEARCH
        wanted = max(base / share**FILTER_WIDEN_POWER, 2 * k / share)
        return int(min(HNSW_MAX_EF_SEARCH, wanted))

    def search_keyword(
        self, dataset_id: str, query: str, k: int, where: SearchFilter | None = None
    ) -> list[Hit]:
        """The best chunks by BM25 through this process's keyword index once the table is
        large (keywords.py), else (or when it cannot answer alone) `ts_rank_cd` over the
        dataset's GIN matches."""
        terms = query_terms(query)
        if not terms:
            return []
        if self._keywords_wanted():
            found = self._keyword_index(dataset_id, terms, k, where)
            if found is not None:
                return found
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

    def _keywords_wanted(self) -> bool:
        """Whether keyword searches go through the keyword index: once it is made, or once the
        table holds `keyword_min_chunks` active chunks (counted again every minute)."""
        if self.keyword_folder is None:
            return False
        keywords = self._keywords
        if keywords is not None and keywords.ready:
            return True
        return self.table_chunks.count() >= self.keyword_min_chunks

    def _keyword_index(
        self, dataset_id: str, terms: list[str], k: int, where: SearchFilter | None
    ) -> list[Hit] | None:
        """The best k of the keyword index's candidates that are active and admitted; None
        when it cannot answer alone (not built, far behind, short under a filter)."""
        keywords = self.keywords
        if keywords is None:
            return None
        key = dataset_key(dataset_id)
        with self.db.read() as conn:
            share = 1.0
            if where is not None and not where.empty:
                admitted, total = self.counts.of(conn, dataset_id, where)
                if admitted == 0:
                    return []
                share = admitted / max(total, 1)
            for want in asks(k, share):
                found = keywords.candidates(conn, key, terms, want)
                if found is None:
                    return None
                # the best k candidates that are active and pass, with their texts, in one
                # round trip: sorted as the index ranked them (score, then seq)
                params: dict[str, Any] = {
                    "seqs": [seq for seq, _ in found.scored],
                    "scores": [score for _, score in found.scored],
                    "dataset": dataset_id,
                    "k": k,
                }
                conditions = postgres_where(where, params)
                rows = conn.execute(
                    text(
                        "SELECT c.id, c.document_id, c.ordinal, c.text, c.page_start, "
                        "c.page_end, c.section, s.score FROM unnest(CAST(:seqs AS integer[]), "
                        "CAST(:scores AS float8[])) AS s(seq, score) "
                        "JOIN chunks c ON c.seq = s.seq JOIN documents d ON d.id = c.document_id "
                        f"AND d.active_generation = c.generation WHERE c.dataset_id = :dataset"
                        f"{conditions} ORDER BY s.score DESC, s.seq LIMIT :k"
                    ),
                    params,
                ).all()
                if len(rows) >= k or found.ranked < want:  # exactly the best k that pass
                    return [_hit(row) for row in rows]
        return None  # more may pass below the widest ask: the GIN index decides


def _dataset_of(tx: Tx, document_id: str) -> str | None:
    """The dataset a document belongs to (its chunks' partition), None for no such document
    (then it has no chunks either: they go with their document)."""
    found = tx.execute(select(documents.c.dataset_id).where(documents.c.id == document_id)).scalar()
    return None if found is None else str(found)


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
