"""/mcp in the API's app: the MCP server over streamable HTTP, for agents that reach KnowledgeOps
over the network.

Stateless, with JSON answers: every POST is served whole by whichever API process receives it,
so /mcp runs behind several processes and a balancer as the rest of the API does, with nothing
to share between them. The caller sends its API key (`Authorization: Bearer …`) with every
request, and the API itself judges it: before the MCP machinery sees a request, the app is
asked GET /datasets?limit=1 with that header, in process, and a refusal (401, or 429 over the
key's rate) is answered as the API answered it. The tools then call the same app in process
through the SDK with the caller's header, so tenancy, validation and the rate limit are the
API's own."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import APIRouter, FastAPI
from mcp.server.mcpserver import Context
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.datastructures import Address
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from knowledgeops.client import AsyncKnowledgeOps
from knowledgeops.mcp_server import uploads
from knowledgeops.mcp_server.tools import ClientFor, build_server
from knowledgeops.settings import Settings

PATH = "/mcp"
IN_PROCESS = "http://knowledgeops.in-process"  # the base URL of calls to the app itself
MISSING_KEY = (
    "/mcp needs an API key: send `Authorization: Bearer <key>` (create one with `kops keys create`)"
)
_RELAYED = ("WWW-Authenticate", "Retry-After")  # headers of a refusal passed on to the caller


def install(app: FastAPI, settings: Settings) -> None:
    """Serve the MCP server at /mcp of `app`, its session manager running within the app's
    lifespan."""
    server = build_server(
        _forwarding(app),
        upload_dir=settings.mcp_http_upload_dir,  # its own setting: off unless asked for
        upload_setting=uploads.HTTP_SETTING,
    )
    server.streamable_http_app(  # made for its session manager; the route to it is ours
        stateless_http=True,
        json_response=True,
        # what guards /mcp is the API key, as for every other endpoint; the Host a deployment
        # is reached by is its own business (the default would allow only localhost)
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    manager = server.session_manager
    endpoint = KeyedEndpoint(app, manager, key_required=settings.auth == "on")
    app.router.routes.append(Route(PATH, endpoint=endpoint, include_in_schema=False))
    app.include_router(APIRouter(lifespan=lambda _: manager.run()))


class KeyedEndpoint:
    """/mcp: a request without a key (where keys are on) is refused here; one with a key the
    API refuses gets the API's answer; any other goes on to the MCP session manager."""

    def __init__(
        self, app: ASGIApp, manager: StreamableHTTPSessionManager, *, key_required: bool
    ) -> None:
        self.app = app
        self.manager = manager
        self.key_required = key_required

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope)
        authorization = request.headers.get("authorization")
        refused: Response | None
        if authorization is None and self.key_required:
            refused = JSONResponse(
                {"error": MISSING_KEY, "code": "unauthorized"},
                401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        else:
            refused = await self._judged(authorization, request.client)
        if refused is not None:
            await refused(scope, receive, send)
            return
        await self.manager.handle_request(scope, receive, send)

    async def _judged(self, authorization: str | None, client: Address | None) -> Response | None:
        """The API's refusal of this key, as it answered it; None when it takes the key."""
        headers = {"Authorization": authorization} if authorization is not None else {}
        async with httpx.AsyncClient(
            transport=_transport(self.app, client), base_url=IN_PROCESS, headers=headers
        ) as http:
            answer = await http.get("/datasets", params={"limit": 1})
        if answer.status_code < 400:
            return None
        return Response(
            answer.content,
            answer.status_code,
            headers={name: answer.headers[name] for name in _RELAYED if name in answer.headers},
            media_type=answer.headers.get("content-type"),
        )


def _forwarding(app: ASGIApp) -> ClientFor:
    """The SDK client of a tool call: the app itself, in process, with the caller's key and
    address (the rate limit counts per key, and per address for a wrong key)."""

    @asynccontextmanager
    async def client_for(ctx: Context[Any, Any]) -> AsyncIterator[AsyncKnowledgeOps]:
        request = ctx.request_context.request
        authorization = (ctx.headers or {}).get("authorization")
        async with AsyncKnowledgeOps(
            IN_PROCESS,
            api_key="",  # no key of this process's own (KOPS_API_KEY): only the caller's
            headers={"Authorization": authorization} if authorization is not None else None,
            transport=_transport(app, getattr(request, "client", None)),
            max_retries=0,  # a 429 goes back to the agent at once, with its wait
        ) as kops:
            yield kops

    return client_for


def _transport(app: ASGIApp, client: Address | None) -> httpx.ASGITransport:
    return httpx.ASGITransport(
        app=app,
        # an error of the app is its 500 answer with a reference, not an exception here
        raise_app_exceptions=False,
        client=(client.host, client.port) if client is not None else ("127.0.0.1", 0),
    )
