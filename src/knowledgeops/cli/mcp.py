"""`kops mcp`: the MCP server on stdin/stdout for a desktop agent (Claude Desktop, an IDE), talking
to a running KnowledgeOps at `--url` with the key in KOPS_API_KEY. The agent starts it:

    {"command": "kops", "args": ["mcp", "--url", "http://127.0.0.1:8000"],
     "env": {"KOPS_API_KEY": "kops_…", "KOPS_MCP_UPLOAD_DIR": "/home/me/papers"}}

Nothing but the protocol may reach stdout, so this command prints nothing there."""

from __future__ import annotations

import typer

from knowledgeops.cli.common import DEFAULT_URL, UrlOpt, settings


def mcp(url: UrlOpt = DEFAULT_URL) -> None:
    """Serve the MCP tools (search, list_datasets, list_documents, upload_document, get_job) on
    stdin/stdout for an agent, against KnowledgeOps at --url with the key in KOPS_API_KEY;
    upload_document reads files by path only inside KOPS_MCP_UPLOAD_DIR."""
    from knowledgeops.mcp_server import stdio  # noqa: PLC0415 (the MCP SDK: for this command only)

    stdio.run(url, upload_dir=settings().mcp_upload_dir)


def register(app: typer.Typer) -> None:
    app.command()(mcp)
