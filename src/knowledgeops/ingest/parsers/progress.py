"""What a parser tells while it works, besides its blocks: OCR progress, page by page.

A parser calls `report(...)`; whoever runs it (the parser process's request loop, or the
pipeline when parsing inline) listens with `listening(sink)`. A context variable, so each
parse has its own listener (the parser process's prefetch thread runs in a copy of the
context that set it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class OcrProgress:
    """`done` of `total` pages of this parse read by OCR; `page` the one just read (None in
    the first report, which only gives the total), with its confidence (None: no text on it)
    and whether it was left out of the index for being below the threshold."""

    done: int
    total: int
    page: int | None = None
    confidence: float | None = None
    low: bool = False


Sink = Callable[[OcrProgress], None]
_SINK: ContextVar[Sink | None] = ContextVar("kops_parse_progress", default=None)


def report(progress: OcrProgress) -> None:
    sink = _SINK.get()
    if sink is not None:
        sink(progress)


@contextmanager
def listening(sink: Sink | None) -> Iterator[None]:
    token = _SINK.set(sink)
    try:
        yield
    finally:
        _SINK.reset(token)
