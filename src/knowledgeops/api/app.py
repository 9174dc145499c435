"""The FastAPI application over the use cases (`KnowledgeBase`). The OpenAPI page is at /api/docs
(/docs is the documents API)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI

from knowledgeops import __version__
from knowledgeops.api import errors
from knowledgeops.api.auth import authenticate, rate_limiter_for
from knowledgeops.api.deps import reject_unknown_query
from knowledgeops.api.routes import (
    datasets,
    documents,
    events,
    health,
    jobs,
    metrics,
    models,
    search,
    uploads,
    webhooks,
)
from knowledgeops.api.streams import StreamSlots
from knowledgeops.jobs.feed import ChangeFeed
from knowledgeops.schemas import ErrorPublic
from knowledgeops.service.knowledge_base import KnowledgeBase

PROTECTED: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorPublic, "description": "Malformed request (JSON, header, form)."},
    401: {"model": ErrorPublic, "description": "No API key, or one unknown or revoked."},
    422: {"model": ErrorPublic, "description": "A field is invalid; `fields` names each one."},
    429: {"model": ErrorPublic, "description": "Too many requests; see Retry-After."},
}


def create_app(
    service: KnowledgeBase,
    *,
    on_start: Callable[[], None] | None = None,
    on_stop: Callable[[], None] | None = None,
) -> FastAPI:
    """`on_start` and `on_stop` run with the app's lifespan: the process role starts with the
    app and stops at its shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if on_start is not None:
            on_start()
        try:
            yield
        finally:
            feed.stop()
            if on_stop is not None:
                on_stop()

    app = FastAPI(
        title="KnowledgeOps",
        version=__version__,
        summary="Reliable document ingestion for retrieval-augmented generation.",
        docs_url="/api/docs",
        redoc_url=None,
        openapi_url="/api/openapi.json",
        lifespan=lifespan,
    )
    app.state.service = service
    # the record of job changes, read for this process's event streams (started by the first)
    feed = ChangeFeed(service.jobs.store, poll_s=service.admission.stream_poll_s)
    app.state.feed = feed
    app.state.stream_slots = StreamSlots(service.admission.max_streams_per_key)
    app.state.metrics = metrics.registry_for(service)
    app.state.rate_limiter = rate_limiter_for(service.admission)
    errors.install(app)
    for module in (health, metrics):
        app.include_router(module.router)
    for module in (uploads, jobs, events, documents, datasets, search, models, webhooks):
        app.include_router(  # these need a key
            module.router,
            responses=PROTECTED,
            # the key first: a caller without one learns nothing about parameters
            dependencies=[Depends(authenticate), Depends(reject_unknown_query)],
        )
    return app
