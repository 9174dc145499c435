"""`AsyncKnowledgeOps`: the asynchronous twin of `KnowledgeOps` (sync.py), method for method:
the same endpoints (written once, in calls.py), the same models, retries and errors; `iter_…`
and `follow_…` are async iterators."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import ExitStack
from typing import Any, TypeVar

import httpx

from knowledgeops.client import calls
from knowledgeops.client.calls import TERMINAL, Call, FileInput, Retries
from knowledgeops.client.errors import (
    ConnectionFailed,
    NotFound,
    RateLimited,
    WaitTimeout,
)
from knowledgeops.client.sync import POLL_S, _lost
from knowledgeops.events_wire import EventParser, StreamEvent
from knowledgeops.schemas import (
    ChunkPublic,
    DatasetPublic,
    DocumentPublic,
    JobChangePublic,
    JobPublic,
    Listing,
    ModelPublic,
    ReindexAccepted,
    SearchResults,
    UploadAccepted,
    WebhookCreated,
    WebhookDeliveryPublic,
    WebhookPublic,
)

T = TypeVar("T")


class AsyncKnowledgeOps:
    """An asynchronous client for a running KnowledgeOps (httpx.AsyncClient).

    `base_url`: default KOPS_URL, else http://127.0.0.1:8000. `api_key`: sent as
    `Authorization: Bearer …`; default KOPS_API_KEY. 429 and 503 answers are sent again after
    the wait their Retry-After asks (at most `max_retries` times, each wait at most
    `max_wait_s`). `transport`: an httpx transport (e.g. `httpx.ASGITransport(app)` to call an
    app in the same process)."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        max_wait_s: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.base_url = calls.default_url(base_url)
        self.retries = Retries(max_retries=max_retries, max_wait_s=max_wait_s)
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=timeout,
            headers={**calls.auth_headers(api_key), **(headers or {})},
            transport=transport,
        )

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncKnowledgeOps:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- the one way a request is sent -------------------------------------------------------
    async def send(self, call: Call[T]) -> T:
        """Send `call`, again where Retries allows, and read its answer (or raise ApiError)."""
        tries = 0
        while True:
            tries += 1
            try:
                with ExitStack() as opened:
                    kwargs = call.request_kwargs(opened)
                    response = await self._http.request(call.method, call.path, **kwargs)
            except httpx.TransportError as exc:
                wait = self.retries.after_failure(exc, call, tries)
                if wait is None:
                    raise _lost(self.base_url, call, exc) from None
                await asyncio.sleep(wait)
                continue
            if response.status_code < 400:
                return call.read(response)
            wait = self.retries.after_answer(response, call, tries)
            if wait is None:
                raise calls.error_for(response)
            await asyncio.sleep(wait)

    # --- health and models -------------------------------------------------------------------
    async def health(self) -> dict[str, Any]:
        """`GET /healthz`: the process is up."""
        return await self.send(calls.health())

    async def ready(self) -> dict[str, Any]:
        """`GET /readyz`: the database, index and broker answer (ServiceUnavailable if not)."""
        return await self.send(calls.ready())

    async def models(self) -> list[ModelPublic]:
        """The embedding models a dataset may use."""
        return await self.send(calls.models())

    # --- datasets ----------------------------------------------------------------------------
    async def list_datasets(self, *, page: int = 1, limit: int = 100) -> Listing[DatasetPublic]:
        return await self.send(calls.list_datasets(page, limit))

    def iter_datasets(self, *, page_size: int = 200) -> AsyncIterator[DatasetPublic]:
        return self._walk(lambda page: calls.list_datasets(page, page_size))

    async def create_dataset(self, name: str, **settings: Any) -> DatasetPublic:
        """`settings`: description, chunk_size, chunk_overlap, ocr_languages, embedding_model."""
        return await self.send(calls.create_dataset(name, settings))

    async def get_dataset(self, dataset_id: str) -> DatasetPublic:
        return await self.send(calls.get_dataset(dataset_id))

    async def find_dataset(self, ref: str | None = None) -> DatasetPublic:
        """A dataset by id or name; None: the tenant's default dataset. NotFound if none."""
        async for dataset in self.iter_datasets():
            if (ref is None and dataset.is_default) or ref in (dataset.id, dataset.name):
                return dataset
        raise NotFound(f"no dataset named {ref!r}", status=404, code="not_found")

    async def update_dataset(self, dataset_id: str, **changes: Any) -> DatasetPublic:
        """`changes`: name, description, chunk_size, chunk_overlap, ocr_languages,
        embedding_model (a new model starts a re-embed: `reembed_job_id`)."""
        return await self.send(calls.update_dataset(dataset_id, changes))

    async def delete_dataset(self, dataset_id: str) -> None:
        await self.send(calls.delete_dataset(dataset_id))

    async def search(
        self,
        dataset_id: str,
        query: str,
        *,
        top_k: int = 5,
        mode: str = "hybrid",
        filter: Mapping[str, Any] | None = None,
    ) -> SearchResults:
        """`mode`: hybrid, vector or keyword. `filter`: document_ids, file_types, metadata."""
        return await self.send(calls.search(dataset_id, query, top_k, mode, filter))

    # --- documents ---------------------------------------------------------------------------
    async def upload(
        self,
        file: FileInput,
        *,
        dataset_id: str | None = None,
        file_name: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> UploadAccepted:
        """Upload a path, bytes (with `file_name`) or a binary file object; accepted at once
        (the job runs in the background: `wait(accepted.job_id)`). A retry of this call sends
        the same idempotency key, so it never makes a second document or job."""
        call = calls.upload(
            file,
            dataset_id=dataset_id,
            file_name=file_name,
            metadata=metadata,
            idempotency_key=idempotency_key,
        )
        return await self.send(call)

    async def list_documents(
        self, dataset_id: str, *, status: str | None = None, page: int = 1, limit: int = 100
    ) -> Listing[DocumentPublic]:
        return await self.send(calls.list_documents(dataset_id, status, page, limit))

    def iter_documents(
        self, dataset_id: str, *, status: str | None = None, page_size: int = 200
    ) -> AsyncIterator[DocumentPublic]:
        return self._walk(lambda page: calls.list_documents(dataset_id, status, page, page_size))

    async def get_document(self, document_id: str) -> DocumentPublic:
        return await self.send(calls.get_document(document_id))

    async def delete_document(self, document_id: str) -> None:
        await self.send(calls.delete_document(document_id))

    async def reindex_document(self, document_id: str) -> ReindexAccepted:
        return await self.send(calls.reindex_document(document_id))

    async def list_chunks(
        self, document_id: str, *, page: int = 1, limit: int = 100
    ) -> Listing[ChunkPublic]:
        return await self.send(calls.list_chunks(document_id, page, limit))

    def iter_chunks(self, document_id: str, *, page_size: int = 200) -> AsyncIterator[ChunkPublic]:
        return self._walk(lambda page: calls.list_chunks(document_id, page, page_size))

    # --- jobs --------------------------------------------------------------------------------
    async def list_jobs(
        self,
        *,
        status: str | None = None,
        dataset_id: str | None = None,
        document_id: str | None = None,
        page: int = 1,
        limit: int = 100,
    ) -> Listing[JobPublic]:
        return await self.send(calls.list_jobs(status, dataset_id, document_id, page, limit))

    def iter_jobs(
        self,
        *,
        status: str | None = None,
        dataset_id: str | None = None,
        document_id: str | None = None,
        page_size: int = 200,
    ) -> AsyncIterator[JobPublic]:
        return self._walk(
            lambda page: calls.list_jobs(status, dataset_id, document_id, page, page_size)
        )

    async def get_job(self, job_id: str) -> JobPublic:
        return await self.send(calls.get_job(job_id))

    async def retry_job(self, job_id: str) -> JobPublic:
        return await self.send(calls.retry_job(job_id))

    async def cancel_job(self, job_id: str) -> JobPublic:
        return await self.send(calls.cancel_job(job_id))

    def follow_job(
        self, job_id: str, *, last_event_id: str | None = None
    ) -> AsyncIterator[JobChangePublic]:
        """Each change of the job as it happens (its stream starts with the job as it stands),
        resuming after a dropped connection with none missed."""
        return self._changes(calls.job_events_path(job_id), last_event_id)

    def follow_dataset(
        self, dataset_id: str, *, last_event_id: str | None = None
    ) -> AsyncIterator[JobChangePublic]:
        """Each change of every job of the dataset, from now (or after `last_event_id`)."""
        return self._changes(calls.dataset_events_path(dataset_id), last_event_id)

    async def wait(self, job_id: str, *, timeout: float | None = None) -> JobPublic:
        """The job once it has ended (completed, failed or cancelled: look at `status`),
        following its event stream, or reading it every half second where the server has no
        stream to follow. WaitTimeout after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            async for change in self._changes(calls.job_events_path(job_id), None, deadline):
                if change.status in TERMINAL:
                    return await self.get_job(job_id)
        except (NotFound, RateLimited):  # no such job (raised below), or no stream for us now
            pass
        except WaitTimeout:
            pass  # read below: it may have ended at the last moment
        while True:
            job = await self.get_job(job_id)
            if job.status in TERMINAL:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"job {job_id} is still {job.status} after {timeout} s", job)
            await asyncio.sleep(POLL_S)

    # --- webhooks ----------------------------------------------------------------------------
    async def create_webhook(
        self,
        url: str,
        *,
        events: list[str] | None = None,
        dataset_id: str | None = None,
        description: str = "",
    ) -> WebhookCreated:
        """Subscribe `url` to `events` (default job.completed and job.failed), of one dataset
        or all of the tenant's. The answer holds the signing secret, shown this once."""
        chosen = events if events is not None else ["job.completed", "job.failed"]
        return await self.send(calls.create_webhook(url, chosen, dataset_id, description))

    async def list_webhooks(self, *, page: int = 1, limit: int = 100) -> Listing[WebhookPublic]:
        return await self.send(calls.list_webhooks(page, limit))

    async def get_webhook(self, webhook_id: str) -> WebhookPublic:
        return await self.send(calls.get_webhook(webhook_id))

    async def delete_webhook(self, webhook_id: str) -> None:
        await self.send(calls.delete_webhook(webhook_id))

    async def retry_delivery(self, webhook_id: str, event_id: str) -> WebhookDeliveryPublic:
        """Send a failed delivery again, with the same event id and body."""
        return await self.send(calls.retry_delivery(webhook_id, event_id))

    async def list_deliveries(
        self, webhook_id: str, *, page: int = 1, limit: int = 50
    ) -> Listing[WebhookDeliveryPublic]:
        """The webhook's deliveries, newest first, each with its attempts."""
        return await self.send(calls.list_deliveries(webhook_id, page, limit))

    # --- paging and streams ------------------------------------------------------------------
    async def _walk(self, page_call: Any) -> AsyncIterator[Any]:
        seen: set[str] = set()  # a page may shift while it is walked: nothing is given twice
        page = 1
        while True:
            listing = await self.send(page_call(page))
            for item in listing.items:
                if item.id not in seen:
                    seen.add(item.id)
                    yield item
            if not listing.has_more:
                return
            page += 1

    async def _changes(
        self, path: str, last_event_id: str | None, deadline: float | None = None
    ) -> AsyncIterator[JobChangePublic]:
        async for event in self.follow(path, last_event_id=last_event_id, deadline=deadline):
            if event.event == "job" and isinstance(event.data, dict):
                yield JobChangePublic.model_validate(event.data)

    async def follow(
        self,
        path: str,
        *,
        last_event_id: str | None = None,
        idle_timeout_s: float = 60.0,
        reconnects: int = 5,
        deadline: float | None = None,
    ) -> AsyncIterator[StreamEvent]:
        """The raw events of an event stream, reconnecting with Last-Event-ID when the
        connection drops (at most `reconnects` times in a row), so none is missed. The first
        event has only an id: where the stream began. A stream silent for `idle_timeout_s`
        (the server sends a comment every 15 s) counts as dropped. `deadline` (a
        time.monotonic() value): raise WaitTimeout once it passes."""
        failures = 0
        while True:
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"{path}: nothing more before the deadline", None)
            headers = {"Last-Event-ID": last_event_id} if last_event_id is not None else {}
            read = idle_timeout_s
            if deadline is not None:
                read = max(0.05, min(read, deadline - time.monotonic()))
            try:
                async with self._http.stream(
                    "GET", path, headers=headers, timeout=httpx.Timeout(10.0, read=read)
                ) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        raise calls.error_for(response)
                    parser = EventParser()
                    async for line in response.aiter_lines():
                        if deadline is not None and time.monotonic() >= deadline:
                            raise WaitTimeout(f"{path}: nothing more before the deadline", None)
                        event = parser.feed(line)
                        if event is None:
                            continue
                        failures = 0
                        if event.id is not None:
                            last_event_id = event.id
                        yield event
            except httpx.TransportError as exc:
                if deadline is not None and time.monotonic() >= deadline:
                    raise WaitTimeout(f"{path}: nothing more before the deadline", None) from None
                failures += 1
                if failures > reconnects:
                    raise ConnectionFailed(
                        f"lost the event stream {path} from {self.base_url} "
                        f"({type(exc).__name__}: {exc or 'no detail'})"
                    ) from None
            await asyncio.sleep(min(2.0, 0.2 * 2**failures))
