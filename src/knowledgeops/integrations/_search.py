"""What both framework retrievers share, so they cannot drift apart: the search parameters,
checked once by the API's own request model; the SDK clients a retriever searches through
(given, or made from a URL and key); the dataset, resolved by id or name once; and the
metadata each hit carries into the framework's node or document."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Literal

from knowledgeops.client import AsyncKnowledgeOps, KnowledgeOps, NotFound
from knowledgeops.schemas import SearchHitPublic, SearchRequest

SearchMode = Literal["hybrid", "vector", "keyword"]

METADATA_KEYS = (
    "file_name",
    "page",
    "page_end",
    "section",
    "chunk_id",
    "document_id",
    "dataset_id",
    "ordinal",
    "score",
)
"""The keys of every hit's metadata, in this order (a value may be None: `page` of a text
file, `section` of a chunk under no heading)."""

BOOKKEEPING_KEYS = ("chunk_id", "document_id", "dataset_id", "ordinal", "score")
"""Metadata for a program, not for a model: left out of the text an LLM or embedder sees."""


def check_search(top_k: int, mode: str, filter: Mapping[str, Any] | None) -> None:
    """Refuse, when the retriever is made rather than at its first query, what the API would:
    `top_k` outside 1..100, an unknown mode, a filter with unknown keys or values (its keys:
    document_ids, file_types, metadata). Raises pydantic's ValidationError (a ValueError)."""
    SearchRequest.model_validate(
        {"query": "-", "top_k": top_k, "mode": mode, "filter": dict(filter) if filter else None}
    )


def hit_metadata(hit: SearchHitPublic, dataset_id: str) -> dict[str, Any]:
    """The metadata of a node or document made from `hit` (keys: METADATA_KEYS)."""
    return {
        "file_name": hit.file_name,
        "page": hit.page,
        "page_end": hit.page_end,
        "section": hit.section,
        "chunk_id": hit.chunk_id,
        "document_id": hit.document_id,
        "dataset_id": dataset_id,
        "ordinal": hit.ordinal,
        "score": hit.score,
    }


class Connection:
    """How a retriever reaches KnowledgeOps: only through the SDK.

    Either the clients it was given (`client` for blocking retrieval, `async_client` for
    asyncio; with only `client`, asynchronous retrieval runs it in a worker thread), or,
    given neither, clients it makes from `base_url` and `api_key` (the SDK's defaults:
    KOPS_URL, KOPS_API_KEY) and closes in `close`/`aclose`. An httpx async client belongs to
    the event loop it first ran in, so a made one is made again for each new loop.

    The dataset (`ref`: an id, a name, or None for the tenant's default) is looked up once
    with `find_dataset` and its id kept; should a search then find it gone (deleted, perhaps
    made again under the same name), it is looked up once more."""

    def __init__(
        self,
        *,
        client: KnowledgeOps | None,
        async_client: AsyncKnowledgeOps | None,
        base_url: str | None,
        api_key: str | None,
    ) -> None:
        given = client is not None or async_client is not None
        if given and (base_url is not None or api_key is not None):
            raise ValueError("pass client=/async_client= or base_url=/api_key=, not both")
        self._client = client
        self._async_client = async_client
        self._makes_clients = not given
        self._base_url = base_url
        self._api_key = api_key
        self._made_async: tuple[asyncio.AbstractEventLoop, AsyncKnowledgeOps] | None = None
        self._dataset_ids: dict[str | None, str] = {}

    # --- the clients ---------------------------------------------------------------------------
    def sync_client(self) -> KnowledgeOps:
        if self._client is None:
            if not self._makes_clients:
                raise TypeError(
                    "this retriever was given only async_client=: blocking retrieval needs "
                    "client= too (or use the asynchronous methods)"
                )
            self._client = KnowledgeOps(self._base_url, api_key=self._api_key)
        return self._client

    def async_client(self) -> AsyncKnowledgeOps | None:
        """The asyncio client for the running loop; None where only a blocking one was given."""
        if self._async_client is not None:
            return self._async_client
        if not self._makes_clients:
            return None
        loop = asyncio.get_running_loop()
        if self._made_async is None or self._made_async[0] is not loop:
            self._made_async = (loop, AsyncKnowledgeOps(self._base_url, api_key=self._api_key))
        return self._made_async[1]

    def close(self) -> None:
        """Close the blocking client this connection made (never one it was given)."""
        if self._makes_clients and self._client is not None:
            self._client.close()
            self._client = None

    async def aclose(self) -> None:
        """Close the clients this connection made (never one it was given); the asyncio one
        only from the loop it belongs to (a client of a loop that has ended is dropped)."""
        self.close()
        if self._made_async is not None:
            loop, client = self._made_async
            self._made_async = None
            if loop is asyncio.get_running_loop():
                await client.close()

    # --- the search ----------------------------------------------------------------------------
    def search(
        self,
        ref: str | None,
        query: str,
        *,
        top_k: int,
        mode: str,
        filter: Mapping[str, Any] | None,
    ) -> tuple[str, list[SearchHitPublic]]:
        """The hits of `query` in the dataset `ref`, best first, and that dataset's id."""
        client = self.sync_client()
        dataset_id = self._dataset_ids.get(ref)
        if dataset_id is not None:
            try:
                found = client.search(dataset_id, query, top_k=top_k, mode=mode, filter=filter)
                return dataset_id, found.results
            except NotFound:
                self._dataset_ids.pop(ref, None)  # gone since it was looked up: look it up again
        dataset_id = self._dataset_ids[ref] = client.find_dataset(ref).id
        found = client.search(dataset_id, query, top_k=top_k, mode=mode, filter=filter)
        return dataset_id, found.results

    async def asearch(
        self,
        ref: str | None,
        query: str,
        *,
        top_k: int,
        mode: str,
        filter: Mapping[str, Any] | None,
    ) -> tuple[str, list[SearchHitPublic]]:
        """`search` for asyncio: the same hits, through the asyncio client."""
        client = self.async_client()
        if client is None:  # only a blocking client: it runs off the event loop
            return await asyncio.to_thread(
                self.search, ref, query, top_k=top_k, mode=mode, filter=filter
            )
        dataset_id = self._dataset_ids.get(ref)
        if dataset_id is not None:
            try:
                found = await client.search(
                    dataset_id, query, top_k=top_k, mode=mode, filter=filter
                )
                return dataset_id, found.results
            except NotFound:
                self._dataset_ids.pop(ref, None)  # gone since it was looked up: look it up again
        dataset_id = self._dataset_ids[ref] = (await client.find_dataset(ref)).id
        found = await client.search(dataset_id, query, top_k=top_k, mode=mode, filter=filter)
        return dataset_id, found.results
