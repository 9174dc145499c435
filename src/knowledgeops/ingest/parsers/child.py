"""The parser process (see isolated.py): `python -m knowledgeops.ingest.parsers.child FD MB`.

It limits its own address space to MB MiB, then answers parse requests that arrive on the socket
FD, streaming blocks back; it exits when the socket closes or its parent process goes away.
Messages are plain tuples of builtins, so both ends read them whatever their `__main__` is.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

BATCH_BLOCKS = 64  # blocks per message
BATCH_CHARS = 1_000_000  # … or fewer, once they hold this much text


def _exit_with_parent(parent: int) -> None:
    """A parser stuck in a loop never reads its socket: leave when the parent is gone."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(0)


def serve(conn: Connection) -> None:
    from knowledgeops.errors import JobError
    from knowledgeops.ingest.parsers import limits as parse_limits
    from knowledgeops.ingest.parsers.registry import parse

    conn.send(("ready", os.getpid()))
    while True:
        try:
            path, content_type, limits = conn.recv()
        except (EOFError, OSError):
            return
        try:
            with parse_limits.using(limits):
                batch: list[tuple[str, int | None, str | None]] = []
                size = 0
                for block in parse(Path(path), content_type):
                    batch.append((block.text, block.page, block.section))
                    size += len(block.text)
                    if len(batch) >= BATCH_BLOCKS or size >= BATCH_CHARS:
                        conn.send(("blocks", batch))
                        batch, size = [], 0
                if batch:
                    conn.send(("blocks", batch))
            conn.send(("done", None))
        except JobError as exc:
            conn.send(("error", (exc.category.value, exc.code, exc.message)))
        except MemoryError:
            batch = []
            conn.send(("memory", None))
            return  # the heap may be in a poor state: the parent starts a fresh process
        except OSError as exc:
            conn.send(("oserror", f"{type(exc).__name__}: {exc.strerror or exc}"))


def main() -> None:
    fd, memory_mb = int(sys.argv[1]), int(sys.argv[2])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent, which stops us
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    sock = socket.socket(fileno=fd)
    conn = Connection(sock.detach())
    serve(conn)


if __name__ == "__main__":
    main()
