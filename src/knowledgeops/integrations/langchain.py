"""A LangChain retriever backed by the KnowledgeOps search API (needs the `langchain` extra:
`pip install 'knowledgeops[langchain]'`).

    from knowledgeops.integrations.langchain import KnowledgeOpsRetriever

    retriever = KnowledgeOpsRetriever(dataset="handbook", top_k=5)  # KOPS_URL, KOPS_API_KEY
    for doc in retriever.invoke("how do I cancel a job?"):
        print(doc.metadata["score"], doc.metadata["file_name"], doc.metadata["page"])

Each hit is a `Document` whose id is the chunk's id and whose metadata is the hit's
(file_name, page, page_end, section, chunk_id, document_id, dataset_id, ordinal, score). It
is a Runnable like any LangChain retriever (`invoke`, `ainvoke`, `batch`, a chain's step) and
talks to KnowledgeOps only through the SDK.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import Field, PrivateAttr, SecretStr, model_validator

from knowledgeops.client import AsyncKnowledgeOps, KnowledgeOps
from knowledgeops.integrations._search import Connection, SearchMode, check_search, hit_metadata
from knowledgeops.schemas import SearchHitPublic

try:
    from langchain_core.callbacks import (
        AsyncCallbackManagerForRetrieverRun,
        CallbackManagerForRetrieverRun,
    )
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
except ImportError as exc:  # the extra is not installed
    raise ImportError(
        "knowledgeops.integrations.langchain needs LangChain (langchain-core): "
        "pip install 'knowledgeops[langchain]'",
        name=exc.name,
    ) from exc

__all__ = ["KnowledgeOpsRetriever"]


class KnowledgeOpsRetriever(BaseRetriever):
    """Retrieves from a KnowledgeOps dataset: `invoke`/`ainvoke` send the query to the
    dataset's search and return its hits, best first, as `Document`s.

    `dataset`: the dataset's id or name; None: the tenant's default dataset (looked up once,
    at the first query). `top_k` (1..100), `mode` (hybrid, vector or keyword) and `filter`
    (document_ids, file_types, metadata) are the search's, checked when the retriever is made.

    Either `client` (a `KnowledgeOps`, for `invoke`) and/or `async_client` (an
    `AsyncKnowledgeOps`, for `ainvoke`; without it `ainvoke` runs `client` in a worker
    thread), which stay the caller's to close; or `base_url` and `api_key` (default KOPS_URL
    and KOPS_API_KEY), from which the retriever makes its own clients: `close()`/`aclose()`
    closes them. The connection is settled when the retriever is made: give the clients to
    the constructor."""

    dataset: str | None = None
    top_k: int = Field(default=5, ge=1, le=100)
    mode: SearchMode = "hybrid"
    filter: dict[str, Any] | None = None
    client: KnowledgeOps | None = Field(default=None, exclude=True, repr=False)
    async_client: AsyncKnowledgeOps | None = Field(default=None, exclude=True, repr=False)
    base_url: str | None = None
    api_key: SecretStr | None = Field(default=None, exclude=True, repr=False)

    _connection: Connection | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check(self) -> Self:
        """The search's parameters, and one way to reach KnowledgeOps, refused at once."""
        check_search(self.top_k, self.mode, self.filter)
        self._connect()
        return self

    def _connect(self) -> Connection:
        if self._connection is None:
            self._connection = Connection(
                client=self.client,
                async_client=self.async_client,
                base_url=self.base_url,
                api_key=self.api_key.get_secret_value() if self.api_key is not None else None,
            )
        return self._connection

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        dataset_id, hits = self._connect().search(
            self.dataset, query, top_k=self.top_k, mode=self.mode, filter=self.filter
        )
        return [_document(hit, dataset_id) for hit in hits]

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        dataset_id, hits = await self._connect().asearch(
            self.dataset, query, top_k=self.top_k, mode=self.mode, filter=self.filter
        )
        return [_document(hit, dataset_id) for hit in hits]

    def close(self) -> None:
        """Close the blocking client this retriever made (a given one stays open)."""
        self._connect().close()

    async def aclose(self) -> None:
        """Close the clients this retriever made, from the event loop it retrieved in."""
        await self._connect().aclose()


def _document(hit: SearchHitPublic, dataset_id: str) -> Document:
    """The hit as LangChain's document: the chunk's text, id and metadata."""
    return Document(page_content=hit.text, metadata=hit_metadata(hit, dataset_id), id=hit.chunk_id)
