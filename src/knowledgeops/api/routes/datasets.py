"""Datasets: create, read, update, delete, list; and their documents."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Response

from knowledgeops.api.auth import Tenant
from knowledgeops.api.deps import DatasetId, Limit, PageNo, ServiceDep
from knowledgeops.api.schemas import listing
from knowledgeops.schemas import (
    DatasetCreate,
    DatasetPublic,
    DatasetUpdate,
    DocumentPublic,
    ErrorPublic,
    Listing,
)

router = APIRouter(prefix="/datasets", tags=["datasets"])
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorPublic}}
CONFLICT: dict[int | str, dict[str, Any]] = {409: {"model": ErrorPublic}}
DocumentStatus = Literal["pending", "processing", "ready", "failed", "cancelled"]


@router.get("", response_model=Listing[DatasetPublic], summary="List datasets, oldest first")
def list_datasets(service: ServiceDep, tenant: Tenant, page: PageNo = 1, limit: Limit = 20) -> Any:
    return listing(service.datasets.list(tenant, page=page, limit=limit), DatasetPublic)


@router.post(
    "",
    response_model=DatasetPublic,
    status_code=201,
    responses={**CONFLICT, 422: {"model": ErrorPublic}},
    summary="Create",
)
def create_dataset(
    body: DatasetCreate, service: ServiceDep, tenant: Tenant, response: Response
) -> Any:
    created = service.datasets.create(
        tenant,
        body.name,
        body.description,
        body.chunk_size,
        body.chunk_overlap,
        embedding_model=body.embedding_model,
        ocr_languages=body.ocr_languages,
    )
    response.headers["Location"] = f"/datasets/{created.id}"
    return created


@router.get("/{dataset_id}", response_model=DatasetPublic, responses=NOT_FOUND, summary="Read")
def get_dataset(dataset_id: DatasetId, service: ServiceDep, tenant: Tenant) -> Any:
    return service.datasets.get(tenant, dataset_id)


@router.patch(
    "/{dataset_id}",
    response_model=DatasetPublic,
    responses={**NOT_FOUND, **CONFLICT, 422: {"model": ErrorPublic}},
    summary="Update; new chunk settings apply to documents ingested or reindexed from now on, "
    "a new embeddingModel starts a re-embed of the dataset",
)
def update_dataset(
    dataset_id: DatasetId, body: DatasetUpdate, service: ServiceDep, tenant: Tenant
) -> Any:
    return service.datasets.update(tenant, dataset_id, body.model_dump(exclude_unset=True))


@router.delete(
    "/{dataset_id}",
    status_code=204,
    responses={**NOT_FOUND, **CONFLICT},
    summary="Delete the dataset with its documents, jobs and chunks",
)
def delete_dataset(dataset_id: DatasetId, service: ServiceDep, tenant: Tenant) -> Response:
    service.datasets.delete(tenant, dataset_id)
    return Response(status_code=204)


@router.get(
    "/{dataset_id}/documents",
    response_model=Listing[DocumentPublic],
    responses=NOT_FOUND,
    summary="List the dataset's documents, newest first",
)
def list_documents(
    dataset_id: DatasetId,
    service: ServiceDep,
    tenant: Tenant,
    status: DocumentStatus | None = None,
    page: PageNo = 1,
    limit: Limit = 20,
) -> Any:
    service.datasets.get(tenant, dataset_id)
    found = service.documents.list(tenant, dataset_id, status=status, page=page, limit=limit)
    return listing(found, DocumentPublic)
