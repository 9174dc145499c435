"""Documents: read, list chunks, delete, reindex."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from knowledgeops.api.auth import Tenant
from knowledgeops.api.deps import DocumentId, Limit, PageNo, ServiceDep
from knowledgeops.api.schemas import listing
from knowledgeops.schemas import (
    ChunkPublic,
    DocumentPublic,
    ErrorPublic,
    Listing,
    ReindexAccepted,
)

router = APIRouter(prefix="/docs/documents", tags=["documents"])
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorPublic}}


@router.get("/{document_id}", response_model=DocumentPublic, responses=NOT_FOUND, summary="Read")
def get_document(document_id: DocumentId, service: ServiceDep, tenant: Tenant) -> Any:
    return service.documents.get(tenant, document_id)


@router.get(
    "/{document_id}/chunks",
    response_model=Listing[ChunkPublic],
    responses=NOT_FOUND,
    summary="List the document's chunks as search reads them, in document order",
)
def list_chunks(
    document_id: DocumentId,
    service: ServiceDep,
    tenant: Tenant,
    page: PageNo = 1,
    limit: Limit = 20,
) -> Any:
    return listing(
        service.documents.chunks(tenant, document_id, page=page, limit=limit), ChunkPublic
    )


@router.delete(
    "/{document_id}",
    status_code=204,
    responses=NOT_FOUND,
    summary="Delete the document; its chunks leave the index at once",
)
def delete_document(document_id: DocumentId, service: ServiceDep, tenant: Tenant) -> Response:
    service.documents.delete(tenant, document_id)
    return Response(status_code=204)


@router.post(
    "/{document_id}/reindex",
    status_code=202,
    response_model=ReindexAccepted,
    responses={**NOT_FOUND, 409: {"model": ErrorPublic}},
    summary="Process the document again as a new generation (the current one stays searchable)",
)
def reindex_document(
    document_id: DocumentId, service: ServiceDep, tenant: Tenant, response: Response
) -> Any:
    job_id = service.documents.reindex(tenant, document_id)
    response.headers["Location"] = f"/docs/jobs/{job_id}"
    return ReindexAccepted(job_id=job_id, document_id=document_id, status="pending")
