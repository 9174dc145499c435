"""Jobs: read one, list, cancel, retry."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from knowledgeops.api.auth import Tenant
from knowledgeops.api.deps import UUID_PATTERN, JobId, Limit, PageNo, ServiceDep
from knowledgeops.api.schemas import listing
from knowledgeops.jobs.states import JobStatus
from knowledgeops.schemas import ErrorPublic, JobPublic, Listing

router = APIRouter(prefix="/docs/jobs", tags=["jobs"])
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorPublic}}
CONFLICT: dict[int | str, dict[str, Any]] = {409: {"model": ErrorPublic}}


@router.get("", response_model=Listing[JobPublic], summary="List jobs, newest first")
def list_jobs(
    service: ServiceDep,
    tenant: Tenant,
    status: JobStatus | None = None,
    dataset_id: Annotated[str | None, Query(alias="datasetId", pattern=UUID_PATTERN)] = None,
    document_id: Annotated[str | None, Query(alias="documentId", pattern=UUID_PATTERN)] = None,
    page: PageNo = 1,
    limit: Limit = 20,
) -> Any:
    found = service.jobs.list(
        tenant,
        status=status,
        dataset_id=dataset_id,
        document_id=document_id,
        page=page,
        limit=limit,
    )
    return listing(found, JobPublic)


@router.get("/{job_id}", response_model=JobPublic, responses=NOT_FOUND, summary="Read a job")
def get_job(job_id: JobId, service: ServiceDep, tenant: Tenant) -> Any:
    return service.jobs.get(tenant, job_id)


@router.post(
    "/{job_id}/cancel",
    response_model=JobPublic,
    responses={**NOT_FOUND, **CONFLICT},
    summary="Cancel a pending, retrying or running job (it stops at its next batch)",
)
def cancel_job(job_id: JobId, service: ServiceDep, tenant: Tenant) -> Any:
    return service.jobs.cancel(tenant, job_id)


@router.post(
    "/{job_id}/retry",
    response_model=JobPublic,
    status_code=202,
    responses={**NOT_FOUND, **CONFLICT},
    summary="Run a failed or cancelled job again",
)
def retry_job(job_id: JobId, service: ServiceDep, tenant: Tenant) -> Any:
    return service.jobs.retry(tenant, job_id)
