"""Errors become HTTP responses here, and only here: {"error": "...", "code": "..."} everywhere.

The statuses of the deliberate errors (errors.py) are this module's table, looked up along each
error's class hierarchy; an error no entry covers is a bug, answered 500 with a reference the
operator finds in the log."""

from __future__ import annotations

import logging
import secrets
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path

from knowledgeops.errors import (
    Conflict,
    Forbidden,
    InvalidField,
    InvalidRequest,
    InvalidTransition,
    JobNotFound,
    KopsError,
    NotFound,
    PayloadTooLarge,
    RequestError,
    ServiceUnavailable,
    TooManyRequests,
    Unauthorized,
    UnsupportedMediaType,
)

log = logging.getLogger(__name__)

_LOCATIONS = frozenset({"body", "query", "path", "header", "cookie"})
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}
STATUS: dict[type[KopsError], int] = {
    RequestError: 400,
    InvalidRequest: 400,
    InvalidField: 422,  # like a body that fails validation
    Unauthorized: 401,
    Forbidden: 403,
    NotFound: 404,
    Conflict: 409,
    InvalidTransition: 409,  # the job's status does not allow it
    PayloadTooLarge: 413,
    UnsupportedMediaType: 415,
    TooManyRequests: 429,
    ServiceUnavailable: 503,
}


def status_of(exc: KopsError) -> int:
    return next(STATUS[cls] for cls in type(exc).__mro__ if cls in STATUS)


def error_body(message: str, code: str, **extra: Any) -> dict[str, Any]:
    return {"error": message, "code": code, **extra}


def _field_name(loc: tuple[Any, ...]) -> str:
    """The field a validation error is about: its location ("body", "query", …) comes first
    and is dropped; the rest is kept even where it reads like a location ("query")."""
    parts = [str(p) for p in loc]
    if parts and parts[0] in _LOCATIONS:
        parts = parts[1:]
    return ".".join(parts) or "body"


async def on_request_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestError | InvalidTransition)
    headers = {}
    if isinstance(exc, ServiceUnavailable | TooManyRequests):
        headers["Retry-After"] = str(exc.retry_after_s)
    if isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(error_body(exc.message, exc.code), status_of(exc), headers=headers)


async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = next(e for e in errors if e.get("type") == "json_invalid")
        reason = detail.get("ctx", {}).get("error", "invalid JSON")
        return JSONResponse(error_body(f"malformed JSON body: {reason}", "invalid_json"), 400)
    fields = [{"field": _field_name(tuple(e["loc"])), "message": e["msg"]} for e in errors]
    message = "; ".join(f"{f['field']}: {f['message']}" for f in fields)
    return JSONResponse(error_body(message, "validation_error", fields=fields), 422)


async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    message = str(exc.detail) if exc.status_code != 404 else "no such endpoint"
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        # Starlette names only the first route that matched the path; a path served by several
        # routes (GET and DELETE on /datasets/{id}) allows the methods of all of them
        allowed = _allowed_methods(request)
        headers["Allow"] = ", ".join(sorted(allowed))
        message = f"{request.method} is not allowed here; use {', '.join(sorted(allowed))}"
    return JSONResponse(error_body(message, code), exc.status_code, headers=headers)


def _allowed_methods(request: Request) -> set[str]:
    """The methods the spec declares for the request's path (GET for undocumented paths)."""
    table: list[tuple[Any, set[str]]] | None = getattr(request.app.state, "allowed_methods", None)
    if table is None:
        table = [
            (compile_path(path)[0], {method.upper() for method in operations})
            for path, operations in request.app.openapi()["paths"].items()
        ]
        request.app.state.allowed_methods = table
    methods: set[str] = set()
    for pattern, declared in table:
        if pattern.match(request.url.path):
            methods |= declared
    return methods or {"GET"}


async def on_job_not_found(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(error_body("job not found", "job_not_found"), 404)


async def on_database_down(request: Request, exc: Exception) -> JSONResponse:
    log.warning("database unavailable: %s", exc)
    return JSONResponse(
        error_body("the database is unavailable; try again shortly", "database_unavailable"),
        503,
        headers={"Retry-After": "5"},
    )


async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    reference = secrets.token_hex(4)
    log.error(
        "unexpected error on %s %s (reference %s)",
        request.method,
        request.url.path,
        reference,
        exc_info=exc,
    )
    return JSONResponse(
        error_body(f"internal error (reference {reference})", "internal_error"), 500
    )


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestError, on_request_error)
    app.add_exception_handler(InvalidTransition, on_request_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(JobNotFound, on_job_not_found)
    app.add_exception_handler(OperationalError, on_database_down)
    app.add_exception_handler(PoolTimeoutError, on_database_down)
    app.add_exception_handler(Exception, on_unexpected)
