"""One `kops serve` per data folder: SQLite has one writer by design, so a second process on the
same folder refuses to start instead of fighting over the database."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import TextIO

from knowledgeops.errors import DataDirLocked


class DataDirLock:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "kops.lock"
        self._file: TextIO | None = None

    def acquire(self) -> None:
        if self._file is not None:  # already held by this process
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")  # noqa: SIM115 (held open while the process runs)
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise DataDirLocked(
                f"another KnowledgeOps process (pid {holder}) is already using the data folder "
                f"{self.path.parent.resolve()}.\n"
                "The embedded default keeps its database in SQLite, which allows one writer, so "
                "only one `kops serve` can run per folder.\n"
                "Stop the other process, or start this one with another KOPS_DATA_DIR, or run the "
                "scale-out topology (PostgreSQL + workers) to use several processes."
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._file = handle

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None
