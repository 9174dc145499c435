"""Parsing in a child process, so that a hostile file cannot take the worker down with it.

Each worker thread owns one parser process (started on first use, reused for later documents).
The child (child.py, a fresh interpreter started with `python -m`) parses with the same registry,
under an address-space limit (RLIMIT_AS), and streams the blocks back in batches over a socket
pair; the parent counts the time it waits for them. The pipeline asks for chunk drafts
(`chunks`): the child then also cleans and chunks (ingest/prepare.py) with the model's
tokenizer, so that CPU work runs beside the worker's process, not under its GIL, while the
worker embeds and writes the drafts already made. Then:

- the parser takes longer than `parse_timeout_s` → the child is killed, the job fails
  (`parse_timeout`, user action: split the file, or raise the limit);
- it runs out of its memory limit → `parse_memory` (user action);
- it dies (a segfault in a C library, the OOM killer) → `parser_crashed` (permanent);
- the consumer stops early (a later limit, a cancelled job) → the child is killed.

In every case the worker goes on with its next job and a fresh child is started when needed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Generator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol

from knowledgeops.errors import (
    PermanentError,
    TransientError,
    UserActionRequired,
)
from knowledgeops.ingest.chunker import ChunkDraft, Tokenizer
from knowledgeops.ingest.parsers import limits as parse_limits
from knowledgeops.ingest.parsers import progress, wire
from knowledgeops.ingest.parsers.base import Block
from knowledgeops.ingest.parsers.limits import ParseLimits
from knowledgeops.ingest.parsers.ocr import using_languages as ocr_languages
from knowledgeops.ingest.prepare import ChunkSpec, prepare

log = logging.getLogger(__name__)

CHILD_MODULE = "knowledgeops.ingest.parsers.child"
START_TIMEOUT_S = 60.0  # s: a child that cannot even start (imports) within this is broken


class ParserProcess:
    """One child parser process, used by one thread at a time (`stop` may come from another)."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._memory_mb: int | None = None
        self._busy = False  # a request was sent and its answer not read to the end
        self._lock = threading.Lock()  # `stop` from `close()` and from the owning thread

    def _start(self, memory_mb: int) -> Connection:
        """The running child, or a new one: a fresh interpreter (`-I`: no PYTHON* variables, no
        user site) with a minimal environment, so a parser exploit finds no database URL, no
        provider key and none of the worker's threads, model or connections."""
        alive = self._process is not None and self._process.poll() is None
        if alive and self._memory_mb == memory_mb and not self._busy:
            assert self._conn is not None
            return self._conn
        self.stop()
        ours, theirs = socket.socketpair()
        process: subprocess.Popen[bytes] | None = None
        conn: Connection | None = None
        try:
            process = subprocess.Popen(
                [sys.executable, "-I", "-m", CHILD_MODULE, str(theirs.fileno()), str(memory_mb)],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=_child_env(),
            )
            theirs.close()
            conn = Connection(ours.detach())
            if not conn.poll(START_TIMEOUT_S):
                raise TransientError(
                    "the parser process did not start in time", code="parser_start"
                )
            ready = wire.decode(conn.recv_bytes())
            if ready.get("kind") != "ready":
                raise TransientError("the parser process did not start", code="parser_start")
        except BaseException as exc:
            theirs.close()
            ours.close()
            if conn is not None:
                conn.close()
            if process is not None:
                process.kill()
                process.wait()
            if isinstance(exc, EOFError | OSError):
                raise TransientError(
                    f"the parser process exited at start ({type(exc).__name__})",
                    code="parser_start",
                ) from None
            raise
        self._process, self._conn, self._memory_mb = process, conn, memory_mb
        return conn

    def prestart(self, memory_mb: int) -> None:
        """Start the child now rather than at the first document."""
        self._start(memory_mb)

    def stop(self) -> None:
        """Kill the child (if any) and reap it."""
        with self._lock:
            conn, process = self._conn, self._process
            self._process = self._conn = None
            self._busy = False
        if conn is not None:
            conn.close()
        if process is not None:
            if process.poll() is None:
                process.kill()
            process.wait()  # after SIGKILL: promptly

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None else None

    def parse(
        self, path: Path, content_type: str, limits: ParseLimits
    ) -> Generator[Block, None, None]:
        """The file's blocks, lazily: nothing is sent to the child before the first `next`. A
        request left unfinished (the iterator dropped unclosed) costs the next call a fresh
        child, so no document ever reads another's blocks."""
        for item in self._request(path, content_type, limits, None):
            if not isinstance(item, Block):
                raise wire.unexpected()
            yield item

    def chunks(
        self,
        path: Path,
        content_type: str,
        limits: ParseLimits,
        spec: ChunkSpec,
        on_progress: progress.Sink | None = None,
    ) -> Generator[ChunkDraft, None, int | None]:
        """The file's chunk drafts, cleaned and chunked in the child too (ingest/prepare.py);
        returns the last page number; OCR progress goes to `on_progress`. Lazy, like `parse`."""
        answers = self._request(path, content_type, limits, spec, on_progress=on_progress)
        guard = wire.DraftGuard(spec)
        while True:
            try:
                item = next(answers)
            except StopIteration as stop:
                return guard.pages(stop.value)
            if not isinstance(item, ChunkDraft):
                raise wire.unexpected()
            guard.check(item)
            yield item

    def page_count(self, path: Path, content_type: str, limits: ParseLimits) -> int | None:
        """How many pages the file has (a PDF; None for other types), asked of the child: a
        hostile PDF is opened there, never in the worker."""
        answers = self._request(path, content_type, limits, None, op="count")
        try:
            next(answers)
        except StopIteration as stop:
            value = stop.value
            if value is None or (type(value) is int and value >= 1):
                return value
        answers.close()  # anything else is a child not to be trusted further
        raise wire.unexpected()

    def _request(
        self,
        path: Path,
        content_type: str,
        limits: ParseLimits,
        spec: ChunkSpec | None,
        op: str = "parse",
        on_progress: progress.Sink | None = None,
    ) -> Generator[Block | ChunkDraft, None, Any]:
        conn = self._start(limits.parse_memory_mb)
        request = {
            "op": op,
            "path": str(path),
            "type": content_type,
            "limits": dataclasses.asdict(limits),
            "chunk": None if spec is None else dataclasses.asdict(spec),
        }
        self._busy = True
        try:
            conn.send_bytes(json.dumps(request).encode())
        except OSError:
            raise self._crashed() from None
        return (yield from self._answers(conn, limits, on_progress))

    def _answers(
        self, conn: Connection, limits: ParseLimits, on_progress: progress.Sink | None
    ) -> Generator[Block | ChunkDraft, None, Any]:
        waited = 0.0
        finished = False
        try:
            while True:
                remaining = limits.parse_timeout_s - waited
                began = time.monotonic()
                try:
                    ready = remaining > 0 and conn.poll(remaining)
                    message = wire.decode(conn.recv_bytes()) if ready else None
                except (EOFError, OSError):
                    raise self._crashed() from None
                waited += time.monotonic() - began
                if message is None:
                    raise UserActionRequired(
                        f"Parsing this file took longer than {limits.parse_timeout_s:g} s "
                        "(KOPS_PARSE_TIMEOUT_S) and was stopped. Split the file into smaller "
                        "parts, or ask the operator to raise the limit.",
                        code="parse_timeout",
                    )
                kind = message.get("kind")
                if kind == "blocks":
                    yield from wire.blocks_of(message)
                    continue
                if kind == "drafts":
                    yield from wire.drafts_of(message)
                    continue
                if kind == "ocr":
                    event = wire.ocr_progress_of(message)
                    if on_progress is not None:
                        on_progress(event)
                    continue
                finished = kind in ("done", "error", "oserror")
                if finished:
                    self._busy = False
                if kind == "done":
                    return message.get("pages")
                if kind == "error":
                    raise wire.job_error(message)
                if kind == "oserror":
                    errno = message.get("errno")
                    reason = str(message.get("message", ""))
                    raise OSError(errno if isinstance(errno, int) else 0, reason)
                if kind == "memory":
                    raise UserActionRequired(
                        f"Parsing this file needed more than {limits.parse_memory_mb:,} MB "
                        "(KOPS_PARSE_MEMORY_MB) and was stopped. Split the file into smaller "
                        "parts, or ask the operator to raise the limit.",
                        code="parse_memory",
                    )
                raise PermanentError(
                    "the parser process answered something unexpected", code="parser_crashed"
                )
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


def _child_env() -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "HOME")
    return {name: os.environ[name] for name in keep if name in os.environ}


class Parsing(Protocol):
    """Where parsers run: `parse` streams a stored file's blocks under `limits`; `chunks` its
    chunk drafts (cleaned and chunked where it was parsed) and returns its last page number."""

    limits: ParseLimits

    def parse(self, path: Path, content_type: str) -> Generator[Block, None, None]: ...

    def page_count(self, path: Path, content_type: str) -> int | None:
        """A PDF's page count (None for other types)."""
        ...

    def chunks(
        self,
        path: Path,
        content_type: str,
        spec: ChunkSpec,
        tokenizer: Tokenizer,
        on_progress: progress.Sink | None = None,
    ) -> Generator[ChunkDraft, None, int | None]:
        """… with the OCR progress of its pages reported to `on_progress`."""
        ...

    def prestart(self) -> None:
        """Get the calling thread ready to parse (a worker thread, at its start)."""
        ...

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

    def parse(self, path: Path, content_type: str) -> Generator[Block, None, None]:
        return self._mine().parse(path, content_type, self.limits)

    def page_count(self, path: Path, content_type: str) -> int | None:
        return self._mine().page_count(path, content_type, self.limits)

    def prestart(self) -> None:
        """Start the calling thread's parser process now (a worker at its start), so the first
        document does not wait for an interpreter and the tokenizer to load. Best effort: a
        failure here is met again, and reported, by the first document."""
        try:
            self._mine().prestart(self.limits.parse_memory_mb)
        except Exception as exc:
            log.warning("could not start a parser process ahead of work: %s", exc)

    def chunks(
        self,
        path: Path,
        content_type: str,
        spec: ChunkSpec,
        tokenizer: Tokenizer,
        on_progress: progress.Sink | None = None,
    ) -> Generator[ChunkDraft, None, int | None]:
        """`tokenizer` is not sent: the child chunks with the model's own (the pipeline's)."""
        return self._mine().chunks(path, content_type, self.limits, spec, on_progress)

    def close(self) -> None:
        with self._guard:
            for process in self._all:
                process.stop()


class InlineParsing:
    """Parsers in the calling thread (`KOPS_PARSE_ISOLATION=inline`): no protection from a
    parser that crashes or hangs; for debugging and for platforms without `spawn`."""

    def __init__(self, limits: ParseLimits) -> None:
        self.limits = limits

    def parse(
        self,
        path: Path,
        content_type: str,
        pages: tuple[int, int] | None = None,
        on_progress: progress.Sink | None = None,
        languages: tuple[str, ...] | None = None,
    ) -> Generator[Block, None, None]:
        from knowledgeops.ingest.parsers.registry import parse  # noqa: PLC0415 (parser libraries stay out of a worker whose parsers run in a child)

        def blocks() -> Generator[Block, None, None]:
            with (
                parse_limits.using(self.limits),
                progress.listening(on_progress),
                ocr_languages(languages),
            ):
                yield from parse(path, content_type, pages)

        return blocks()

    def page_count(self, path: Path, content_type: str) -> int | None:
        from knowledgeops.ingest.parsers.registry import page_count  # noqa: PLC0415 (parser libraries stay out of a worker whose parsers run in a child)

        with parse_limits.using(self.limits):
            return page_count(path, content_type)

    def chunks(
        self,
        path: Path,
        content_type: str,
        spec: ChunkSpec,
        tokenizer: Tokenizer,
        on_progress: progress.Sink | None = None,
    ) -> Generator[ChunkDraft, None, int | None]:
        blocks = self.parse(path, content_type, spec.pages, on_progress, spec.ocr_languages)
        return prepare(blocks, tokenizer, spec)

    def prestart(self) -> None:
        pass

    def close(self) -> None:
        pass
