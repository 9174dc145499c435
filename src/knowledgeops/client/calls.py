"""Every endpoint of the API, written once as a `Call`: method, path, parameters, body and how
the answer is read. The blocking client (`sync.py`) and the asynchronous one (`aio.py`) only
send them; what a retry may do, how an error answer becomes an exception and how an upload's
body is built again for a second try live here too, so the two clients cannot drift apart."""

from __future__ import annotations

import email.utils
import io
import json
import os
import random
import time
import uuid
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Generic, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter

from knowledgeops.client.errors import ApiError, error_class
from knowledgeops.schemas import (
    ChunkPublic,
    DatasetPublic,
    DocumentPublic,
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
M = TypeVar("M", bound=BaseModel)

DEFAULT_URL = "http://127.0.0.1:8000"
TERMINAL = frozenset({"completed", "failed", "cancelled"})
FileInput = str | os.PathLike[str] | bytes | IO[bytes]
"""What `upload` takes: a path, the bytes themselves, or a file opened in binary mode."""


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request and how its answer is read. `replayable`: sending it twice does no harm
    (a read, or a write made idempotent by its key), so it may be sent again when the
    connection broke before the answer came."""

    method: str
    path: str
    read: Callable[[httpx.Response], T]
    params: Mapping[str, Any] | None = None
    json: Any = None
    headers: Mapping[str, str] | None = None
    body: Callable[[ExitStack], Mapping[str, Any]] | None = None  # multipart, built per try
    replayable: bool = True
    rewindable: bool = True  # its body can be sent again (not a file object read only once)

    def request_kwargs(self, opened: ExitStack) -> dict[str, Any]:
        """The arguments of one try; files the body opens are closed with `opened`."""
        kwargs: dict[str, Any] = {}
        if self.params:
            kwargs["params"] = {k: v for k, v in self.params.items() if v is not None}
        if self.json is not None:
            kwargs["json"] = self.json
        if self.headers:
            kwargs["headers"] = dict(self.headers)
        if self.body is not None:
            kwargs.update(self.body(opened))
        return kwargs


def _model(model: type[M]) -> Callable[[httpx.Response], M]:
    return lambda response: model.model_validate(response.json())


def _listing(model: type[M]) -> Callable[[httpx.Response], Listing[M]]:
    return lambda response: Listing[model].model_validate(response.json())  # type: ignore[valid-type]


def _nothing(response: httpx.Response) -> None:
    return None


def _json(response: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = response.json()
    return body


_MODELS = TypeAdapter(list[ModelPublic])


def _camel(values: Mapping[str, Any]) -> dict[str, Any]:
    """snake_case keyword arguments → the API's camelCase names; None values left out."""
    out = {}
    for name, value in values.items():
        if value is None:
            continue
        head, *rest = name.split("_")
        out[head + "".join(part.title() for part in rest)] = value
    return out


# --- health and models -------------------------------------------------------------------------
def health() -> Call[dict[str, Any]]:
    return Call("GET", "/healthz", _json)


def ready() -> Call[dict[str, Any]]:
    return Call("GET", "/readyz", _json)


def models() -> Call[list[ModelPublic]]:
    return Call("GET", "/models", lambda r: _MODELS.validate_python(r.json()))


# --- datasets ----------------------------------------------------------------------------------
def list_datasets(page: int = 1, limit: int = 100) -> Call[Listing[DatasetPublic]]:
    return Call("GET", "/datasets", _listing(DatasetPublic), {"page": page, "limit": limit})


def create_dataset(name: str, settings: Mapping[str, Any]) -> Call[DatasetPublic]:
    body = {"name": name, **_camel(settings)}
    return Call("POST", "/datasets", _model(DatasetPublic), json=body, replayable=False)


def get_dataset(dataset_id: str) -> Call[DatasetPublic]:
    return Call("GET", f"/datasets/{dataset_id}", _model(DatasetPublic))


def update_dataset(dataset_id: str, changes: Mapping[str, Any]) -> Call[DatasetPublic]:
    return Call("PATCH", f"/datasets/{dataset_id}", _model(DatasetPublic), json=_camel(changes))


def delete_dataset(dataset_id: str) -> Call[None]:
    # not replayable: sent again after a lost answer it would say 404 for what it did
    return Call("DELETE", f"/datasets/{dataset_id}", _nothing, replayable=False)


def search(
    dataset_id: str, query: str, top_k: int, mode: str, filter: Mapping[str, Any] | None
) -> Call[SearchResults]:
    body: dict[str, Any] = {"query": query, "topK": top_k, "mode": mode}
    if filter:
        body["filter"] = _camel(filter)
    return Call("POST", f"/datasets/{dataset_id}/search", _model(SearchResults), json=body)


# --- documents ---------------------------------------------------------------------------------
def list_documents(
    dataset_id: str, status: str | None, page: int, limit: int
) -> Call[Listing[DocumentPublic]]:
    params = {"status": status, "page": page, "limit": limit}
    return Call("GET", f"/datasets/{dataset_id}/documents", _listing(DocumentPublic), params)


def get_document(document_id: str) -> Call[DocumentPublic]:
    return Call("GET", f"/docs/documents/{document_id}", _model(DocumentPublic))


def delete_document(document_id: str) -> Call[None]:
    return Call("DELETE", f"/docs/documents/{document_id}", _nothing, replayable=False)


def reindex_document(document_id: str) -> Call[ReindexAccepted]:
    path = f"/docs/documents/{document_id}/reindex"
    return Call("POST", path, _model(ReindexAccepted), replayable=False)


def list_chunks(document_id: str, page: int, limit: int) -> Call[Listing[ChunkPublic]]:
    params = {"page": page, "limit": limit}
    return Call("GET", f"/docs/documents/{document_id}/chunks", _listing(ChunkPublic), params)


def upload(
    file: FileInput,
    *,
    dataset_id: str | None,
    file_name: str | None,
    metadata: Mapping[str, Any] | None,
    idempotency_key: str | None,
) -> Call[UploadAccepted]:
    """The upload of `file`, with an idempotency key made for this call when none is given:
    every retry of it sends the same key, so the server answers it once however often it is
    sent."""
    name, opener, rewindable = _file_parts(file, file_name)
    fields = {"metadata": json.dumps(dict(metadata))} if metadata else None

    def body(opened: ExitStack) -> dict[str, Any]:
        parts: dict[str, Any] = {"files": {"file": (name, opener(opened))}}
        if fields:
            parts["data"] = fields
        return parts

    key = idempotency_key or f"sdk-{uuid.uuid4()}"
    return Call(
        "POST",
        "/docs/upload",
        _model(UploadAccepted),
        params={"datasetId": dataset_id},
        headers={"Idempotency-Key": key},
        body=body,
        replayable=rewindable,
        rewindable=rewindable,
    )


def _file_parts(
    file: FileInput, file_name: str | None
) -> tuple[str, Callable[[ExitStack], IO[bytes]], bool]:
    """The name to send, a way to read the file from its start for each try (a path is opened
    for each, and closed after it; a caller's file object stays open), and whether a second
    try can read it again (not a file object that cannot seek)."""
    if isinstance(file, bytes | bytearray | memoryview):
        if not file_name:
            raise ValueError("uploading bytes needs file_name= (its suffix tells the type)")
        data = bytes(file)
        return file_name, lambda opened: io.BytesIO(data), True
    if isinstance(file, str | os.PathLike):
        path = Path(file)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file")
        return file_name or path.name, lambda opened: opened.enter_context(path.open("rb")), True
    handle = file
    name = file_name or Path(str(getattr(handle, "name", "") or "")).name
    if not name:
        raise ValueError(
            "this file object has no name: pass file_name= (its suffix tells the type)"
        )
    start = handle.tell() if handle.seekable() else None

    def rewound(opened: ExitStack) -> IO[bytes]:
        if start is None:
            return handle
        handle.seek(start)
        # httpx sends a seekable file from its first byte: one read where it stood is wrapped
        return handle if start == 0 else _Remaining(handle)  # type: ignore[return-value]

    return name, rewound, start is not None


class _Remaining:
    """A file object read from where it stands, with nothing to seek: so that httpx sends the
    rest of it, not all of it (and, its length unknown, sends it in chunks)."""

    def __init__(self, handle: IO[bytes]) -> None:
        self._handle = handle

    def read(self, size: int = -1) -> bytes:
        return self._handle.read(size)


# --- jobs --------------------------------------------------------------------------------------
def list_jobs(
    status: str | None,
    dataset_id: str | None,
    document_id: str | None,
    page: int,
    limit: int,
) -> Call[Listing[JobPublic]]:
    params = {
        "status": status,
        "datasetId": dataset_id,
        "documentId": document_id,
        "page": page,
        "limit": limit,
    }
    return Call("GET", "/docs/jobs", _listing(JobPublic), params)


def get_job(job_id: str) -> Call[JobPublic]:
    return Call("GET", f"/docs/jobs/{job_id}", _model(JobPublic))


def retry_job(job_id: str) -> Call[JobPublic]:
    return Call("POST", f"/docs/jobs/{job_id}/retry", _model(JobPublic), replayable=False)


def cancel_job(job_id: str) -> Call[JobPublic]:
    return Call("POST", f"/docs/jobs/{job_id}/cancel", _model(JobPublic), replayable=False)


def job_events_path(job_id: str) -> str:
    return f"/docs/jobs/{job_id}/events"


def dataset_events_path(dataset_id: str) -> str:
    return f"/datasets/{dataset_id}/events"


# --- webhooks ----------------------------------------------------------------------------------
def create_webhook(
    url: str, events: list[str], dataset_id: str | None, description: str
) -> Call[WebhookCreated]:
    body = _camel({"url": url, "events": events, "dataset_id": dataset_id})
    body["description"] = description
    return Call("POST", "/webhooks", _model(WebhookCreated), json=body, replayable=False)


def list_webhooks(page: int, limit: int) -> Call[Listing[WebhookPublic]]:
    return Call("GET", "/webhooks", _listing(WebhookPublic), {"page": page, "limit": limit})


def get_webhook(webhook_id: str) -> Call[WebhookPublic]:
    return Call("GET", f"/webhooks/{webhook_id}", _model(WebhookPublic))


def delete_webhook(webhook_id: str) -> Call[None]:
    return Call("DELETE", f"/webhooks/{webhook_id}", _nothing, replayable=False)


def list_deliveries(webhook_id: str, page: int, limit: int) -> Call[Listing[WebhookDeliveryPublic]]:
    path = f"/webhooks/{webhook_id}/deliveries"
    return Call("GET", path, _listing(WebhookDeliveryPublic), {"page": page, "limit": limit})


def retry_delivery(webhook_id: str, event_id: str) -> Call[WebhookDeliveryPublic]:
    path = f"/webhooks/{webhook_id}/deliveries/{event_id}/retry"
    return Call("POST", path, _model(WebhookDeliveryPublic), replayable=False)


# --- answers, errors and retries ---------------------------------------------------------------
def error_for(response: httpx.Response) -> ApiError:
    """The typed exception for an error answer, with the API's message and code."""
    fields = None
    try:
        body = response.json()
        message = str(body.get("error") or body.get("detail") or response.text)
        code, fields = body.get("code"), body.get("fields")
    except (ValueError, AttributeError):
        message, code = response.text or response.reason_phrase, None
    if response.status_code == 401:
        message = f"{message} (pass api_key= or set KOPS_API_KEY)"
    return error_class(response.status_code)(
        message,
        status=response.status_code,
        code=code,
        fields=fields,
        retry_after_s=retry_after(response),
    )


def retry_after(response: httpx.Response) -> float | None:
    """Retry-After in seconds (a number or an HTTP date), None when absent or unreadable."""
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError):
        return None  # neither seconds nor a date: as if it were not there
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - time.time())


@dataclass(frozen=True, slots=True)
class Retries:
    """When a request is sent again: on 429 (refused before anything was done) and, for a
    replayable call, 503 (which may come after a commit, from a proxy), waiting what
    Retry-After asks, at most `max_wait_s` (a longer wait is raised instead); and on a
    connection that failed before an answer came (a replayable call only, unless nothing was
    sent). Never a body that cannot be read twice. At most `max_retries` times, with
    exponential backoff and jitter where the server named no wait."""

    max_retries: int = 3
    max_wait_s: float = 30.0
    base_s: float = 0.5
    rand: random.Random = field(default_factory=random.Random)

    def after_answer(self, response: httpx.Response, call: Call[Any], tries: int) -> float | None:
        """Seconds to wait before sending again, or None to give the answer as it is."""
        if tries > self.max_retries or not call.rewindable:
            return None
        if not (response.status_code == 429 or (response.status_code == 503 and call.replayable)):
            return None
        asked = retry_after(response)
        if asked is None:
            return self._backoff(tries)
        return asked if asked <= self.max_wait_s else None

    def after_failure(self, exc: httpx.TransportError, call: Call[Any], tries: int) -> float | None:
        if tries > self.max_retries:
            return None
        unsent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
        if not (unsent or (call.replayable and call.rewindable)):
            return None
        return self._backoff(tries)

    def _backoff(self, tries: int) -> float:
        return self.rand.uniform(0, min(self.max_wait_s, self.base_s * 2 ** (tries - 1)))


def default_url(base_url: str | None) -> str:
    return (base_url or os.environ.get("KOPS_URL") or DEFAULT_URL).rstrip("/")


def auth_headers(api_key: str | None) -> dict[str, str]:
    key = api_key if api_key is not None else os.environ.get("KOPS_API_KEY")
    return {"Authorization": f"Bearer {key.strip()}"} if key else {}
