"""The embedded index's plain table of vectors by seq (`<vector table>_rows`), made and filled
for an index that was made before it (docs/architecture.md: Vector search at a million chunks).

sqlite-vec reads one vector by rowid in about 325 µs at a million chunks, and its own full scan
(`SELECT rowid, embedding FROM vec0`) pays that for every row: 480 s to fill a million rows,
against 59 s from its storage. So the fill reads sqlite-vec's storage directly, the way
version 0.1.9 (pinned) lays it out: `<table>_rowids` (rowid, chunk_id, chunk_offset; a
delete removes its row) and `<table>_vector_chunks00` (one blob of `chunk_size` float32
vectors per chunk_id), a vector being the slice at its offset. The result is checked before
it is kept: every row of `_rowids` filled, and a sample spread over the table compared with
what sqlite-vec itself returns for those rowids; a layout that is not that one (another
version, a table that does not read) falls back to sqlite-vec's scan. Either way it runs in
the transaction that creates the table.
"""

from __future__ import annotations

import logging
import time

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

logger = logging.getLogger(__name__)

FILL_BATCH = 2000  # rows inserted per statement
CHECKED = 64  # rows compared with sqlite-vec's own answer after a fill from its storage


def create_table(conn: Connection, name: str) -> None:
    """An empty table of vectors by seq, named `name`."""
    conn.exec_driver_sql(f"CREATE TABLE {name} (seq INTEGER PRIMARY KEY, embedding BLOB NOT NULL)")


def create(conn: Connection, vec: str, rows: str, dimension: int) -> None:
    """Create `rows` if it is missing, filled with every vector of the sqlite-vec table `vec`."""
    found = conn.exec_driver_sql("SELECT 1 FROM sqlite_master WHERE name = ?", (rows,)).first()
    if found is not None:
        return
    create_table(conn, rows)
    began = time.perf_counter()
    filled = _from_storage(conn, vec, rows, dimension)
    how = "from sqlite-vec's storage"
    if filled is None:
        conn.exec_driver_sql(f"DELETE FROM {rows}")
        filled = conn.exec_driver_sql(
            f"INSERT INTO {rows} (seq, embedding) SELECT rowid, embedding FROM {vec}"
        ).rowcount
        how = "through sqlite-vec's scan"
    if filled:
        logger.info(
            "filled %s with the %d vectors of %s %s in %.1f s (once: an index made before it)",
            rows,
            filled,
            vec,
            how,
            time.perf_counter() - began,
        )


def _from_storage(conn: Connection, vec: str, rows: str, dimension: int) -> int | None:
    """Fill `rows` from sqlite-vec's shadow tables; how many, or None when their layout is not
    the expected one (then `rows` holds a partial fill the caller clears)."""
    width = 4 * dimension
    try:
        # each chunk's blob read once (SQL's substr would read the 1.5 MB blob for every row)
        places = conn.exec_driver_sql(
            f"SELECT chunk_id, chunk_offset, rowid FROM {vec}_rowids "
            "WHERE chunk_id IS NOT NULL ORDER BY chunk_id, chunk_offset"
        )
        filled = 0
        current_id: int | None = None
        current = memoryview(b"")
        while part := places.fetchmany(FILL_BATCH):
            batch: list[tuple[int, bytes]] = []
            for chunk_id, offset, seq in part:
                if chunk_id != current_id:
                    blob = conn.exec_driver_sql(
                        f"SELECT vectors FROM {vec}_vector_chunks00 WHERE rowid = ?", (chunk_id,)
                    ).scalar()
                    current, current_id = memoryview(blob or b""), chunk_id
                piece = current[offset * width : (offset + 1) * width].tobytes()
                if len(piece) != width:
                    return None
                batch.append((int(seq), piece))
            conn.exec_driver_sql(f"INSERT INTO {rows} (seq, embedding) VALUES (?, ?)", batch)
            filled += len(batch)
        listed = conn.exec_driver_sql(f"SELECT count(*) FROM {vec}_rowids").scalar()
        if filled != listed:
            return None
        low, high = conn.exec_driver_sql(f"SELECT min(seq), max(seq) FROM {rows}").one()
        for n in range(CHECKED if filled else 0):  # spread over the table, chunks and offsets
            seq, blob = conn.exec_driver_sql(
                f"SELECT seq, embedding FROM {rows} WHERE seq >= ? ORDER BY seq LIMIT 1",
                (low + (high - low) * n // CHECKED,),
            ).one()
            truth = conn.exec_driver_sql(
                f"SELECT embedding FROM {vec} WHERE rowid = ?", (seq,)
            ).scalar()
            if truth != blob:
                return None
    except DBAPIError as exc:  # no such table or column: another layout
        logger.warning("sqlite-vec's storage of %s does not read as expected (%s)", vec, exc)
        return None
    return filled
