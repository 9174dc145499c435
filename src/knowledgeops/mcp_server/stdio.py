"""`kops mcp`: the MCP server on stdin/stdout, as a desktop agent starts it (a subprocess it
talks JSON-RPC to), against a running KnowledgeOps at `url` with the key of KOPS_API_KEY.

One SDK client serves every call (its connections kept open between them); stdout carries the
protocol alone, so anything else this process says goes to stderr."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context

from knowledgeops.client import AsyncKnowledgeOps
from knowledgeops.mcp_server.tools import build_server


def run(url: str, *, upload_dir: Path | None) -> None:
    """Serve until the agent closes stdin. The key: KOPS_API_KEY (read by the SDK)."""
    anyio.run(serve, url, upload_dir)


async def serve(url: str, upload_dir: Path | None) -> None:
    async with AsyncKnowledgeOps(url) as kops:

        @asynccontextmanager
        async def shared(ctx: Context[Any, Any]) -> AsyncIterator[AsyncKnowledgeOps]:
            yield kops

        await build_server(shared, upload_dir=upload_dir).run_stdio_async()
