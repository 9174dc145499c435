"""The parser process (see isolated.py): `python -m knowledgeops.ingest.parsers.child FD MB`.

It limits its own address space to MB MiB, then answers parse requests that arrive on the socket
FD, streaming blocks back; it exits when the socket closes or its parent process goes away.
Messages are JSON in both directions (never pickle: the worker must not run code a compromised
parser sends it). Requests: {"path", "type", "limits"}; answers: {"kind": "blocks", "blocks":
[[text, page, section], …]}, {"kind": "done"}, {"kind": "error", "category", "code", "message"},
{"kind": "memory"}, {"kind": "oserror", "errno", "message"}.
"""

from __future__ import annotations

import dataclasses
import json
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


def _send(conn: Connection, message: dict[str, object]) -> None:
    conn.send_bytes(json.dumps(message, ensure_ascii=False).encode())


def serve(conn: Connection) -> None:
    from knowledgeops.errors import JobError
    from knowledgeops.ingest.parsers import limits as parse_limits
    from knowledgeops.ingest.parsers.limits import ParseLimits
    from knowledgeops.ingest.parsers.registry import parse

    fields = {f.name for f in dataclasses.fields(ParseLimits)}
    _send(conn, {"kind": "ready", "pid": os.getpid()})
    while True:
        try:
            request = json.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        limits = ParseLimits(**{k: v for k, v in request["limits"].items() if k in fields})
        try:
            with parse_limits.using(limits):
                batch: list[tuple[str, int | None, str | None]] = []
                size = 0
                for block in parse(Path(request["path"]), request["type"]):
                    batch.append((block.text, block.page, block.section))
                    size += len(block.text)
                    if len(batch) >= BATCH_BLOCKS or size >= BATCH_CHARS:
                        _send(conn, {"kind": "blocks", "blocks": batch})
                        batch, size = [], 0
                if batch:
                    _send(conn, {"kind": "blocks", "blocks": batch})
            _send(conn, {"kind": "done"})
        except JobError as exc:
            category = exc.category.value
            _send(
                conn,
                {"kind": "error", "category": category, "code": exc.code, "message": exc.message},
            )
        except MemoryError:
            batch = []
            _send(conn, {"kind": "memory"})
            return  # the heap may be in a poor state: the parent starts a fresh process
        except OSError as exc:
            _send(
                conn, {"kind": "oserror", "errno": exc.errno, "message": exc.strerror or str(exc)}
            )


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
