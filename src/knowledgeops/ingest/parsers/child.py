"""The parser process (see isolated.py): `python -m knowledgeops.ingest.parsers.child FD MB`.

It limits its own address space to MB MiB, then answers parse requests that arrive on the socket
FD, streaming blocks back; it exits when the socket closes or its parent process goes away.
Messages are JSON in both directions (never pickle: the worker must not run code a compromised
parser sends it). Requests: {"op": "parse", "path", "type", "limits"} and, to have the child
clean and chunk too (ingest/prepare.py), "chunk": {"size", "overlap", "max_text_chars",
"max_chunks", "first_page", "last_page"} (a page range: one part of a split PDF); or
{"op": "count", …}: a PDF's page count, answered as {"kind": "done", "pages"}. Answers:
{"kind": "blocks", "blocks": [[text, page, section], …]} or {"kind": "drafts", "drafts":
[[ordinal, text, tokens, page_start, page_end, section], …]}, among them OCR progress
{"kind": "ocr", "done", "total", "page", "confidence", "low"}, then {"kind": "done", "pages"}, or
{"kind": "error", "category", "code", "message"}, {"kind": "memory"}, {"kind": "oserror",
"errno", "message"}.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import json
import os
import queue
import resource
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from knowledgeops.errors import JobError
from knowledgeops.ingest.parsers import limits as parse_limits
from knowledgeops.ingest.parsers import progress
from knowledgeops.ingest.parsers.limits import ParseLimits
from knowledgeops.ingest.parsers.ocr import using_languages as ocr_languages

if TYPE_CHECKING:
    from knowledgeops.ingest.parsers.base import Block

BATCH_BLOCKS = 64  # blocks per message
BATCH_CHARS = 1_000_000  # … or fewer, once they hold this much text
PREFETCH_BLOCKS = 256  # blocks parsed ahead of the chunker, at most
BATCH_DRAFTS = 32  # chunk drafts per message (small: the worker embeds while more are made)


def _exit_with_parent(parent: int) -> None:
    """A parser stuck in a loop never reads its socket: leave when the parent is gone."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(0)


_SEND_LOCK = threading.Lock()  # OCR progress is sent from the prefetch thread too


def _send(conn: Connection, message: dict[str, object]) -> None:
    data = json.dumps(message, ensure_ascii=False).encode()
    with _SEND_LOCK:
        conn.send_bytes(data)


def _progress_sender(conn: Connection) -> progress.Sink:
    def send(event: progress.OcrProgress) -> None:
        _send(
            conn,
            {
                "kind": "ocr",
                "done": event.done,
                "total": event.total,
                "page": event.page,
                "confidence": event.confidence,
                "low": event.low,
            },
        )

    return send


def serve(conn: Connection) -> None:
    from knowledgeops.ingest.parsers.registry import page_count, parse  # noqa: PLC0415 (parsers load under the memory limit main() sets)

    fields = {f.name for f in dataclasses.fields(ParseLimits)}
    _tokenizer()  # loaded before "ready": its load is no document's parse time
    _send(conn, {"kind": "ready", "pid": os.getpid()})
    while True:
        try:
            request = json.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        limits = ParseLimits(**{k: v for k, v in request["limits"].items() if k in fields})
        try:
            with parse_limits.using(limits), progress.listening(_progress_sender(conn)):
                path, content_type, chunk = Path(request["path"]), request["type"], request["chunk"]
                if request.get("op") == "count":
                    _send(conn, {"kind": "done", "pages": page_count(path, content_type)})
                    continue
                page_range = None
                if chunk is not None and chunk.get("first_page") is not None:
                    page_range = (int(chunk["first_page"]), int(chunk["last_page"]))
                languages = None if chunk is None else chunk.get("ocr_languages")
                with ocr_languages(languages):
                    blocks = parse(path, content_type, page_range)
                    if chunk is None:
                        _send_blocks(conn, blocks)
                        pages = None
                    else:
                        chunk["ocr_languages"] = tuple(languages or ())
                        pages = _send_drafts(conn, blocks, chunk)
            _send(conn, {"kind": "done", "pages": pages})
        except JobError as exc:
            category = exc.category.value
            _send(
                conn,
                {"kind": "error", "category": category, "code": exc.code, "message": exc.message},
            )
        except MemoryError:
            _send(conn, {"kind": "memory"})
            return  # the heap may be in a poor state: the parent starts a fresh process
        except OSError as exc:
            _send(
                conn, {"kind": "oserror", "errno": exc.errno, "message": exc.strerror or str(exc)}
            )
        except Exception:  # a bug in our cleaning or chunking, not a damaged file
            traceback.print_exc()  # to the worker's stderr, where its log goes
            message = "an internal error stopped this document; the operator's log has the details"
            _send(
                conn,
                {
                    "kind": "error",
                    "category": "permanent",
                    "code": "internal_error",
                    "message": message,
                },
            )


def _send_blocks(conn: Connection, blocks: Iterable[Block]) -> None:
    batch: list[tuple[str, int | None, str | None]] = []
    size = 0
    for block in blocks:
        batch.append((block.text, block.page, block.section))
        size += len(block.text)
        if len(batch) >= BATCH_BLOCKS or size >= BATCH_CHARS:
            _send(conn, {"kind": "blocks", "blocks": batch})
            batch, size = [], 0
    if batch:
        _send(conn, {"kind": "blocks", "blocks": batch})


@functools.cache
def _tokenizer() -> Any:
    """The model's tokenizer, loaded once per child (the worker chunks with the same one)."""
    from knowledgeops.ingest.chunker import HFTokenizer  # noqa: PLC0415 (parsers load under the memory limit main() sets)
    from knowledgeops.ingest.embedders.local import load_tokenizer  # noqa: PLC0415 (parsers load under the memory limit main() sets)

    return HFTokenizer(load_tokenizer())


def _send_drafts(conn: Connection, blocks: Iterable[Block], spec: dict[str, Any]) -> int | None:
    """Clean and chunk here too, streaming the drafts back."""
    from knowledgeops.ingest.prepare import ChunkSpec, ChunkStream, prepare  # noqa: PLC0415 (parsers load under the memory limit main() sets)

    stream = ChunkStream(prepare(_prefetched(blocks), _tokenizer(), ChunkSpec(**spec)))
    batch: list[tuple[int, str, int, int | None, int | None, str | None]] = []
    for d in stream:
        batch.append((d.ordinal, d.text, d.token_count, d.page_start, d.page_end, d.section))
        if len(batch) >= BATCH_DRAFTS:
            _send(conn, {"kind": "drafts", "drafts": batch})
            batch = []
    if batch:
        _send(conn, {"kind": "drafts", "drafts": batch})
    return stream.pages


class _End:
    def __init__(self, error: BaseException | None) -> None:
        self.error = error


def _prefetched(blocks: Iterable[Block], depth: int = PREFETCH_BLOCKS) -> Iterator[Block]:
    """The blocks, parsed in a thread of their own while this one cleans and chunks the blocks
    before them (pdfium and lxml release the GIL, so the two overlap). The parser runs in a copy
    of this context (the parse limits are a context variable); its errors are raised here; the
    thread has ended before this generator does, so the next document's parser never runs
    beside it."""
    ready: queue.Queue[Block | _End] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Block | _End) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for block in blocks:
                if not put(block):
                    return
            put(_End(None))
        except BaseException as exc:  # handed to the consumer, which classifies it
            put(_End(exc))
        finally:
            close = getattr(blocks, "close", None)
            if close is not None:
                close()

    context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(produce,), daemon=True)
    thread.start()
    try:
        while True:
            item = ready.get()
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                return
            yield item
    finally:
        stop.set()
        thread.join()


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
