"""The MCP server with the official `mcp` client over both transports: streamable HTTP to /mcp of
a live server (uvicorn on a port, the API key of a tenant) and stdio to `kops mcp` run as a
desktop agent runs it. What the tools answer is the HTTP API's own answer (the same hits in the
same order with the same scores), a refusal of the API is a tool error carrying its message,
and upload_document reads files only from inside KOPS_MCP_UPLOAD_DIR."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from knowledgeops.client import KnowledgeOps
from knowledgeops.roles.embedded import EmbeddedRole
from tests.fixtures.documents import make_text
from tests.fixtures.live import LiveServer, error_of, serve

TOOLS = {"search", "list_datasets", "list_documents", "upload_document", "get_job"}
CANCELLING = (
    "# Cancelling a job\n\n"
    "A running job stops at its next batch when you cancel it; its partial chunks are removed "
    "and the document's previous version stays searchable.\n\n"
    "## Retrying\n\nA failed job can be retried while attempts are left.\n"
)
OCR = (
    "Scanned pages are read by OCR. A page read with a low confidence is flagged in its job "
    "and left out of the index, so rescan it for its text.\n"
)
QUERY = "how do I cancel a running job"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "0"},
    },
}
ACCEPT = {"Accept": "application/json, text/event-stream"}


@pytest.fixture
def live(make_runtime: Callable[..., EmbeddedRole]) -> Iterator[Callable[..., LiveServer]]:
    """`live(**settings)`: a started server over a runtime with those settings."""
    servers: list[Any] = []

    def make(**overrides: Any) -> LiveServer:
        context = serve(make_runtime(start=False, **overrides))
        servers.append(context)
        return context.__enter__()

    yield make
    for context in reversed(servers):
        context.__exit__(None, None, None)


@asynccontextmanager
async def over_http(server: LiveServer, key: str | None = None) -> AsyncIterator[ClientSession]:
    """An initialized MCP session with /mcp of `server`, sending `key` (default: the server's)."""
    headers = {"Authorization": f"Bearer {key or server.key}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(f"{server.url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


@asynccontextmanager
async def over_stdio(server: LiveServer, log: Path, **env: str) -> AsyncIterator[ClientSession]:
    """An initialized MCP session with `kops mcp --url <server>` spawned as a subprocess (its
    stderr in `log`), with the server's key and `env` in its environment."""
    params = StdioServerParameters(
        command=str(Path(sys.executable).parent / "kops"),
        args=["mcp", "--url", server.url],
        env={"KOPS_API_KEY": server.key, **env},
        cwd=log.parent,  # no .env of the repository
    )
    with log.open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """The structured answer of a tool call that must succeed."""
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def refusal(session: ClientSession, tool: str, **arguments: Any) -> str:
    """The text of a tool call that must end in a tool error."""
    result = await session.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    return " ".join(getattr(block, "text", "") for block in result.content)


def api_hits(sdk: KnowledgeOps, query: str, **options: Any) -> list[tuple[str, float]]:
    found = sdk.search(sdk.find_dataset().id, query, **options)
    return [(hit.chunk_id, hit.score) for hit in found.results]


def mcp_hits(answer: dict[str, Any]) -> list[tuple[str, float]]:
    return [(hit["chunk_id"], hit["score"]) for hit in answer["hits"]]


def same_fields(view: dict[str, Any], model: Any) -> None:
    """Every field of a tool's answer is the SDK's value of that name."""
    expected = model.model_dump(mode="json")
    assert {name: expected[name] for name in view} == view


async def upload_notes(mcp: ClientSession, sdk: KnowledgeOps) -> list[dict[str, Any]]:
    """Two notes uploaded as text through the tool, their jobs waited for with the SDK."""
    uploads = [
        await call(mcp, "upload_document", text=CANCELLING, file_name="cancel.md"),
        await call(mcp, "upload_document", text=OCR, metadata={"team": "ocr"}),
    ]
    jobs = [sdk.wait(upload["job_id"], timeout=60) for upload in uploads]
    assert [job.status for job in jobs] == ["completed", "completed"]
    return uploads


def test_over_http_the_tools_are_listed_with_descriptions_and_schemas(
    live: Callable[..., LiveServer],
) -> None:
    server = live()

    async def scenario() -> None:
        async with over_http(server) as mcp:
            tools = {tool.name: tool for tool in (await mcp.list_tools()).tools}
        assert set(tools) == TOOLS
        for tool in tools.values():
            assert len(tool.description or "") > 80, tool.name
            assert "\n" not in (tool.description or "")
            assert tool.output_schema is not None, tool.name
        search = tools["search"].input_schema
        assert list(search["properties"]) == [
            *("dataset", "query", "mode", "top_k"),
            *("file_types", "document_ids", "metadata"),
        ]
        assert search["required"] == ["query"]
        assert all("description" in spec for spec in search["properties"].values())
        assert search["properties"]["mode"]["enum"] == ["hybrid", "vector", "keyword"]
        assert tools["search"].annotations is not None
        assert tools["search"].annotations.read_only_hint
        assert set(tools["upload_document"].input_schema["properties"]) >= {
            *("dataset", "path", "text", "file_name"),
        }

    anyio.run(scenario)


def test_over_http_search_gives_the_hits_the_api_gives(live: Callable[..., LiveServer]) -> None:
    server = live()
    sdk = server.client()

    async def scenario() -> None:
        async with over_http(server) as mcp:
            uploads = await upload_notes(mcp, sdk)
            assert uploads[1]["file_name"] == "note.md"
            assert not any(upload["duplicate"] for upload in uploads)
            again = await call(mcp, "upload_document", text=OCR)
            assert again["duplicate"]
            assert again["document_id"] == uploads[1]["document_id"]
            for mode in ("hybrid", "vector", "keyword"):
                answer = await call(mcp, "search", query=QUERY, mode=mode, top_k=3)
                assert answer["mode"] == mode
                assert mcp_hits(answer) == api_hits(sdk, QUERY, mode=mode, top_k=3)
            answer = await call(mcp, "search", dataset="", query=QUERY)
            assert mcp_hits(answer) == api_hits(sdk, QUERY)
            best = answer["hits"][0]
            assert set(best) == {
                *("chunk_id", "document_id", "file_name", "page", "page_end", "section"),
                *("text", "score"),
            }
            assert best["file_name"] == "cancel.md"
            assert best["document_id"] == uploads[0]["document_id"]
            assert "Cancelling a job" in (best["section"] or "")
            assert "next batch" in best["text"]
            narrowed = {"metadata": {"team": "ocr"}, "file_types": ["md"]}
            answer = await call(mcp, "search", query=QUERY, **narrowed)
            assert {hit["document_id"] for hit in answer["hits"]} == {uploads[1]["document_id"]}
            assert mcp_hits(answer) == api_hits(sdk, QUERY, filter=narrowed)
            only = {"document_ids": [uploads[0]["document_id"]]}
            answer = await call(mcp, "search", query=QUERY, mode="keyword", **only)
            assert mcp_hits(answer) == api_hits(sdk, QUERY, mode="keyword", filter=only)

    anyio.run(scenario)


def test_over_http_listings_and_jobs_are_what_the_sdk_reads(
    live: Callable[..., LiveServer],
) -> None:
    server = live()
    sdk = server.client()
    sdk.create_dataset("second")

    async def scenario() -> None:
        async with over_http(server) as mcp:
            uploads = await upload_notes(mcp, sdk)
            datasets = (await call(mcp, "list_datasets"))["datasets"]
            expected = list(sdk.iter_datasets())
            assert [d["id"] for d in datasets] == [d.id for d in expected]
            assert len(datasets) == 2
            for view, model in zip(datasets, expected, strict=True):
                same_fields(view, model)
            default = sdk.find_dataset()
            by_name = await call(mcp, "list_documents", dataset=default.name, limit=1)
            assert (by_name["total"], by_name["page"], by_name["has_more"]) == (2, 1, True)
            listing = sdk.list_documents(default.id, limit=1)
            same_fields(by_name["documents"][0], listing.items[0])
            ready = await call(mcp, "list_documents", dataset=default.id, status="ready")
            assert {d["id"] for d in ready["documents"]} == {u["document_id"] for u in uploads}
            empty = await call(mcp, "list_documents", dataset="second")
            assert empty["documents"] == []
            job = await call(mcp, "get_job", job_id=uploads[0]["job_id"])
            assert job["status"] == "completed"
            same_fields(job, sdk.get_job(uploads[0]["job_id"]))

    anyio.run(scenario)


def test_over_http_a_refusal_is_a_tool_error_with_the_apis_message(
    live: Callable[..., LiveServer], tmp_path: Path
) -> None:
    folder = tmp_path / "uploads"
    folder.mkdir()
    outside = make_text(tmp_path / "secret.txt", "not for agents")
    server = live(mcp_http_upload_dir=folder, mcp_upload_dir=tmp_path)
    sdk = server.client()
    unknown = str(uuid.uuid4())
    refused = error_of(lambda: sdk.get_job(unknown))

    async def scenario() -> None:
        async with over_http(server) as mcp:
            text = await refusal(mcp, "get_job", job_id=unknown)
            assert refused.message in text
            assert f"code {refused.code}" in text
            assert "HTTP 404" in text
            text = await refusal(mcp, "search", dataset="no-such-dataset", query=QUERY)
            assert "no dataset named 'no-such-dataset'" in text
            text = await refusal(mcp, "search", query=QUERY, file_types=["exe"])
            assert "validation_error" in text
            assert "HTTP 422" in text
            for path in (str(outside), "../secret.txt"):
                text = await refusal(mcp, "upload_document", path=path)
                assert "outside the folder KOPS_MCP_HTTP_UPLOAD_DIR names" in text
            text = await refusal(mcp, "upload_document", path="missing.txt")
            assert "no such file" in text
            text = await refusal(mcp, "upload_document", text="x", file_name="run.sh")
            assert ".md or .txt" in text
            text = await refusal(mcp, "upload_document", text="x", path="a.txt")
            assert "exactly one of path" in text

    anyio.run(scenario)
    assert sdk.list_documents(sdk.find_dataset().id).total == 0  # nothing refused was stored


def test_mcp_over_http_needs_a_key_the_api_takes_and_keeps_to_its_tenant(
    live: Callable[..., LiveServer],
) -> None:
    server = live()
    sdk = server.client()
    mine = sdk.find_dataset().id
    missing = httpx.post(f"{server.url}/mcp", json=INITIALIZE, headers=ACCEPT)
    assert missing.status_code == 401
    assert missing.json()["code"] == "unauthorized"
    assert "API key" in missing.json()["error"]
    wrong = httpx.post(
        f"{server.url}/mcp", json=INITIALIZE, headers={**ACCEPT, "Authorization": "Bearer nope"}
    )
    assert wrong.status_code == 401
    assert wrong.json()["code"] == "invalid_api_key"  # the API's own answer to that key
    taken = httpx.post(
        f"{server.url}/mcp",
        json=INITIALIZE,
        headers={**ACCEPT, "Authorization": f"Bearer {server.key}"},
    )
    assert taken.status_code == 200
    assert taken.json()["result"]["serverInfo"]["name"] == "knowledgeops"

    _, other_key = server.runtime.service.keys.create("tenant-b", "other")

    async def scenario() -> None:
        with pytest.raises(BaseExceptionGroup) as raised:  # the client's task groups' own
            async with over_http(server, key="nope"):
                pass
        assert raised.group_contains(MCPError)
        async with over_http(server, key=other_key) as stranger:
            text = await refusal(stranger, "search", dataset=mine, query=QUERY)
            assert "no dataset named" in text
            assert "not_found" in text
            theirs = (await call(stranger, "list_datasets"))["datasets"]
            assert mine not in {d["id"] for d in theirs}

    anyio.run(scenario)


def test_at_the_mount_the_api_judges_auth_off_and_the_rate_limit(
    live: Callable[..., LiveServer],
) -> None:
    open_server = live(auth="off")
    answered = httpx.post(f"{open_server.url}/mcp", json=INITIALIZE, headers=ACCEPT)
    assert answered.status_code == 200  # no keys asked for: none needed here either
    limited = live(rate_limit="2/minute")
    keyed = {**ACCEPT, "Authorization": f"Bearer {limited.key}"}
    statuses = [httpx.post(f"{limited.url}/mcp", json=INITIALIZE, headers=keyed) for _ in range(3)]
    assert [r.status_code for r in statuses] == [200, 200, 429]
    assert statuses[-1].json()["code"] == "rate_limited"
    assert int(statuses[-1].headers["Retry-After"]) > 0


def test_kops_mcp_on_stdio_answers_what_the_api_answers(
    live: Callable[..., LiveServer], tmp_path: Path
) -> None:
    folder = tmp_path / "papers"
    folder.mkdir()
    make_text(folder / "cancelling.md", CANCELLING)
    outside = make_text(tmp_path / "secret.md", OCR)
    os.symlink(outside, folder / "link.md")
    server = live()  # the server's own setting is not the stdio process's
    sdk = server.client()

    async def scenario() -> None:
        log = tmp_path / "kops-mcp.log"
        async with over_stdio(server, log, KOPS_MCP_UPLOAD_DIR=str(folder)) as mcp:
            assert {tool.name for tool in (await mcp.list_tools()).tools} == TOOLS
            for path in (str(outside), "../secret.md", "link.md"):
                text = await refusal(mcp, "upload_document", path=path)
                assert "outside the folder KOPS_MCP_UPLOAD_DIR names" in text
            text = await refusal(mcp, "upload_document", path="missing.md")
            assert "no such file" in text
            uploaded = await call(mcp, "upload_document", path="cancelling.md")
            assert uploaded["file_name"] == "cancelling.md"
            assert sdk.wait(uploaded["job_id"], timeout=60).status == "completed"
            by_path = await call(mcp, "upload_document", path=str(folder / "cancelling.md"))
            assert by_path["duplicate"]
            for mode in ("hybrid", "keyword"):
                answer = await call(mcp, "search", query=QUERY, mode=mode, top_k=4)
                assert answer["hits"]
                assert mcp_hits(answer) == api_hits(sdk, QUERY, mode=mode, top_k=4)
            assert answer["hits"][0]["file_name"] == "cancelling.md"
            text = await refusal(mcp, "get_job", job_id=str(uuid.uuid4()))
            assert "HTTP 404" in text
        assert "Traceback" not in log.read_text()

    anyio.run(scenario)
    assert sdk.list_documents(sdk.find_dataset().id).total == 1


def test_kops_mcp_on_stdio_without_an_upload_folder_takes_text_only(
    live: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = live()
    make_text(tmp_path / "note.md", CANCELLING)

    async def scenario() -> None:
        async with over_stdio(server, tmp_path / "kops-mcp.log") as mcp:
            text = await refusal(mcp, "upload_document", path=str(tmp_path / "note.md"))
            assert "KOPS_MCP_UPLOAD_DIR names no folder" in text
            uploaded = await call(mcp, "upload_document", text=CANCELLING)
            assert uploaded["file_name"] == "note.md"

    anyio.run(scenario)


def test_over_http_the_stdio_upload_folder_is_not_readable(
    live: Callable[..., LiveServer], tmp_path: Path
) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    make_text(folder / "private.txt", "the agent's own machine's file")
    server = live(mcp_upload_dir=folder)  # the stdio setting only: /mcp reads no folder

    async def scenario() -> None:
        async with over_http(server) as mcp:
            text = await refusal(mcp, "upload_document", path=str(folder / "private.txt"))
            assert "KOPS_MCP_HTTP_UPLOAD_DIR names no folder" in text

    anyio.run(scenario)
