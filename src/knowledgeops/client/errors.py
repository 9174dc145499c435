"""The SDK's exceptions: one class per kind of refusal, each carrying the API's `code` (what went
wrong, for a program), its message (for a person) and the HTTP status. All are `ClientError`s,
so `except ClientError` still catches everything the SDK raises on purpose."""

from __future__ import annotations

from typing import Any

from knowledgeops.errors import ClientError

__all__ = [
    "ApiError",
    "AuthenticationFailed",
    "BadRequest",
    "ClientError",
    "Conflict",
    "ConnectionFailed",
    "Forbidden",
    "NotFound",
    "PayloadTooLarge",
    "RateLimited",
    "ServerError",
    "ServiceUnavailable",
    "UnsupportedFileType",
    "ValidationFailed",
    "WaitTimeout",
]


class ApiError(ClientError):
    """KnowledgeOps answered with an error. `code` is the API's (e.g. `not_found`,
    `unsupported_file_type`), `fields` the invalid fields of a 422, `retry_after_s` what a 429 or
    503 asked the client to wait."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        code: str | None,
        fields: list[dict[str, Any]] | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, status=status, code=code)
        self.fields = fields
        self.retry_after_s = retry_after_s


class BadRequest(ApiError):
    """400: the request could not be read (a malformed header, an unreadable body)."""


class AuthenticationFailed(ApiError):
    """401: no API key, or one that is unknown or revoked."""


class Forbidden(ApiError):
    """403."""


class NotFound(ApiError):
    """404: no such dataset, document, job or webhook for this key's tenant."""


class Conflict(ApiError):
    """409: the thing is not in a state that allows this now (e.g. retrying a completed job)."""


class PayloadTooLarge(ApiError):
    """413: the file is larger than the server's KOPS_MAX_UPLOAD_BYTES."""


class UnsupportedFileType(ApiError):
    """415: a file of a type KnowledgeOps does not parse."""


class ValidationFailed(ApiError):
    """422: a field is not valid; `fields` says which and why."""


class RateLimited(ApiError):
    """429: too many requests for this key, or too many jobs waiting; retried by the client up
    to its `max_retries`, honouring Retry-After, before this is raised."""


class ServiceUnavailable(ApiError):
    """503: the server is starting, stopping or cannot reach its database."""


class ServerError(ApiError):
    """Another 5xx: a fault of the server (its log has the reference in the message)."""


class ConnectionFailed(ClientError):
    """Nothing answered, or the connection broke before the answer came."""


class WaitTimeout(ClientError):
    """`wait()` gave up before the job ended; `job` is how it stood then."""

    def __init__(self, message: str, job: Any) -> None:
        super().__init__(message, code="wait_timeout")
        self.job = job


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: AuthenticationFailed,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    415: UnsupportedFileType,
    422: ValidationFailed,
    429: RateLimited,
    503: ServiceUnavailable,
}


def error_class(status: int) -> type[ApiError]:
    found = _BY_STATUS.get(status)
    if found is not None:
        return found
    return ServerError if status >= 500 else ApiError
