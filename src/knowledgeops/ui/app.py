"""Puts the dashboard into the API's app: its routes under /ui, its static files, the security
headers of every page (a Content-Security-Policy that allows no inline script and nothing from
elsewhere), and errors shown as pages rather than JSON."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from knowledgeops.api import errors
from knowledgeops.api.errors import status_of
from knowledgeops.errors import InvalidTransition, RequestError
from knowledgeops.ui.pages import router
from knowledgeops.ui.render import HERE, render
from knowledgeops.ui.session import SignInRequired

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # no-referrer would make browsers send Origin: null
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


class SecurePages:
    """Adds the security headers to every /ui answer (plain ASGI: the API's requests and the
    streams' bodies pass through untouched)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not path.startswith("/ui"):
            await self.app(scope, receive, send)
            return
        static = path.startswith("/ui/static")

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS.items():
                    if not (static and name == "Cache-Control") and name not in headers:
                        headers[name] = value
            await send(message)

        await self.app(scope, receive, with_headers)


def install(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="ui-static")

    app.add_middleware(SecurePages)

    async def on_error(request: Request, exc: Exception) -> Any:
        if not request.url.path.startswith("/ui"):
            return await errors.on_request_error(request, exc)
        assert isinstance(exc, RequestError | InvalidTransition)
        if isinstance(exc, SignInRequired):
            if request.headers.get("hx-request") == "true":  # htmx: the whole page goes
                return Response(status_code=401, headers={"HX-Redirect": "/ui/login"})
            return RedirectResponse("/ui/login", status_code=303)
        response = render(
            request,
            "error.html",
            status_of(exc),
            user=None,
            message=exc.message,
            error_code=exc.code,
        )
        if request.headers.get("hx-request") == "true":
            response.headers["HX-Retarget"] = "#notice"
            response.headers["HX-Reswap"] = "innerHTML"
        retry_after = getattr(exc, "retry_after_s", None)
        if retry_after is not None:
            response.headers["Retry-After"] = str(retry_after)
        return response

    app.add_exception_handler(RequestError, on_error)
    app.add_exception_handler(InvalidTransition, on_error)
