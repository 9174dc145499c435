"""Liveness and readiness."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from knowledgeops.api.deps import ServiceDep

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is up")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="The database is open and the workers, relay and heartbeat run",
    responses={503: {"description": "Not ready; the body says what is missing."}},
)
def readyz(service: ServiceDep) -> Any:
    checks = service.readiness()
    status = 200 if checks["ready"] else 503
    return JSONResponse({"status": "ready" if status == 200 else "not ready", **checks}, status)
