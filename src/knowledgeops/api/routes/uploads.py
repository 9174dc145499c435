"""POST /docs/upload: store the file and the intent, answer 202 with the job id. No parsing here."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from knowledgeops.api.auth import Tenant
from knowledgeops.api.deps import UUID_PATTERN, ServiceDep
from knowledgeops.api.upload_stream import receive_upload
from knowledgeops.errors import InvalidField
from knowledgeops.schemas import ErrorPublic, UploadAccepted
from knowledgeops.service.metadata import parse_metadata
from knowledgeops.service.uploads import check_idempotency_key

router = APIRouter(tags=["documents"])

_UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "datasetId": {"type": "string", "format": "uuid"},
                        "metadata": {
                            "type": "string",
                            "description": "A JSON object of scalars (at most 32 keys, 8 KB), "
                            'e.g. {"team": "infra", "year": 2025}; search filters on it.',
                        },
                    },
                }
            }
        },
    }
}


@router.post(
    "/docs/upload",
    status_code=202,
    response_model=UploadAccepted,
    summary="Upload a document; it is processed in the background",
    openapi_extra=_UPLOAD_BODY,
    responses={
        200: {"model": UploadAccepted, "description": "These bytes were uploaded before."},
        400: {"model": ErrorPublic},
        404: {"model": ErrorPublic},
        409: {"model": ErrorPublic},
        413: {"model": ErrorPublic},
        422: {"model": ErrorPublic, "description": "A field is not valid (metadata, datasetId)."},
        415: {"model": ErrorPublic},
        429: {
            "model": ErrorPublic,
            "description": "Too many requests for this key, or too many jobs wait; see "
            "Retry-After.",
        },
    },
)
async def upload(
    request: Request,
    service: ServiceDep,
    tenant: Tenant,
    dataset_id: Annotated[str | None, Query(alias="datasetId", pattern=UUID_PATTERN)] = None,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> JSONResponse:
    key = check_idempotency_key(idempotency_key)
    await run_in_threadpool(service.uploads.check_backlog)  # before a byte is stored
    received = await receive_upload(request, service.uploads)
    dataset = received.fields.get("datasetId", dataset_id)
    if dataset is not None and not _is_uuid(dataset):
        received.staged.discard()
        # the same answer as for a malformed datasetId in the query string: 422 naming the field
        raise RequestValidationError(
            [
                {
                    "type": "string_pattern_mismatch",
                    "loc": ("body", "datasetId"),
                    "msg": "not a valid id (a UUID is expected)",
                    "input": dataset,
                }
            ]
        )
    try:
        metadata = parse_metadata(received.fields.get("metadata"))
    except InvalidField:
        received.staged.discard()
        raise
    accepted = await run_in_threadpool(
        service.uploads.accept,
        tenant,
        received.staged,
        file_name=received.file_name,
        declared_type=received.declared_type,
        dataset_id=dataset,
        idempotency_key=key,
        metadata=metadata,
    )
    body = UploadAccepted(
        job_id=accepted.job.id,
        document_id=accepted.document_id,
        status=accepted.job.status,
        duplicate=accepted.duplicate,
    )
    return JSONResponse(
        body.model_dump(by_alias=True),
        status_code=200 if accepted.duplicate else 202,
        headers={"Location": f"/docs/jobs/{accepted.job.id}"},
    )


def _is_uuid(value: str) -> bool:
    return re.fullmatch(UUID_PATTERN, value) is not None
