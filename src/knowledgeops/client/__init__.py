"""The Python SDK for KnowledgeOps: `KnowledgeOps` (blocking) and `AsyncKnowledgeOps` (asyncio),
both on httpx, returning the API's own pydantic models and raising typed exceptions that carry
the API's error code. `verify_signature` checks a webhook delivery.

    from knowledgeops.client import KnowledgeOps

    with KnowledgeOps("http://127.0.0.1:8000", api_key="kops_…") as kops:
        dataset = kops.find_dataset()  # the default dataset
        accepted = kops.upload("handbook.pdf", dataset_id=dataset.id)
        job = kops.wait(accepted.job_id, timeout=600)
        for hit in kops.search(dataset.id, "how do I cancel a job?").results:
            print(hit.score, hit.file_name, hit.page, hit.text[:80])
"""

from __future__ import annotations

from knowledgeops.client.aio import AsyncKnowledgeOps
from knowledgeops.client.calls import Call
from knowledgeops.client.errors import (
    ApiError,
    AuthenticationFailed,
    BadRequest,
    ClientError,
    Conflict,
    ConnectionFailed,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ServerError,
    ServiceUnavailable,
    UnsupportedFileType,
    ValidationFailed,
    WaitTimeout,
)
from knowledgeops.client.signatures import SignatureInvalid, sign, verify_signature
from knowledgeops.client.sync import KnowledgeOps

__all__ = [
    "ApiError",
    "AsyncKnowledgeOps",
    "AuthenticationFailed",
    "BadRequest",
    "Call",
    "ClientError",
    "Conflict",
    "ConnectionFailed",
    "Forbidden",
    "KnowledgeOps",
    "NotFound",
    "PayloadTooLarge",
    "RateLimited",
    "ServerError",
    "ServiceUnavailable",
    "SignatureInvalid",
    "UnsupportedFileType",
    "ValidationFailed",
    "WaitTimeout",
    "sign",
    "verify_signature",
]
