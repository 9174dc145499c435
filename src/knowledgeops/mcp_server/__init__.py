"""The MCP server of KnowledgeOps (Model Context Protocol, the official `mcp` package): the tools
`search`, `list_datasets`, `list_documents`, `upload_document` and `get_job` for agents.

    tools.py     the server and its tools, over the SDK (`AsyncKnowledgeOps`) only
    results.py   what the tools answer (structured output)
    uploads.py   what `upload_document` may read: paths inside KOPS_MCP_UPLOAD_DIR, or text
    stdio.py     `kops mcp`: on stdin/stdout for a desktop agent, against a running server
    http.py      /mcp in the API's app: streamable HTTP, the caller's API key judged by the API

It knows the SDK, the API's schemas, the errors and the settings; never the API's, the use
cases' or the database's code: over HTTP it calls the very app it is mounted in, in process."""

from __future__ import annotations

from knowledgeops.mcp_server.tools import ClientFor, build_server

__all__ = ["ClientFor", "build_server"]
