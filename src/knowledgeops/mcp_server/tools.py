"""The MCP server: five tools over a KnowledgeOps, spoken to only through the SDK
(`AsyncKnowledgeOps`), so the API decides everything (keys, tenants, validation) exactly as for
any other client.

`build_server(client_for, upload_dir=…)` takes a function that gives the SDK client for the call
at hand (as an async context manager): over stdio one shared client with the key of the process,
over HTTP one per call carrying the caller's own key (http.py). A refusal of the API (the SDK's
`ClientError`) reaches the MCP client as a tool error (`isError`) with the API's message and
code, for the model to read and correct."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from knowledgeops import __version__
from knowledgeops.client import AsyncKnowledgeOps
from knowledgeops.errors import ClientError
from knowledgeops.mcp_server import results, uploads

_Tool = TypeVar("_Tool", bound=Callable[..., Any])

ClientFor = Callable[[Context[Any, Any]], AbstractAsyncContextManager[AsyncKnowledgeOps]]
"""Given the tool call's context, the SDK client that makes its requests."""

INSTRUCTIONS = (
    "KnowledgeOps holds documents (PDF, Office, HTML, Markdown, text, e-mail, scans) in "
    "datasets, split into chunks and indexed. Use `search` to find the passages that answer a "
    "question and cite them by file_name and page or section. `list_datasets` and "
    "`list_documents` show what is there; `upload_document` adds a document, which becomes "
    "searchable once its job completes (`get_job`)."
)
READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
ADDS = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)

DatasetRef = Annotated[
    str | None,
    Field(description="The dataset's id or name; omitted or empty: the default dataset."),
]


def refusal(exc: ClientError) -> str:
    """The API's message with its code and HTTP status, as the tool error's text."""
    status = f", HTTP {exc.status}" if exc.status is not None else ""
    return f"{exc.message} (code {exc.code}{status})"


def build_server(
    client_for: ClientFor, *, upload_dir: Path | None, upload_setting: str = uploads.SETTING
) -> MCPServer[Any]:
    """The MCP server. `upload_dir`: the folder `upload_document` may read files from by path
    (KOPS_MCP_UPLOAD_DIR); None: text uploads only."""
    server: MCPServer[Any] = MCPServer(
        "knowledgeops",
        title="KnowledgeOps",
        version=__version__,
        instructions=INSTRUCTIONS,
        log_level="WARNING",  # where logging is not set up yet (`kops mcp`): warnings, on stderr
    )

    def tool(annotations: ToolAnnotations) -> Callable[[_Tool], _Tool]:
        """Register the function as a tool, its docstring (on one line) its description."""

        def add(fn: _Tool) -> _Tool:
            description = " ".join((fn.__doc__ or "").split())
            server.add_tool(
                fn, description=description, annotations=annotations, structured_output=True
            )
            return fn

        return add

    @asynccontextmanager
    async def api(ctx: Context[Any, Any]) -> AsyncIterator[AsyncKnowledgeOps]:
        try:
            async with client_for(ctx) as kops:
                yield kops
        except ClientError as exc:
            raise ToolError(refusal(exc)) from None

    @tool(READ_ONLY)
    async def search(
        ctx: Context[Any, Any],
        *,
        dataset: DatasetRef = None,
        query: Annotated[str, Field(description="What to look for, in plain words.")],
        mode: Annotated[
            Literal["hybrid", "vector", "keyword"],
            Field(
                description="hybrid: meaning and exact words together (best in general); "
                "vector: meaning only; keyword: the words themselves (names, codes, numbers)."
            ),
        ] = "hybrid",
        top_k: Annotated[int, Field(ge=1, le=100, description="How many passages.")] = 5,
        file_types: Annotated[
            list[str] | None,
            Field(description="Only documents of these types: pdf, docx, md, txt, html, …"),
        ] = None,
        document_ids: Annotated[
            list[str] | None, Field(description="Only these documents (their ids).")
        ] = None,
        metadata: Annotated[
            dict[str, Any] | None,
            Field(
                description="Only documents whose upload metadata matches: each key equal to "
                'a value ({"team": "infra"}) or to one of several ({"year": {"in": [2024, '
                "2025]}})."
            ),
        ] = None,
    ) -> results.SearchAnswer:
        """Search a dataset's documents for the passages that best answer `query`. Each hit
        has its text, the file it comes from, its page (or page range) and section headings,
        and a score (best first). Filters narrow which documents may answer."""
        async with api(ctx) as kops:
            chosen = await kops.find_dataset(dataset or None)
            found = await kops.search(
                chosen.id,
                query,
                top_k=top_k,
                mode=mode,
                filter={
                    "file_types": file_types,
                    "document_ids": document_ids,
                    "metadata": metadata,
                },
            )
        return results.SearchAnswer(
            dataset_id=chosen.id,
            dataset_name=chosen.name,
            query=found.query,
            mode=found.mode,
            hits=[results.Hit.model_validate(hit) for hit in found.results],
        )

    @tool(READ_ONLY)
    async def list_datasets(ctx: Context[Any, Any]) -> results.Datasets:
        """The datasets this API key may use (one is the default), with how many documents
        and chunks each holds."""
        async with api(ctx) as kops:
            found = [dataset async for dataset in kops.iter_datasets()]
        return results.Datasets(datasets=[results.Dataset.model_validate(d) for d in found])

    @tool(READ_ONLY)
    async def list_documents(
        ctx: Context[Any, Any],
        *,
        dataset: DatasetRef = None,
        status: Annotated[
            Literal["pending", "processing", "ready", "failed", "cancelled"] | None,
            Field(description="Only documents in this status (ready: searchable)."),
        ] = None,
        page: Annotated[int, Field(ge=1, description="Which page, from 1.")] = 1,
        limit: Annotated[int, Field(ge=1, le=200, description="Documents per page.")] = 20,
    ) -> results.Documents:
        """One page of a dataset's documents, newest first: name, type, status, chunks,
        pages and the metadata each was uploaded with."""
        async with api(ctx) as kops:
            chosen = await kops.find_dataset(dataset or None)
            found = await kops.list_documents(chosen.id, status=status, page=page, limit=limit)
        return results.Documents(
            documents=[results.Document.model_validate(d) for d in found.items],
            total=found.total,
            page=found.page,
            limit=found.limit,
            has_more=found.has_more,
        )

    @tool(READ_ONLY)
    async def get_job(
        ctx: Context[Any, Any],
        job_id: Annotated[str, Field(description="The job's id (upload_document gives it).")],
    ) -> results.Job:
        """How a job stands: its status and stage, progress counts, and, when it failed, why
        and whether a retry could help. An upload's document is searchable once its ingest
        job is completed."""
        async with api(ctx) as kops:
            job = await kops.get_job(job_id)
        return results.Job.model_validate(job)

    @tool(ADDS)
    async def upload_document(
        ctx: Context[Any, Any],
        *,
        dataset: DatasetRef = None,
        path: Annotated[
            str | None,
            Field(
                description="A file the server may read: inside the folder its "
                "KOPS_MCP_UPLOAD_DIR setting names (a relative path is read from there)."
            ),
        ] = None,
        text: Annotated[
            str | None, Field(description="The document itself, as Markdown or plain text.")
        ] = None,
        file_name: Annotated[
            str | None,
            Field(
                description="The name to store it under; for text, ending in .md or .txt "
                "(default note.md)."
            ),
        ] = None,
        metadata: Annotated[
            dict[str, str | int | float | bool | None] | None,
            Field(description='Scalars to filter searches on later, e.g. {"team": "infra"}.'),
        ] = None,
    ) -> results.Upload:
        """Add a document to a dataset: give exactly one of `path` (a file on the server's
        side, only from its upload folder) or `text`. It is accepted at once and processed in
        the background: follow `job_id` with get_job; it is searchable once completed.
        Uploading the same bytes again makes no second document (`duplicate` is true)."""
        if (path is None) == (text is None):
            raise ToolError("give exactly one of path (a file) or text (the content itself)")
        async with api(ctx) as kops:
            chosen = await kops.find_dataset(dataset or None)
            if text is not None:
                name = uploads.note_name(file_name)
                accepted = await kops.upload(
                    text.encode("utf-8"), dataset_id=chosen.id, file_name=name, metadata=metadata
                )
            else:
                real = uploads.confined(str(path), upload_dir, upload_setting)
                name = file_name or real.name
                with real.open("rb") as handle:
                    accepted = await kops.upload(
                        handle, dataset_id=chosen.id, file_name=name, metadata=metadata
                    )
        return results.Upload(
            job_id=accepted.job_id,
            document_id=accepted.document_id,
            dataset_id=chosen.id,
            file_name=name,
            status=accepted.status,
            duplicate=accepted.duplicate,
        )

    return server
