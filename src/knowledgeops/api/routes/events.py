"""Live progress: Server-Sent Events of job changes, for one job or for a dataset's jobs
(api/streams.py says what a stream sends)."""

from __future__ import annotations

import functools
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import StreamingResponse

from knowledgeops.api.auth import Tenant, authenticate
from knowledgeops.api.deps import DatasetId, JobId, ServiceDep
from knowledgeops.api.streams import (
    EventStream,
    Slot,
    StreamSlots,
    event_stream,
    follow,
    last_event_id,
)
from knowledgeops.jobs.feed import ChangeFeed, Topic
from knowledgeops.service.keys import Principal
from knowledgeops.service.views import JobView

router = APIRouter(tags=["events"])


def _error(description: str) -> dict[str, Any]:
    """An error answer, in JSON (the stream's own media type is for 200 only)."""
    schema = {"$ref": "#/components/schemas/ErrorPublic"}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


STREAM: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "A stream of `event: job` whose data is a JobChangePublic (JSON), each "
        "with an `id:` to resume after; comment lines every 15 s while idle.",
    },
    400: _error("Last-Event-ID is not an event id."),
    401: _error("No API key, or one unknown or revoked."),
    404: _error("Not found (or another tenant's)."),
    422: _error("A parameter is invalid."),
    429: _error("Too many open streams for this key, or too many requests; see Retry-After."),
}
LastEventId = Annotated[
    str | None,
    Header(
        alias="Last-Event-ID",
        description="Resume after this event (EventSource sends it when it reconnects).",
    ),
]


def _owned_job(job_id: JobId, service: ServiceDep, tenant: Tenant) -> JobView:
    return service.jobs.get(tenant, job_id)  # 404 unless it is the tenant's


def _owned_dataset(dataset_id: DatasetId, service: ServiceDep, tenant: Tenant) -> str:
    return service.datasets.get(tenant, dataset_id).id  # 404 unless it is the tenant's


def _resume(last: LastEventId = None) -> int | None:
    return last_event_id(last)  # 400 before the stream opens


def stream_slot(request: Request, principal: Annotated[Principal, Depends(authenticate)]) -> Slot:
    """One of the caller's open streams (429 beyond the limit), given back when it ends (by the
    stream itself, and by the answer's background task)."""
    slots: StreamSlots = request.app.state.stream_slots
    caller = principal.key_id or f"addr:{request.client.host if request.client else '-'}"
    return slots.take(caller)


def _feed(request: Request) -> ChangeFeed:
    feed: ChangeFeed = request.app.state.feed
    return feed


@router.get(
    "/docs/jobs/{job_id}/events",
    response_class=EventStream,
    responses=STREAM,
    summary="Follow a job's changes (Server-Sent Events)",
    description="First the job as it stands (or, with Last-Event-ID, every change after that "
    "event), then each change: status, stage, counts, attempt, error.",
)
async def job_events(
    request: Request,
    service: ServiceDep,
    tenant: Tenant,
    job: Annotated[JobView, Depends(_owned_job)],
    resume: Annotated[int | None, Depends(_resume)],
    slot: Annotated[Slot, Depends(stream_slot)],
) -> StreamingResponse:
    body = follow(
        request,
        service,
        _feed(request),
        slot,
        Topic(job_id=job.id),
        resume_after=resume,
        snapshot=functools.partial(service.jobs.get, tenant, job.id) if resume is None else None,
    )
    return event_stream(body, slot)


@router.get(
    "/datasets/{dataset_id}/events",
    response_class=EventStream,
    responses=STREAM,
    summary="Follow the changes of a dataset's jobs (Server-Sent Events)",
    description="Each change of any of the dataset's jobs from now on (with Last-Event-ID, "
    "every change after that event first).",
)
async def dataset_events(
    request: Request,
    service: ServiceDep,
    owned: Annotated[str, Depends(_owned_dataset)],
    resume: Annotated[int | None, Depends(_resume)],
    slot: Annotated[Slot, Depends(stream_slot)],
) -> StreamingResponse:
    body = follow(
        request, service, _feed(request), slot, Topic(dataset_id=owned), resume_after=resume
    )
    return event_stream(body, slot)
