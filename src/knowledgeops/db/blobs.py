"""Stored files, content-addressed: a file's key is the sha256 of its bytes.

Nothing a client sends decides a path: names are hashes, written under `<root>/blobs/ab/cd/…`.
An upload is streamed into `<root>/incoming/` (hashing and counting as it goes, stopping at the
size limit) and moved into place only when it is complete.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path
from typing import BinaryIO

from knowledgeops.errors import PayloadTooLarge

_HEX = frozenset("0123456789abcdef")


class StagedFile:
    """An upload being received: write bytes, then `commit()` into the store or `discard()`."""

    def __init__(self, store: LocalBlobStore, max_bytes: int) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self.path = store.incoming / f"{secrets.token_hex(16)}.part"
        self._file: BinaryIO | None = open(self.path, "xb")  # noqa: SIM115 (closed in finish)
        self._hash = hashlib.sha256()
        self.size = 0
        self.head = b""  # the first bytes, for content sniffing

    def __enter__(self) -> StagedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()  # a no-op once committed: the file has moved into the store

    def write(self, data: bytes) -> None:
        if self._file is None:
            raise ValueError("staged file is closed")
        self.size += len(data)
        if self.size > self.max_bytes:
            self.discard()
            limit_mb = self.max_bytes / 1024 / 1024
            raise PayloadTooLarge(
                f"the file is larger than this server accepts ({limit_mb:g} MB); "
                "split it or ask the operator to raise KOPS_MAX_UPLOAD_MB",
            )
        if len(self.head) < 8192:
            self.head += data[: 8192 - len(self.head)]
        self._hash.update(data)
        self._file.write(data)

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()

    def seal(self) -> None:
        """Finish writing: flush and fsync (slow for a big file; do it outside transactions)."""
        self._close()

    def commit(self) -> str:
        """Move the sealed file into the store; returns its key (the sha256)."""
        self._close()
        key = self.sha256
        target = self.store.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():  # the same bytes are stored already
            self.path.unlink(missing_ok=True)
        else:
            os.replace(self.path, target)
        return key

    def discard(self) -> None:
        self._close()
        self.path.unlink(missing_ok=True)

    def _close(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None


class LocalBlobStore:
    def __init__(self, root: Path) -> None:
        self.root = root / "blobs"
        self.incoming = root / "incoming"
        self.root.mkdir(parents=True, exist_ok=True)
        self.incoming.mkdir(parents=True, exist_ok=True)

    def stage(self, max_bytes: int) -> StagedFile:
        return StagedFile(self, max_bytes)

    def path(self, key: str) -> Path:
        if len(key) != 64 or not set(key) <= _HEX:
            raise ValueError(f"not a blob key: {key!r}")
        return self.root / key[:2] / key[2:4] / key

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def delete(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)

    def clear_incoming(self) -> int:
        """Remove partial uploads left by a crash (none of them was ever accepted)."""
        removed = 0
        for leftover in self.incoming.glob("*.part"):
            leftover.unlink(missing_ok=True)
            removed += 1
        return removed
