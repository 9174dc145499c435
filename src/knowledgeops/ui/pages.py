"""The dashboard's pages and the actions their buttons take: the same use cases as the API
(`KnowledgeBase`), scoped to the signed-in key's tenant."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Form, Header, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.sse import ServerSentEvent
from starlette.concurrency import run_in_threadpool

from knowledgeops.api.deps import DatasetId, DocumentId, JobId
from knowledgeops.api.errors import status_of
from knowledgeops.api.streams import (
    EventStream,
    Slot,
    StreamSlots,
    event_stream,
    follow,
    last_event_id,
    wire,
)
from knowledgeops.api.upload_stream import receive_upload
from knowledgeops.errors import InvalidField, InvalidTransition, NotFound, RequestError
from knowledgeops.jobs.feed import ChangeFeed, Topic
from knowledgeops.jobs.model import Change
from knowledgeops.jobs.states import JobStatus
from knowledgeops.service.documents import DOCUMENT_STATUSES
from knowledgeops.service.knowledge_base import KnowledgeBase
from knowledgeops.service.search import SearchMode
from knowledgeops.service.views import DocumentView, JobView
from knowledgeops.ui.render import render, render_text
from knowledgeops.ui.session import (
    CSRF_FIELD,
    User,
    UserDep,
    check_csrf,
    clear_session,
    same_origin,
    set_session,
)

router = APIRouter(prefix="/ui", include_in_schema=False)
PAGE = 25  # rows per page
CHUNK_PAGE = 20
Csrf = Annotated[str | None, Form(alias=CSRF_FIELD)]


def _service(request: Request) -> KnowledgeBase:
    service: KnowledgeBase = request.app.state.service
    return service


def _see_other(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


# --- signing in ---------------------------------------------------------------------------------
@router.get("", response_class=HTMLResponse)
def home() -> RedirectResponse:
    return _see_other("/ui/datasets")


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request) -> Any:
    return render(request, "login.html", user=None)


@router.post("/login", response_class=HTMLResponse)
def login(request: Request, key: Annotated[str, Form(max_length=400)] = "") -> Any:
    same_origin(request)
    service = _service(request)
    found = service.keys.authenticate(key.strip()) if key.strip() else None
    if found is None:
        request.app.state.rate_limiter.check(
            f"addr:{request.client.host if request.client else '-'}"
        )
        message = "That key is not valid: it is unknown or was revoked." if key else "Enter a key."
        return render(request, "login.html", 401, user=None, error=message)
    response = _see_other("/ui/datasets")
    set_session(response, key.strip(), secure=request.url.scheme == "https")
    return response


@router.post("/logout")
def logout(request: Request, user: UserDep, csrf: Csrf = None) -> Response:
    check_csrf(request, user, csrf)
    response = _see_other("/ui/login")
    clear_session(response)
    return response


# --- datasets -----------------------------------------------------------------------------------
@router.get("/datasets", response_class=HTMLResponse)
def datasets_page(
    request: Request, user: UserDep, page: Annotated[int, Query(ge=1, le=100_000)] = 1
) -> Any:
    service = _service(request)
    service.datasets.ensure_default(user.tenant)
    found = service.datasets.list(user.tenant, page=page, limit=PAGE)
    return render(request, "datasets.html", user=user, datasets=found, models=service.models.names)


@dataclass(frozen=True, slots=True)
class DatasetForm:
    """A dataset's form, as typed (numbers are checked by `_number`)."""

    name: str
    description: str
    chunk_size: str
    chunk_overlap: str
    embedding_model: str
    csrf: str | None


def _dataset_form(
    name: Annotated[str, Form(max_length=200)] = "",
    description: Annotated[str, Form(max_length=10_000)] = "",
    chunk_size: Annotated[str, Form()] = "",
    chunk_overlap: Annotated[str, Form()] = "",
    embedding_model: Annotated[str, Form()] = "",
    csrf: Csrf = None,
) -> DatasetForm:
    return DatasetForm(name, description, chunk_size, chunk_overlap, embedding_model, csrf)


Filled = Annotated[DatasetForm, Depends(_dataset_form)]


@router.post("/datasets", response_class=HTMLResponse)
def create_dataset(request: Request, user: UserDep, form: Filled) -> Any:
    check_csrf(request, user, form.csrf)
    service = _service(request)
    try:
        made = service.datasets.create(
            user.tenant,
            form.name.strip(),
            form.description,
            chunk_size=_number(form.chunk_size, "chunk size"),
            chunk_overlap=_number(form.chunk_overlap, "chunk overlap"),
            embedding_model=form.embedding_model or None,
        )
    except RequestError as exc:
        found = service.datasets.list(user.tenant, page=1, limit=PAGE)
        return render(
            request,
            "datasets.html",
            status_of(exc),
            user=user,
            datasets=found,
            models=service.models.names,
            error=exc.message,
            form=form,
        )
    return _see_other(f"/ui/datasets/{made.id}")


def _number(value: str, what: str) -> int | None:
    if not value.strip():
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidField(f"the {what} must be a whole number of tokens") from None


@router.get("/datasets/{dataset_id}/settings", response_class=HTMLResponse)
def settings_page(request: Request, user: UserDep, dataset_id: DatasetId) -> Any:
    service = _service(request)
    dataset = service.datasets.get(user.tenant, dataset_id)
    return render(request, "settings.html", user=user, dataset=dataset, models=service.models.names)


@router.post("/datasets/{dataset_id}/settings", response_class=HTMLResponse)
def update_settings(request: Request, user: UserDep, dataset_id: DatasetId, form: Filled) -> Any:
    check_csrf(request, user, form.csrf)
    service = _service(request)
    current = service.datasets.get(user.tenant, dataset_id)
    changes: dict[str, Any] = {}
    try:
        if form.name.strip() and form.name.strip() != current.name:
            changes["name"] = form.name.strip()
        if form.description != current.description:
            changes["description"] = form.description
        for field, value in (
            ("chunk_size", form.chunk_size),
            ("chunk_overlap", form.chunk_overlap),
        ):
            number = _number(value, field.replace("_", " "))
            if number is not None and number != getattr(current, field):
                changes[field] = number
        if form.embedding_model and form.embedding_model != current.embedding_model:
            changes["embedding_model"] = form.embedding_model
        updated = service.datasets.update(user.tenant, dataset_id, changes) if changes else current
    except RequestError as exc:
        return render(
            request,
            "settings.html",
            status_of(exc),
            user=user,
            dataset=current,
            models=service.models.names,
            error=exc.message,
        )
    return render(
        request,
        "settings.html",
        user=user,
        dataset=updated,
        models=service.models.names,
        saved="Saved." if changes else "Nothing changed.",
    )


@router.post("/datasets/{dataset_id}/delete", response_class=HTMLResponse)
def delete_dataset(
    request: Request,
    user: UserDep,
    dataset_id: DatasetId,
    confirm: Annotated[str, Form(max_length=200)] = "",
    csrf: Csrf = None,
) -> Any:
    check_csrf(request, user, csrf)
    service = _service(request)
    dataset = service.datasets.get(user.tenant, dataset_id)
    if confirm != dataset.name:
        return render(
            request,
            "settings.html",
            422,
            user=user,
            dataset=dataset,
            models=service.models.names,
            error=f"To delete it, type the dataset's name ({dataset.name}) exactly.",
        )
    service.datasets.delete(user.tenant, dataset_id)
    return _see_other("/ui/datasets")


# --- a dataset's documents --------------------------------------------------------------------
def _rows(
    service: KnowledgeBase, user: User, docs: Sequence[DocumentView]
) -> list[tuple[DocumentView, JobView | None]]:
    jobs = service.jobs.views(user.tenant, [d.latest_job_id for d in docs if d.latest_job_id])
    return [(d, jobs.get(d.latest_job_id or "")) for d in docs]


@router.get("/datasets/{dataset_id}", response_class=HTMLResponse)
def dataset_page(
    request: Request,
    user: UserDep,
    dataset_id: DatasetId,
    status: Annotated[str, Query(max_length=20)] = "",
    page: Annotated[int, Query(ge=1, le=100_000)] = 1,
) -> Any:
    service = _service(request)
    dataset = service.datasets.get(user.tenant, dataset_id)
    chosen = status if status in DOCUMENT_STATUSES else None
    docs = service.documents.list(user.tenant, dataset_id, status=chosen, page=page, limit=PAGE)
    return render(
        request,
        "dataset.html",
        user=user,
        dataset=dataset,
        docs=docs,
        rows=_rows(service, user, docs.items),
        status=chosen or "",
        statuses=DOCUMENT_STATUSES,
    )


def _row_html(request: Request, user: User, document_id: str, notice: str = "") -> str:
    service = _service(request)
    doc = service.documents.get(user.tenant, document_id)
    ((doc, job),) = _rows(service, user, [doc])
    return render_text(request, "_row.html", user=user, doc=doc, job=job, notice=notice)


def _row_response(request: Request, user: User, document_id: str, notice: str = "") -> Response:
    return HTMLResponse(_row_html(request, user, document_id, notice))


@router.post("/jobs/{job_id}/{action}", response_class=HTMLResponse)
def job_action(
    request: Request,
    user: UserDep,
    job_id: JobId,
    action: Annotated[str, Path(pattern="^(retry|cancel)$")],
) -> Response:
    check_csrf(request, user)
    service = _service(request)
    job = service.jobs.get(user.tenant, job_id)
    notice = ""
    try:
        if action == "retry":
            service.jobs.retry(user.tenant, job_id)
        else:
            service.jobs.cancel(user.tenant, job_id)
    except (RequestError, InvalidTransition) as exc:
        if isinstance(exc, NotFound):
            raise
        notice = exc.message
    if job.document_id is None:
        return HTMLResponse("")
    return _row_response(request, user, job.document_id, notice)


@router.post("/documents/{document_id}/reindex", response_class=HTMLResponse)
def reindex(request: Request, user: UserDep, document_id: DocumentId) -> Response:
    check_csrf(request, user)
    notice = ""
    try:
        _service(request).documents.reindex(user.tenant, document_id)
    except RequestError as exc:
        if isinstance(exc, NotFound):
            raise
        notice = exc.message
    return _row_response(request, user, document_id, notice)


@router.post("/documents/{document_id}/delete", response_class=HTMLResponse)
def delete_document(request: Request, user: UserDep, document_id: DocumentId) -> Response:
    check_csrf(request, user)
    _service(request).documents.delete(user.tenant, document_id)
    return HTMLResponse("")  # the row is swapped for nothing


@router.post("/datasets/{dataset_id}/upload", response_class=HTMLResponse)
async def upload(request: Request, user: UserDep, dataset_id: DatasetId) -> Response:
    """One file (the page sends each dropped file on its own, so each gets its own answer):
    its result in words, and the document's row when it was accepted."""
    check_csrf(request, user)
    service = _service(request)
    await run_in_threadpool(service.datasets.get, user.tenant, dataset_id)
    name = request.headers.get("x-file-name", "the file")
    try:
        await run_in_threadpool(service.uploads.check_backlog)
        received = await receive_upload(request, service.uploads)
        name = received.file_name or name
        accepted = await run_in_threadpool(
            service.uploads.accept,
            user.tenant,
            received.staged,
            file_name=received.file_name,
            declared_type=received.declared_type,
            dataset_id=dataset_id,
            idempotency_key=None,
            metadata={},
        )
    except RequestError as exc:
        result = render_text(
            request,
            "_upload.html",
            name=name,
            outcome="refused",
            status=status_of(exc),
            message=exc.message,
        )
        return HTMLResponse(result)
    outcome = "duplicate" if accepted.duplicate else "accepted"
    message = (
        "these bytes are already in this dataset: the existing document is shown"
        if accepted.duplicate
        else "it is processed in the background"
    )
    result = render_text(
        request,
        "_upload.html",
        name=name,
        outcome=outcome,
        status=200 if accepted.duplicate else 202,
        message=message,
    )
    row = await run_in_threadpool(_row_html, request, user, accepted.document_id)
    # a row parses only inside a table: the page's script takes it from this one
    return HTMLResponse(f"{result}<table><tbody>{row}</tbody></table>")


# --- live rows ----------------------------------------------------------------------------------
class RowCache:
    """Rows rendered for a change, shared by every open page of its dataset (one tenant's):
    a change is rendered once however many pages show it."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._rows: OrderedDict[tuple[int, str], bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[int, str]) -> bytes | None:
        with self._lock:
            return self._rows.get(key)

    def put(self, key: tuple[int, str], value: bytes) -> None:
        with self._lock:
            self._rows[key] = value
            while len(self._rows) > self.size:
                self._rows.popitem(last=False)


ROWS = RowCache()


def _ui_slot(request: Request, user: UserDep) -> Slot:
    slots: StreamSlots = request.app.state.stream_slots
    return slots.take(user.principal.key_id or "ui-open")


@router.get("/datasets/{dataset_id}/events", response_class=EventStream)
async def live_rows(
    request: Request,
    user: UserDep,
    dataset_id: DatasetId,
    slot: Annotated[Slot, Depends(_ui_slot)],
    last: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> Response:
    """Each change of the dataset's documents' jobs as the row to show (`event: doc-<id>`; the
    newest of a batch per document), read from the same record as the API's streams; a deleted
    document's row is emptied."""
    service = _service(request)
    try:
        await run_in_threadpool(service.datasets.get, user.tenant, dataset_id)
        resume = last_event_id(last)
    except BaseException:
        slot.release()
        raise
    feed: ChangeFeed = request.app.state.feed

    async def rows(changes: list[Change]) -> bytes:
        newest = {c.document_id: c for c in changes if c.document_id is not None}
        parts = []
        for document_id, change in newest.items():
            key = (change.id, document_id)
            encoded = ROWS.get(key)
            if encoded is None:
                try:
                    row = await run_in_threadpool(_row_html, request, user, document_id)
                except NotFound:
                    row = ""
                event = ServerSentEvent(event=f"doc-{document_id}", id=str(change.id), raw_data=row)
                encoded = wire(event)
                ROWS.put(key, encoded)
            parts.append(encoded)
        return b"".join(parts)

    body = follow(
        request,
        service,
        feed,
        slot,
        Topic(dataset_id=dataset_id),
        resume_after=resume,
        encode=rows,
    )
    return event_stream(body, slot)


# --- a document's chunks, search, the deployment -----------------------------------------------
@router.get("/documents/{document_id}", response_class=HTMLResponse)
def document_page(
    request: Request,
    user: UserDep,
    document_id: DocumentId,
    page: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
) -> Any:
    service = _service(request)
    doc = service.documents.get(user.tenant, document_id)
    dataset = service.datasets.get(user.tenant, doc.dataset_id)
    found = service.documents.chunks(user.tenant, document_id, page=page, limit=CHUNK_PAGE)
    ((_, job),) = _rows(service, user, [doc])
    return render(
        request, "document.html", user=user, doc=doc, job=job, dataset=dataset, chunks=found
    )


@router.get("/datasets/{dataset_id}/search", response_class=HTMLResponse)
def search_page(
    request: Request,
    user: UserDep,
    dataset_id: DatasetId,
    q: Annotated[str, Query(max_length=2000)] = "",
    mode: Annotated[str, Query(pattern="^(hybrid|vector|keyword)$")] = "hybrid",
    top_k: Annotated[int, Query(alias="topK", ge=1, le=50)] = 5,
) -> Any:
    service = _service(request)
    dataset = service.datasets.get(user.tenant, dataset_id)
    hits, error = [], ""
    if q.strip():
        try:
            hits = service.search.search(
                user.tenant, dataset_id, q.strip(), top_k=top_k, mode=SearchMode(mode)
            )
        except RequestError as exc:
            error = exc.message
    fragment = request.headers.get("hx-request") == "true"
    return render(
        request,
        "_hits.html" if fragment else "search.html",
        user=user,
        dataset=dataset,
        q=q,
        mode=mode,
        top_k=top_k,
        hits=hits,
        error=error,
    )


@router.get("/deployment", response_class=HTMLResponse)
def deployment_page(request: Request, user: UserDep) -> Any:
    service = _service(request)
    restricted = service.admission.metrics_token is not None
    figures = None if restricted else service.metrics()
    everything = service.jobs.list(user.tenant, status=None, dataset_id=None, page=1, limit=1)
    recent = service.jobs.list(
        user.tenant, status=JobStatus.FAILED, dataset_id=None, page=1, limit=20
    )
    by_category: dict[str, int] = {}
    for job in recent.items:
        by_category[job.error_category or "unknown"] = (
            by_category.get(job.error_category or "unknown", 0) + 1
        )
    return render(
        request,
        "deployment.html",
        user=user,
        figures=figures,
        restricted=restricted,
        recent=recent.items,
        by_category=by_category,
        total_jobs=everything.total,
    )
