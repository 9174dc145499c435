"""Stored files are shared by every document with the same bytes; the last one out deletes it.

Called inside the write transaction that removed the documents, so an upload of the same bytes
(which adds its document in its own write transaction) cannot slip between check and delete.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Connection, func, select, text

from knowledgeops.db.blobs import LocalBlobStore
from knowledgeops.db.engine import Database
from knowledgeops.db.schema import documents


def lock_blob(conn: Connection, key: str) -> None:
    """On PostgreSQL (READ COMMITTED), serialise the last reference check of a stored file with
    an upload of the same bytes, which may come from any dataset or tenant. SQLite's single
    writer serialises them already."""
    if conn.dialect.name == "postgresql":
        conn.execute(
            text("SELECT pg_advisory_xact_lock(hashtext(:key))"), {"key": f"kops.blob.{key}"}
        )


def unlink_unreferenced(conn: Connection, blobs: LocalBlobStore, keys: Iterable[str]) -> int:
    removed = 0
    for key in sorted(set(keys)):  # sorted: two deletes take the locks in the same order
        lock_blob(conn, key)
        users = conn.scalar(select(func.count()).where(documents.c.blob_key == key))
        if not users:
            blobs.delete(key)
            removed += 1
    return removed


def sweep_unreferenced(db: Database, blobs: LocalBlobStore) -> int:
    """Delete stored files no document refers to (left when a commit failed after the file was
    moved into place). Runs at start-up, before any upload can be in flight."""
    with db.read() as conn:
        known = set(conn.scalars(select(documents.c.blob_key)).all())
    removed = 0
    for path in blobs.root.glob("*/*/*"):
        if path.is_file() and path.name not in known:
            path.unlink(missing_ok=True)
            removed += 1
    return removed
