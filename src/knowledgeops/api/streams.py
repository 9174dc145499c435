"""Event streams of job changes (Server-Sent Events): what `GET /docs/jobs/{id}/events` and
`GET /datasets/{id}/events` send, read from the database's record of changes through this
process's change feed (jobs/feed.py; docs/architecture.md: Live progress).

A stream opens with a `retry:` hint and, as its `id:`, the feed's watermark (a client that
reconnects with it misses nothing from the moment it connected), then:
- resuming (`Last-Event-ID: N`): every recorded change after N, read from the database up to
  the feed's watermark, then the feed's changes after it: none missed, none twice;
- a new job stream: the job as it stands now (its event id is the watermark), then changes;
- a new dataset stream: the changes from now on (list the documents first).
An idle stream gets a comment line every `stream_heartbeat_s` (15 s). A client too slow to take
what it is sent is disconnected; its EventSource comes back with Last-Event-ID and loses nothing.
Each API key holds at most `max_streams_per_key` streams in one process (429 beyond).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import weakref
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from fastapi import Request
from fastapi.sse import ServerSentEvent, format_sse_event
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.responses import StreamingResponse

from knowledgeops.errors import InvalidRequest, TooManyRequests
from knowledgeops.jobs.feed import ChangeFeed, Topic
from knowledgeops.jobs.model import Change
from knowledgeops.schemas import JobChangePublic
from knowledgeops.service.knowledge_base import KnowledgeBase
from knowledgeops.service.views import JobView

RETRY_MS = 2000  # how long an EventSource waits before it reconnects
BACKLOG_PAGE = 1000  # changes read from the database per query when a stream resumes
MAX_QUEUED = 10_000  # changes waiting for one slow client before it is disconnected
GONE_CHECK_S = 1.0  # how often an idle stream looks whether its client went away
EVENT = "job"
HEARTBEAT = b": heartbeat\n\n"


class StreamSlots:
    """The event streams each caller holds open in this process, at most `per_caller`; and
    `closing`, which ends them all (the server is stopping: an open stream would otherwise hold
    its graceful shutdown for the whole timeout)."""

    _every: ClassVar[weakref.WeakSet[StreamSlots]] = weakref.WeakSet()

    def __init__(self, per_caller: int) -> None:
        self.per_caller = per_caller
        self.closing = threading.Event()
        self._open: Counter[str] = Counter()
        self._lock = threading.Lock()
        StreamSlots._every.add(self)

    @classmethod
    def close_all(cls) -> None:
        """End every event stream of this process (called when the server is told to stop)."""
        for slots in list(cls._every):
            slots.closing.set()

    def take(self, caller: str) -> Slot:
        with self._lock:
            if self._open[caller] >= self.per_caller:
                raise TooManyRequests(
                    f"this API key already holds {self.per_caller} open event streams "
                    "(KOPS_MAX_STREAMS_PER_KEY); close one, or follow a dataset's stream "
                    "instead of each job's",
                    code="too_many_streams",
                    retry_after_s=5,
                )
            self._open[caller] += 1
        return Slot(self, caller)

    def _give_back(self, caller: str) -> None:
        with self._lock:
            self._open[caller] -= 1
            if self._open[caller] <= 0:
                del self._open[caller]

    def held(self, caller: str) -> int:
        with self._lock:
            return self._open[caller]


@dataclass(eq=False)
class Slot:
    slots: StreamSlots
    caller: str
    _released: bool = False

    def release(self) -> None:
        """Give the slot back (once, however often it is called)."""
        if not self._released:
            self._released = True
            self.slots._give_back(self.caller)


@dataclass(eq=False)
class Follower:
    """One stream's inbox: the feed's thread appends, the event loop is woken to take."""

    loop: asyncio.AbstractEventLoop
    queued: deque[Change] = field(default_factory=deque)
    woken: asyncio.Event = field(default_factory=asyncio.Event)
    overflowed: bool = False

    def deliver(self, changes: Sequence[Change]) -> None:  # on the feed's thread
        if len(self.queued) + len(changes) > MAX_QUEUED:
            self.overflowed = True
        else:
            self.queued.extend(changes)
        self.loop.call_soon_threadsafe(self.woken.set)

    async def take(self, timeout: float) -> list[Change] | None:
        """What has arrived, or None when nothing did within `timeout` seconds."""
        if not self.queued and not self.overflowed:
            try:
                await asyncio.wait_for(self.woken.wait(), timeout)
            except TimeoutError:
                return None
        self.woken.clear()
        taken = list(self.queued)
        self.queued.clear()
        return taken


def last_event_id(header: str | None) -> int | None:
    if header is None or not header.strip():
        return None
    try:
        value = int(header.strip())
    except ValueError:
        raise InvalidRequest(
            "Last-Event-ID must be the id of an event this stream sent (a whole number)",
            code="invalid_last_event_id",
        ) from None
    if value < 0:
        raise InvalidRequest("Last-Event-ID cannot be negative", code="invalid_last_event_id")
    return value


def _unit(document_id: str | None) -> str:
    return "chunks" if document_id is not None else "documents"


def wire(event: ServerSentEvent) -> bytes:
    """The event as it goes on the wire."""
    return format_sse_event(
        data_str=event.raw_data,
        event=event.event,
        id=event.id,
        retry=event.retry,
        comment=event.comment,
    )


@functools.lru_cache(maxsize=8192)  # a change goes to every stream that follows it: encode once
def change_bytes(change: Change, ocr: tuple[int, int] | None) -> bytes:
    return wire(change_event(change, ocr))


def change_event(change: Change, ocr: tuple[int, int] | None) -> ServerSentEvent:
    body = JobChangePublic(
        event_id=change.id,
        job_id=change.job_id,
        dataset_id=change.dataset_id,
        document_id=change.document_id,
        status=change.status,
        stage=change.stage,
        unit=_unit(change.document_id),
        total_chunks=change.total,
        processed_chunks=change.processed,
        attempt=change.attempt,
        max_attempts=change.max_attempts,
        error=change.error,
        error_code=change.error_code,
        error_category=change.error_category,
        retryable=change.retryable,
        ocr_pages_done=None if ocr is None else ocr[0],
        ocr_pages_total=None if ocr is None else ocr[1],
        at=change.at,
    )
    return ServerSentEvent(
        event=EVENT, id=str(change.id), raw_data=body.model_dump_json(by_alias=True)
    )


def snapshot_event(job: JobView, event_id: int) -> ServerSentEvent:
    """The job as it stands, as an event with the watermark's id."""
    ocr = None if job.ocr_pages_done is None else (job.ocr_pages_done, job.ocr_pages_total or 0)
    now = Change(
        id=event_id,
        at=job.updated_at,
        job_id=job.id,
        dataset_id=job.dataset_id,
        document_id=job.document_id,
        status=job.status,
        stage=job.stage,
        total=job.total_chunks,
        processed=job.processed_chunks,
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        error=job.error,
        error_code=job.error_code,
        error_category=job.error_category,
        retryable=job.retryable,
    )
    return change_event(now, ocr)


Encode = Callable[[list[Change]], Awaitable[bytes]]


async def follow(
    request: Request,
    service: KnowledgeBase,
    feed: ChangeFeed,
    slot: Slot,
    topic: Topic,
    *,
    resume_after: int | None,
    snapshot: Callable[[], JobView] | None = None,
    encode: Encode | None = None,
) -> AsyncIterator[bytes]:
    """The bytes of one stream (see the module's doc), a batch of changes per write (what one
    poll of the feed brought), encoded by `encode` (default: `event: job` with JSON); ends only
    when the client goes (or is too slow) or the server stops, releasing its slot and its
    subscription."""
    encoded = encode or (lambda changes: json_events(service, changes))
    follower = Follower(asyncio.get_running_loop())
    try:
        sub = await run_in_threadpool(feed.subscribe, topic, follower.deliver)
    except BaseException:
        slot.release()
        raise
    heartbeat_s = service.admission.stream_heartbeat_s
    try:
        sent = sub.since
        opening = resume_after if resume_after is not None else sent
        yield wire(ServerSentEvent(comment="stream open", id=str(opening), retry=RETRY_MS))
        if resume_after is not None:
            sent = resume_after
            while True:
                backlog = await run_in_threadpool(
                    service.jobs.store.changes,
                    after=sent,
                    through=sub.since,
                    limit=BACKLOG_PAGE,
                    job_id=topic.job_id,
                    dataset_id=topic.dataset_id,
                )
                if backlog:
                    yield await encoded(backlog)
                if len(backlog) < BACKLOG_PAGE:
                    break
                sent = backlog[-1].id
            sent = max(sent, sub.since)
        elif snapshot is not None:  # read after subscribing: it holds every change up to `since`
            yield wire(snapshot_event(await run_in_threadpool(snapshot), sub.since))
        beat_at = time.monotonic()
        while not follower.overflowed:
            arrived = await follower.take(min(heartbeat_s, GONE_CHECK_S))
            if slot.slots.closing.is_set() or await request.is_disconnected():
                return  # the server stops, or the client went: its place is given back
            if arrived is None:
                if time.monotonic() - beat_at >= heartbeat_s:
                    beat_at = time.monotonic()
                    yield HEARTBEAT
                continue
            fresh = [change for change in arrived if change.id > sent]
            if fresh:
                beat_at = time.monotonic()
                yield await encoded(fresh)
                sent = fresh[-1].id
    finally:
        sub.close()
        slot.release()


async def json_events(service: KnowledgeBase, changes: list[Change]) -> bytes:
    reading = sorted({c.job_id for c in changes if c.stage == "ocr"})
    ocr = await run_in_threadpool(service.jobs.ocr_pages, reading) if reading else {}
    return b"".join(
        change_bytes(c, ocr.get(c.job_id) if c.stage == "ocr" else None) for c in changes
    )


class EventStream(StreamingResponse):
    """A `text/event-stream` answer (its own class, so the OpenAPI spec names the media type;
    not FastAPI's EventSourceResponse, which writes each event on its own)."""

    media_type = "text/event-stream"


def event_stream(body: AsyncIterator[bytes], slot: Slot) -> StreamingResponse:
    """The HTTP answer of a stream: written batch by batch (one write per poll of the feed, not
    per event), never cached or buffered by a proxy."""
    return EventStream(
        body,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        background=BackgroundTask(slot.release),  # also when the body never started
    )
