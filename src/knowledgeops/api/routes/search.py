"""POST /datasets/{id}/search: vector, keyword or hybrid."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from knowledgeops.api.auth import Tenant
from knowledgeops.api.deps import DatasetId, ServiceDep
from knowledgeops.schemas import (
    ErrorPublic,
    MetadataIn,
    SearchHitPublic,
    SearchRequest,
    SearchResults,
)
from knowledgeops.service.metadata import make_filter
from knowledgeops.service.search import SearchMode

router = APIRouter(tags=["search"])


@router.post(
    "/datasets/{dataset_id}/search",
    response_model=SearchResults,
    responses={404: {"model": ErrorPublic}, 422: {"model": ErrorPublic}},
    summary="Find the chunks that answer a query",
)
def search(dataset_id: DatasetId, body: SearchRequest, service: ServiceDep, tenant: Tenant) -> Any:
    where = None
    if body.filter is not None:
        wanted = body.filter.metadata or {}
        where = make_filter(
            body.filter.document_ids,
            body.filter.file_types,
            {k: {"in": v.in_} if isinstance(v, MetadataIn) else v for k, v in wanted.items()},
        )
    hits = service.search.search(
        tenant, dataset_id, body.query, top_k=body.top_k, mode=SearchMode(body.mode), where=where
    )
    return SearchResults(
        query=body.query,
        mode=body.mode,
        results=[
            SearchHitPublic(
                chunk_id=h.chunk_id,
                document_id=h.document_id,
                file_name=h.file_name,
                ordinal=h.ordinal,
                text=h.text,
                score=h.score,
                page=h.page_start,
                page_end=h.page_end,
                section=h.section,
            )
            for h in hits
        ],
    )
