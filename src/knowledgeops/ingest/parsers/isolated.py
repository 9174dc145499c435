"""Parsing in a child process, so that a hostile file cannot take the worker down with it.

Each worker thread owns one parser process (started on first use, reused for later documents).
The child (child.py, a fresh interpreter started with `python -m`) parses with the same registry,
under an address-space limit (RLIMIT_AS), and streams the blocks back in batches over a socket
pair; the parent counts the time it waits for them. Then:

- the parser takes longer than `parse_timeout_s` → the child is killed, the job fails
  (`parse_timeout`, user action: split the file, or raise the limit);
- it runs out of its memory limit → `parse_memory` (user action);
- it dies (a segfault in a C library, the OOM killer) → `parser_crashed` (permanent);
- the consumer stops early (a later limit, a cancelled job) → the child is killed.

In every case the worker goes on with its next job and a fresh child is started when needed.
"""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Protocol

from knowledgeops.errors import ErrorCategory, JobError, PermanentError, UserActionRequired
from knowledgeops.ingest.parsers.base import Block
from knowledgeops.ingest.parsers.limits import ParseLimits

log = logging.getLogger(__name__)

CHILD_MODULE = "knowledgeops.ingest.parsers.child"
START_TIMEOUT_S = 60.0  # s: a child that cannot even start (imports) within this is broken


class ParserProcess:
    """One child parser process, used by one thread at a time."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._memory_mb: int | None = None

    def _start(self, memory_mb: int) -> Connection:
        """The running child, or a new one (a fresh interpreter: nothing of the worker's
        threads, model or open connections is inherited)."""
        alive = self._process is not None and self._process.poll() is None
        if alive and self._memory_mb == memory_mb:
            assert self._conn is not None
            return self._conn
        self.stop()
        ours, theirs = socket.socketpair()
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", CHILD_MODULE, str(theirs.fileno()), str(memory_mb)],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        conn = Connection(ours.detach())
        if not conn.poll(START_TIMEOUT_S):
            process.kill()
            process.wait(5)
            conn.close()
            raise RuntimeError("the parser process did not start")
        try:
            conn.recv()  # ("ready", pid)
        except EOFError:
            process.wait(5)
            conn.close()
            raise RuntimeError(
                f"the parser process exited at start (status {process.returncode})"
            ) from None
        self._process, self._conn, self._memory_mb = process, conn, memory_mb
        return conn

    def stop(self) -> None:
        """Kill the child (if any) and reap it."""
        if self._conn is not None:
            self._conn.close()
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                log.warning("parser process %s did not exit after SIGKILL", self._process.pid)
        self._process = self._conn = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def parse(self, path: Path, content_type: str, limits: ParseLimits) -> Iterator[Block]:
        conn = self._start(limits.parse_memory_mb)
        conn.send((str(path), content_type, limits))
        waited = 0.0
        finished = False
        try:
            while True:
                remaining = limits.parse_timeout_s - waited
                began = time.monotonic()
                ready = remaining > 0 and conn.poll(remaining)
                waited += time.monotonic() - began
                if not ready:
                    raise UserActionRequired(
                        f"Parsing this file took longer than {limits.parse_timeout_s:g} s "
                        "(KOPS_PARSE_TIMEOUT_S) and was stopped. Split the file into smaller "
                        "parts, or ask the operator to raise the limit.",
                        code="parse_timeout",
                    )
                try:
                    kind, payload = conn.recv()
                except (EOFError, OSError):
                    raise self._crashed() from None
                if kind == "blocks":
                    for text, page, section in payload:
                        yield Block(text=text, page=page, section=section)
                    continue
                finished = kind in ("done", "error", "oserror")
                if kind == "done":
                    return
                if kind == "error":
                    raise _job_error(payload)
                if kind == "oserror":
                    raise OSError(f"the stored file could not be read: {payload}")
                if kind == "memory":
                    raise UserActionRequired(
                        f"Parsing this file needed more than {limits.parse_memory_mb:,} MB "
                        "(KOPS_PARSE_MEMORY_MB) and was stopped. Split the file into smaller "
                        "parts, or ask the operator to raise the limit.",
                        code="parse_memory",
                    )
                raise RuntimeError(f"unexpected message from the parser process: {kind!r}")
        finally:
            if not finished:  # timed out, crashed, or the consumer stopped reading: start over
                self.stop()

    def _crashed(self) -> PermanentError:
        process = self._process
        code = None
        if process is not None:
            try:
                code = process.wait(5)
            except subprocess.TimeoutExpired:
                code = None
        if code is not None and code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with status {code}"
        log.warning("parser process %s %s", getattr(process, "pid", "?"), how)
        return PermanentError(
            f"The parser stopped on this file (it {how}); the file is probably damaged or "
            "built to break parsers. Export it again from its source and upload the new copy.",
            code="parser_crashed",
        )


def _job_error(failure: tuple[str, str, str]) -> JobError:
    category, code, message = failure
    if category == ErrorCategory.USER_ACTION_REQUIRED.value:
        return UserActionRequired(message, code=code)
    return PermanentError(message, code=code)


class Parsing(Protocol):
    """Where parsers run: `parse` streams a stored file's blocks under `limits`."""

    limits: ParseLimits

    def parse(self, path: Path, content_type: str) -> Iterator[Block]: ...

    def close(self) -> None: ...


class IsolatedParsing:
    """Parsers in child processes, one per calling thread; `close()` stops them all."""

    def __init__(self, limits: ParseLimits) -> None:
        self.limits = limits
        self._local = threading.local()
        self._all: list[ParserProcess] = []
        self._guard = threading.Lock()

    def _mine(self) -> ParserProcess:
        mine: ParserProcess | None = getattr(self._local, "process", None)
        if mine is None:
            mine = ParserProcess()
            self._local.process = mine
            with self._guard:
                self._all.append(mine)
        return mine

    def parse(self, path: Path, content_type: str) -> Iterator[Block]:
        return self._mine().parse(path, content_type, self.limits)

    def close(self) -> None:
        with self._guard:
            for process in self._all:
                process.stop()


class InlineParsing:
    """Parsers in the calling thread (`KOPS_PARSE_ISOLATION=inline`): no protection from a
    parser that crashes or hangs; for debugging and for platforms without `spawn`."""

    def __init__(self, limits: ParseLimits) -> None:
        self.limits = limits

    def parse(self, path: Path, content_type: str) -> Iterator[Block]:
        from knowledgeops.ingest.parsers import limits as parse_limits
        from knowledgeops.ingest.parsers.registry import parse

        def blocks() -> Iterator[Block]:
            with parse_limits.using(self.limits):
                yield from parse(path, content_type)

        return blocks()

    def close(self) -> None:
        pass
