"""The FastAPI application for a runtime. The OpenAPI page is at /api/docs (/docs is the
documents API)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI

from knowledgeops import __version__
from knowledgeops.api import errors
from knowledgeops.api.auth import authenticate, rate_limiter_for
from knowledgeops.api.deps import reject_unknown_query
from knowledgeops.api.routes import datasets, documents, health, jobs, metrics, search, uploads
from knowledgeops.api.schemas import ErrorPublic
from knowledgeops.runtime import Services

PROTECTED: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorPublic, "description": "Malformed request (JSON, header, form)."},
    401: {"model": ErrorPublic, "description": "No API key, or one unknown or revoked."},
    422: {"model": ErrorPublic, "description": "A field is invalid; `fields` names each one."},
    429: {"model": ErrorPublic, "description": "Too many requests; see Retry-After."},
}


def create_app(runtime: Services, *, manage_runtime: bool = True) -> FastAPI:
    """`manage_runtime`: start the runtime with the app and stop it on shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage_runtime:
            runtime.start()
        try:
            yield
        finally:
            if manage_runtime:
                runtime.stop()

    app = FastAPI(
        title="KnowledgeOps",
        version=__version__,
        summary="Reliable document ingestion for retrieval-augmented generation.",
        docs_url="/api/docs",
        redoc_url=None,
        openapi_url="/api/openapi.json",
        lifespan=lifespan,
    )
    app.state.runtime = runtime
    app.state.metrics = metrics.registry_for(runtime.store)
    app.state.rate_limiter = rate_limiter_for(runtime)
    errors.install(app)
    for module in (health, metrics):
        app.include_router(module.router)
    for module in (uploads, jobs, documents, datasets, search):  # need an API key
        app.include_router(
            module.router,
            responses=PROTECTED,
            # the key first: a caller without one learns nothing about parameters
            dependencies=[Depends(authenticate), Depends(reject_unknown_query)],
        )
    return app


def create_scaleout_app() -> FastAPI:
    """The app of one `kops api` process (uvicorn's factory; settings from the environment)."""
    import logging

    from knowledgeops.runtime import ApiRuntime
    from knowledgeops.settings import load_settings

    settings = load_settings()
    # `kops api --workers N` spawns fresh interpreters: they log like the parent process
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s"
    )
    logging.getLogger("alembic").setLevel(logging.WARNING)
    return create_app(ApiRuntime(settings))
