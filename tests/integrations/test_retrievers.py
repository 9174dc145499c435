"""The framework retrievers (knowledgeops.integrations) against the real libraries
(llama-index-core, langchain-core) and a real server (uvicorn on a port, the SDK over HTTP):
blocking and asyncio retrieval give exactly the hits the SDK's search gives (ids in order,
scores, text, metadata), with top_k, filters and datasets by name applied, as each
framework's own types."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from langchain_core.documents import Document
from llama_index.core.schema import MetadataMode, NodeRelationship, QueryBundle, TextNode

from knowledgeops.client import AsyncKnowledgeOps, KnowledgeOps, NotFound
from knowledgeops.integrations import langchain as lc
from knowledgeops.integrations import llama_index as li
from knowledgeops.lab.embedders import HashingEmbedder
from knowledgeops.roles.embedded import EmbeddedRole
from knowledgeops.schemas import SearchHitPublic
from knowledgeops.settings import Settings
from tests.fixtures.documents import make_markdown, make_pdf, make_text
from tests.fixtures.live import LiveServer, serve

ORCHIDS = """\
# Orchid care

Orchids are epiphytes: in the wild they grow on trees, their roots in the open air.

## Watering

Water an orchid once a week, in the morning, and let the bark dry out between waterings.
Soggy roots rot; silvery roots are thirsty, green roots have had enough water.

## Light

An orchid wants bright, indirect light: an east window is best, a south window needs a
sheer curtain. Dark green leaves mean too little light, yellow leaves too much.
"""

VOLCANOES = (
    "A volcano is an opening in the crust where magma reaches the surface as lava. "
    "Shield volcanoes erupt runny basalt lava in gentle flows; stratovolcanoes build steep "
    "cones of ash and lava and erupt explosively. Magma rich in silica traps gas, and the gas "
    "escapes in violent eruptions. Volcanologists watch the ground swell and the gas change "
    "before an eruption. "
) * 3

SAILING_PAGES = [
    "Sailing close-hauled means steering as near the wind as the sails allow.\n"
    "Trim the sheets until the telltales stream, then hold the course.",
    "To tack, turn the bow through the wind; to gybe, turn the stern through it.\n"
    "A gybe in strong wind swings the boom hard: call it before you turn.",
]

ARCHIVE = "Orchid watering schedules from the old greenhouse logbook, kept for the archive."

QUERIES = ("orchid watering light", "volcano lava eruption", "sailing wind tack")


@dataclass(frozen=True)
class Corpus:
    """The served corpus: the default dataset's three documents and a second dataset."""

    server: LiveServer
    dataset_id: str
    archive_id: str
    documents: dict[str, str]  # file name → document id


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Corpus]:
    """One server for the module, its documents uploaded once and searched by every test (the
    tests only read): the embedded runtime with the deterministic test embedder and the fast
    settings of tests/conftest.py's make_runtime."""
    root = tmp_path_factory.mktemp("retrievers")
    settings = Settings(
        data_dir=root / "data",
        workers=2,
        heartbeat_interval_s=0.2,
        stale_after_s=5.0,
        relay_interval_s=0.1,
        backoff_base_s=0.05,
        backoff_max_s=0.2,
        embed_batch_size=8,
        chunk_size=64,
        chunk_overlap=8,
        embed_cache=False,
        stream_poll_s=0.05,
    )
    runtime = EmbeddedRole(settings, embedder=HashingEmbedder())
    with serve(runtime) as server, server.client() as sdk:
        files = [
            make_markdown(root / "orchids.md", ORCHIDS),
            make_text(root / "volcanoes.txt", VOLCANOES),
            make_pdf(root / "sailing.pdf", SAILING_PAGES),
        ]
        dataset_id = sdk.find_dataset().id
        archive_id = sdk.create_dataset("archive").id
        accepted = [sdk.upload(path) for path in files]
        accepted.append(sdk.upload(make_text(root / "logbook.txt", ARCHIVE), dataset_id=archive_id))
        for upload in accepted:
            assert sdk.wait(upload.job_id, timeout=120).status == "completed"
        documents = {
            path.name: upload.document_id for path, upload in zip(files, accepted[:3], strict=True)
        }
        yield Corpus(server, dataset_id, archive_id, documents)


# --- the two frameworks, seen the same way ----------------------------------------------------
@dataclass(frozen=True)
class Hit:
    """What a framework's node or document says of one hit, to compare with the SDK's."""

    id: str
    score: float | None
    text: str
    metadata: dict[str, Any]


def expected(hit: SearchHitPublic, dataset_id: str) -> Hit:
    """The Hit a retriever should make of the SDK's `hit`."""
    return Hit(
        id=hit.chunk_id,
        score=hit.score,
        text=hit.text,
        metadata={
            "file_name": hit.file_name,
            "page": hit.page,
            "page_end": hit.page_end,
            "section": hit.section,
            "chunk_id": hit.chunk_id,
            "document_id": hit.document_id,
            "dataset_id": dataset_id,
            "ordinal": hit.ordinal,
            "score": hit.score,
        },
    )


@dataclass(frozen=True)
class Framework:
    """One framework's retriever: how it is made and how it retrieves, blocking and async."""

    name: str
    make: Callable[..., Any]
    retrieve: Callable[[Any, str], list[Hit]]
    aretrieve: Callable[[Any, str], Awaitable[list[Hit]]]


def _from_nodes(nodes: list[Any]) -> list[Hit]:
    for found in nodes:
        assert isinstance(found.node, TextNode)
    return [Hit(n.node.node_id, n.score, n.node.text, n.node.metadata) for n in nodes]


def _from_documents(documents: list[Document]) -> list[Hit]:
    for doc in documents:
        assert isinstance(doc, Document)
        assert doc.id is not None
    return [Hit(d.id or "", d.metadata["score"], d.page_content, d.metadata) for d in documents]


async def _llama_aretrieve(retriever: li.KnowledgeOpsRetriever, query: str) -> list[Hit]:
    return _from_nodes(await retriever.aretrieve(query))


async def _langchain_aretrieve(retriever: lc.KnowledgeOpsRetriever, query: str) -> list[Hit]:
    return _from_documents(await retriever.ainvoke(query))


FRAMEWORKS = {
    "llama_index": Framework(
        "llama_index",
        li.KnowledgeOpsRetriever,
        lambda r, q: _from_nodes(r.retrieve(q)),
        _llama_aretrieve,
    ),
    "langchain": Framework(
        "langchain",
        lc.KnowledgeOpsRetriever,
        lambda r, q: _from_documents(r.invoke(q)),
        _langchain_aretrieve,
    ),
}


@pytest.fixture(params=sorted(FRAMEWORKS))
def framework(request: pytest.FixtureRequest) -> Framework:
    return FRAMEWORKS[request.param]


def both_ways(
    framework: Framework, corpus: Corpus, query: str, **options: Any
) -> tuple[list[Hit], list[Hit]]:
    """What the retriever made with `options` finds for `query`, blocking (with a `client=`)
    and in asyncio (with an `async_client=`, opened and closed in its loop)."""
    server = corpus.server
    with server.client() as sdk:
        blocking = framework.retrieve(framework.make(client=sdk, **options), query)

    async def run() -> list[Hit]:
        async with AsyncKnowledgeOps(server.url, api_key=server.key) as aio:
            retriever = framework.make(async_client=aio, **options)
            return await framework.aretrieve(retriever, query)

    return blocking, asyncio.run(run())


def sdk_hits(
    corpus: Corpus, query: str, dataset_id: str | None = None, **options: Any
) -> list[Hit]:
    dataset_id = dataset_id or corpus.dataset_id
    with corpus.server.client() as sdk:
        found = sdk.search(dataset_id, query, **options).results
    return [expected(hit, dataset_id) for hit in found]


# --- the same hits as the SDK's search --------------------------------------------------------
@pytest.mark.parametrize("query", QUERIES)
def test_blocking_and_async_retrieval_give_the_sdks_hits(
    framework: Framework, corpus: Corpus, query: str
) -> None:
    blocking, asynchronous = both_ways(framework, corpus, query)
    want = sdk_hits(corpus, query, top_k=5, mode="hybrid")
    assert want, "the corpus should answer every query"
    assert blocking == want
    assert asynchronous == want


@pytest.mark.parametrize("mode", ["vector", "keyword"])
def test_the_mode_is_the_searchs(framework: Framework, corpus: Corpus, mode: str) -> None:
    blocking, asynchronous = both_ways(framework, corpus, "orchid light", mode=mode)
    want = sdk_hits(corpus, "orchid light", mode=mode)
    assert blocking == asynchronous == want
    assert want


def test_metadata_tells_file_page_and_section(framework: Framework, corpus: Corpus) -> None:
    found: dict[str, list[Hit]] = {}
    with corpus.server.client() as sdk:
        retriever = framework.make(client=sdk, top_k=20)
        for query in QUERIES:
            for hit in framework.retrieve(retriever, query):
                found.setdefault(hit.metadata["file_name"], []).append(hit)
    assert set(found) == set(corpus.documents)
    for name, hits in found.items():
        for hit in hits:
            assert hit.metadata["document_id"] == corpus.documents[name]
            assert hit.metadata["dataset_id"] == corpus.dataset_id
            assert hit.metadata["chunk_id"] == hit.id
            assert hit.metadata["score"] == hit.score
    sections = {hit.metadata["section"] for hit in found["orchids.md"]}
    assert sections == {"Orchid care", "Orchid care › Watering", "Orchid care › Light"}
    for hit in found["sailing.pdf"]:
        assert hit.metadata["section"] is None
        assert 1 <= hit.metadata["page"] <= hit.metadata["page_end"] <= 2
    assert {hit.metadata["page"] for hit in found["sailing.pdf"]} == {1, 2}
    for hit in found["volcanoes.txt"]:
        assert hit.metadata["page"] is hit.metadata["page_end"] is hit.metadata["section"] is None


# --- what the search is asked -----------------------------------------------------------------
@pytest.mark.parametrize("top_k", [1, 2, 7])
def test_top_k_is_respected(framework: Framework, corpus: Corpus, top_k: int) -> None:
    query = "orchid volcano sailing wind lava water"
    blocking, asynchronous = both_ways(framework, corpus, query, top_k=top_k)
    want = sdk_hits(corpus, query, top_k=top_k)
    assert len(want) == top_k  # the corpus has more chunks than that
    assert blocking == asynchronous == want


def test_a_file_types_filter_is_applied(framework: Framework, corpus: Corpus) -> None:
    query = "orchid volcano sailing"
    blocking, asynchronous = both_ways(
        framework, corpus, query, top_k=20, filter={"file_types": ["md", "pdf"]}
    )
    assert (
        blocking
        == asynchronous
        == sdk_hits(corpus, query, top_k=20, filter={"file_types": ["md", "pdf"]})
    )
    assert {hit.metadata["file_name"] for hit in blocking} == {"orchids.md", "sailing.pdf"}


def test_a_document_ids_filter_is_applied(framework: Framework, corpus: Corpus) -> None:
    only = corpus.documents["volcanoes.txt"]
    query = "orchid watering"  # what the volcanoes do not mention: still only they answer
    blocking, asynchronous = both_ways(
        framework, corpus, query, top_k=20, mode="vector", filter={"document_ids": [only]}
    )
    assert blocking
    assert blocking == asynchronous
    assert {hit.metadata["document_id"] for hit in blocking} == {only}
    assert blocking == sdk_hits(
        corpus, query, top_k=20, mode="vector", filter={"document_ids": [only]}
    )


@pytest.mark.parametrize("by", ["name", "id"])
def test_a_dataset_given_by_name_or_id(framework: Framework, corpus: Corpus, by: str) -> None:
    ref = "archive" if by == "name" else corpus.archive_id
    blocking, asynchronous = both_ways(framework, corpus, "orchid watering", dataset=ref)
    assert blocking
    assert blocking == asynchronous == sdk_hits(corpus, "orchid watering", corpus.archive_id)
    assert {hit.metadata["file_name"] for hit in blocking} == {"logbook.txt"}
    assert {hit.metadata["dataset_id"] for hit in blocking} == {corpus.archive_id}


def test_an_unknown_dataset_raises_not_found(framework: Framework, corpus: Corpus) -> None:
    with pytest.raises(NotFound):
        both_ways(framework, corpus, "orchid", dataset="no-such-dataset")

    async def run() -> None:
        async with AsyncKnowledgeOps(corpus.server.url, api_key=corpus.server.key) as aio:
            retriever = framework.make(async_client=aio, dataset="no-such-dataset")
            await framework.aretrieve(retriever, "orchid")

    with pytest.raises(NotFound):
        asyncio.run(run())


def test_a_dataset_made_again_under_its_name_is_looked_up_again(
    framework: Framework, corpus: Corpus, tmp_path: Path
) -> None:
    name = f"scratch-{framework.name}"
    with corpus.server.client() as sdk:
        first = sdk.create_dataset(name).id
        retriever = framework.make(client=sdk, dataset=name)
        assert framework.retrieve(retriever, "volcano") == []  # looked up: an empty dataset
        sdk.delete_dataset(first)
        second = sdk.create_dataset(name).id
        upload = sdk.upload(make_text(tmp_path / "again.txt", VOLCANOES), dataset_id=second)
        assert sdk.wait(upload.job_id, timeout=60).status == "completed"
        hits = framework.retrieve(retriever, "volcano")
        assert hits
        assert {hit.metadata["dataset_id"] for hit in hits} == {second}
        sdk.delete_dataset(second)
        with pytest.raises(NotFound):  # gone, and nothing of that name left
            framework.retrieve(retriever, "volcano")


# --- how a retriever reaches KnowledgeOps -----------------------------------------------------
def test_a_url_and_key_make_clients_of_its_own(framework: Framework, corpus: Corpus) -> None:
    server = corpus.server
    retriever = framework.make(base_url=server.url, api_key=server.key)
    want = sdk_hits(corpus, "volcano lava")
    assert framework.retrieve(retriever, "volcano lava") == want

    async def run() -> list[Hit]:
        try:
            return await framework.aretrieve(retriever, "volcano lava")
        finally:
            await retriever.aclose()

    assert asyncio.run(run()) == want
    assert asyncio.run(run()) == want  # a new event loop: a new client for it
    retriever.close()


def test_the_url_and_key_default_to_the_environment(
    framework: Framework, corpus: Corpus, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KOPS_URL", corpus.server.url)
    monkeypatch.setenv("KOPS_API_KEY", corpus.server.key)
    retriever = framework.make(top_k=3)
    assert framework.retrieve(retriever, "sailing wind") == sdk_hits(
        corpus, "sailing wind", top_k=3
    )
    retriever.close()


def test_async_retrieval_with_only_a_blocking_client(framework: Framework, corpus: Corpus) -> None:
    with corpus.server.client() as sdk:
        retriever = framework.make(client=sdk)
        found = asyncio.run(framework.aretrieve(retriever, "orchid light"))
    assert found == sdk_hits(corpus, "orchid light")


def test_blocking_retrieval_with_only_an_async_client_is_refused(
    framework: Framework, corpus: Corpus
) -> None:
    aio = AsyncKnowledgeOps(corpus.server.url, api_key=corpus.server.key)
    retriever = framework.make(async_client=aio)
    with pytest.raises(TypeError, match="client="):
        framework.retrieve(retriever, "orchid")
    asyncio.run(aio.close())


@pytest.mark.parametrize(
    "options",
    [
        {"top_k": 0},
        {"top_k": 101},
        {"mode": "semantic"},
        {"filter": {"file_type": ["md"]}},
        {"filter": {"file_types": ["exe"]}},
        {"filter": {"document_ids": ["not-a-uuid"]}},
    ],
)
def test_parameters_the_api_would_refuse_are_refused_at_once(
    framework: Framework, options: dict[str, Any]
) -> None:
    with pytest.raises(ValueError, match="validation error"):
        framework.make(base_url="http://127.0.0.1:9", **options)


def test_clients_and_a_url_together_are_refused(framework: Framework) -> None:
    with KnowledgeOps("http://127.0.0.1:9") as sdk, pytest.raises(ValueError, match="not both"):
        framework.make(client=sdk, base_url="http://127.0.0.1:9")


# --- each framework's own types ---------------------------------------------------------------
def test_llama_index_nodes(corpus: Corpus) -> None:
    with corpus.server.client() as sdk:
        retriever = li.KnowledgeOpsRetriever(client=sdk, top_k=3)
        by_bundle = retriever.retrieve(QueryBundle("orchid watering"))
        by_string = retriever.retrieve("orchid watering")
    assert [n.node_id for n in by_bundle] == [n.node_id for n in by_string]
    assert [n.score for n in by_bundle] == [n.score for n in by_string]
    want = sdk_hits(corpus, "orchid watering", top_k=3)
    assert _from_nodes(by_bundle) == want
    for found in by_bundle:
        node = found.node
        assert node.node_id == node.metadata["chunk_id"]
        assert node.source_node is not None
        assert node.source_node.node_id == node.metadata["document_id"]
        assert NodeRelationship.SOURCE in node.relationships
        shown = node.get_content(MetadataMode.LLM)
        assert f"file_name: {node.metadata['file_name']}" in shown
        assert f"section: {node.metadata['section']}" in shown
        assert node.metadata["chunk_id"] not in shown  # ids and score are not for the model
        assert "score:" not in shown
        assert "page:" not in shown  # a markdown file has no pages: nothing to show
        assert node.get_content(MetadataMode.EMBED) == shown
        assert node.get_content(MetadataMode.NONE) == node.text


def test_llama_index_aretrieve_with_a_query_bundle(corpus: Corpus) -> None:
    async def run() -> list[Hit]:
        async with AsyncKnowledgeOps(corpus.server.url, api_key=corpus.server.key) as aio:
            retriever = li.KnowledgeOpsRetriever(async_client=aio, top_k=4)
            return _from_nodes(await retriever.aretrieve(QueryBundle("volcano eruption")))

    assert asyncio.run(run()) == sdk_hits(corpus, "volcano eruption", top_k=4)


def test_langchain_documents_and_batch(corpus: Corpus) -> None:
    with corpus.server.client() as sdk:
        retriever = lc.KnowledgeOpsRetriever(client=sdk, top_k=2)
        batches = retriever.batch(list(QUERIES))
    for query, documents in zip(QUERIES, batches, strict=True):
        assert _from_documents(documents) == sdk_hits(corpus, query, top_k=2)
    assert "api_key" not in repr(lc.KnowledgeOpsRetriever(base_url="http://x", api_key="s3"))
    assert "s3" not in repr(lc.KnowledgeOpsRetriever(base_url="http://x", api_key="s3"))


# --- without the extra ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("module", "extra"),
    [
        ("knowledgeops.integrations.llama_index", "llamaindex"),
        ("knowledgeops.integrations.langchain", "langchain"),
    ],
)
def test_without_the_extra_the_import_error_names_it(module: str, extra: str) -> None:
    """A fresh interpreter where the framework cannot be imported (Python's own way of
    refusing a module: None in sys.modules), as where the extra was never installed."""
    code = (
        "import sys\n"
        "sys.modules['llama_index'] = sys.modules['langchain_core'] = None\n"
        "import knowledgeops.integrations  # the package itself needs neither\n"
        "try:\n"
        f"    import {module}\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    print('imported')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert f"pip install 'knowledgeops[{extra}]'" in done.stdout, done.stdout
