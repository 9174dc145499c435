"""A dataset's key in the embedded index's side tables: the vector table, its log, the keyword
index (a 64-bit integer filters faster than a 36-character id)."""

from __future__ import annotations

import hashlib


def dataset_key(dataset_id: str) -> int:
    """64 bits of a hash of the dataset's id (signed, as SQLite's integers are)."""
    digest = hashlib.blake2b(dataset_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)
