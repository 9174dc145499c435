"""A LlamaIndex retriever backed by the KnowledgeOps search API (needs the `llamaindex` extra:
`pip install 'knowledgeops[llamaindex]'`).

    from knowledgeops.integrations.llama_index import KnowledgeOpsRetriever

    retriever = KnowledgeOpsRetriever(dataset="handbook", top_k=5)  # KOPS_URL, KOPS_API_KEY
    for hit in retriever.retrieve("how do I cancel a job?"):
        print(hit.score, hit.node.metadata["file_name"], hit.node.metadata["page"])

Each hit is a `NodeWithScore` of a `TextNode` whose id is the chunk's id, whose source
relationship is the chunk's document, and whose metadata is the hit's (file_name, page,
page_end, section, chunk_id, document_id, dataset_id, ordinal, score). It talks to KnowledgeOps
only through the SDK, so it can drop in wherever LlamaIndex takes a retriever (a query engine,
a fusion retriever) in place of a local index.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from knowledgeops.client import AsyncKnowledgeOps, KnowledgeOps
from knowledgeops.integrations._search import (
    BOOKKEEPING_KEYS,
    Connection,
    SearchMode,
    check_search,
    hit_metadata,
)
from knowledgeops.schemas import SearchHitPublic

try:
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import (
        NodeRelationship,
        NodeWithScore,
        QueryBundle,
        RelatedNodeInfo,
        TextNode,
    )
except ImportError as exc:  # the extra is not installed
    raise ImportError(
        "knowledgeops.integrations.llama_index needs LlamaIndex (llama-index-core): "
        "pip install 'knowledgeops[llamaindex]'",
        name=exc.name,
    ) from exc

__all__ = ["KnowledgeOpsRetriever"]


class KnowledgeOpsRetriever(BaseRetriever):
    """Retrieves from a KnowledgeOps dataset: `retrieve`/`aretrieve` (a string or a
    `QueryBundle`) send the query string to the dataset's search and return its hits, best
    first, as `NodeWithScore`s.

    `dataset`: the dataset's id or name; None: the tenant's default dataset (looked up once,
    at the first query). `top_k` (1..100), `mode` (hybrid, vector or keyword) and `filter`
    (document_ids, file_types, metadata) are the search's, checked here.

    Either `client` (a `KnowledgeOps`, for `retrieve`) and/or `async_client` (an
    `AsyncKnowledgeOps`, for `aretrieve`; without it `aretrieve` runs `client` in a worker
    thread), which stay the caller's to close; or `base_url` and `api_key` (default KOPS_URL
    and KOPS_API_KEY), from which the retriever makes its own clients: `close()`/`aclose()`
    closes them."""

    def __init__(
        self,
        *,
        dataset: str | None = None,
        top_k: int = 5,
        mode: SearchMode = "hybrid",
        filter: Mapping[str, Any] | None = None,
        client: KnowledgeOps | None = None,
        async_client: AsyncKnowledgeOps | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
    ) -> None:
        check_search(top_k, mode, filter)
        self.dataset = dataset
        self.top_k = top_k
        self.mode: SearchMode = mode
        self.filter = dict(filter) if filter else None
        self._connection = Connection(
            client=client, async_client=async_client, base_url=base_url, api_key=api_key
        )
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        dataset_id, hits = self._connection.search(
            self.dataset,
            query_bundle.query_str,
            top_k=self.top_k,
            mode=self.mode,
            filter=self.filter,
        )
        return [_node(hit, dataset_id) for hit in hits]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        dataset_id, hits = await self._connection.asearch(
            self.dataset,
            query_bundle.query_str,
            top_k=self.top_k,
            mode=self.mode,
            filter=self.filter,
        )
        return [_node(hit, dataset_id) for hit in hits]

    def close(self) -> None:
        """Close the blocking client this retriever made (a given one stays open)."""
        self._connection.close()

    async def aclose(self) -> None:
        """Close the clients this retriever made, from the event loop it retrieved in."""
        await self._connection.aclose()


def _node(hit: SearchHitPublic, dataset_id: str) -> NodeWithScore:
    """The hit as LlamaIndex's node: the chunk's text and id, its document as the source. Of
    the metadata, an LLM or embedder is shown only where the text came from (file, page,
    section, those that are set), not the ids and score."""
    metadata = hit_metadata(hit, dataset_id)
    hidden = [key for key, value in metadata.items() if key in BOOKKEEPING_KEYS or value is None]
    node = TextNode(
        id_=hit.chunk_id,
        text=hit.text,
        metadata=metadata,
        relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=hit.document_id)},
        excluded_llm_metadata_keys=hidden,
        excluded_embed_metadata_keys=list(hidden),
    )
    return NodeWithScore(node=node, score=hit.score)
