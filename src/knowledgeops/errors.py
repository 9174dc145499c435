"""Every error KnowledgeOps raises on purpose.

    KopsError                      base: a message for a person and a machine code
    ├── RequestError               the caller's request cannot be served (HTTP status attached)
    │   ├── InvalidRequest         400 / 422
    │   ├── NotFound               404
    │   ├── Conflict               409
    │   ├── PayloadTooLarge        413
    │   ├── UnsupportedMediaType   415
    │   └── ServiceUnavailable     503
    └── JobError                   a job could not be done; carries its category (DESIGN.md §6)
        ├── TransientError         retried with backoff while attempts are left
        ├── PermanentError         failed at once; retrying the same input cannot help
        └── UserActionRequired     failed with a message that says what the user must do

Errors from lower layers (parsers, the database, the model) are translated into these in one place
each: the parser registry, the runner's classifier and the API's exception handler.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCategory(StrEnum):
    TRANSIENT = "transient"
    PERMANENT = "permanent"
    USER_ACTION_REQUIRED = "user_action_required"


class KopsError(Exception):
    """Something went wrong."""

    code = "error"

    def __init__(self, message: str | None = None, *, code: str | None = None) -> None:
        self.message = message or (self.__doc__ or "error").strip()
        if code:
            self.code = code
        super().__init__(self.message)


class RequestError(KopsError):
    """The request cannot be served."""

    status_code = 400


class InvalidRequest(RequestError):
    """The request is not valid."""

    code = "invalid_request"
    status_code = 400


class NotFound(RequestError):
    """Not found."""

    code = "not_found"
    status_code = 404


class Conflict(RequestError):
    """The request conflicts with the current state."""

    code = "conflict"
    status_code = 409


class Unauthorized(RequestError):
    """No valid API key came with the request."""

    code = "unauthorized"
    status_code = 401


class PayloadTooLarge(RequestError):
    """The upload is larger than this server accepts."""

    code = "payload_too_large"
    status_code = 413


class UnsupportedMediaType(RequestError):
    """This type of file cannot be parsed."""

    code = "unsupported_media_type"
    status_code = 415


class ServiceUnavailable(RequestError):
    """The service cannot take this request right now; try again shortly."""

    code = "service_unavailable"
    status_code = 503

    def __init__(
        self, message: str | None = None, *, code: str | None = None, retry_after_s: int = 5
    ) -> None:
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s


class TooManyRequests(RequestError):
    """The service is busy with earlier work; try again after `retry_after_s`."""

    code = "too_many_requests"
    status_code = 429

    def __init__(
        self, message: str | None = None, *, code: str | None = None, retry_after_s: int = 30
    ) -> None:
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s


class JobError(KopsError):
    """The job could not be done."""

    category = ErrorCategory.PERMANENT
    retryable = False

    def __init__(
        self,
        message: str | None = None,
        *,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s


class TransientError(JobError):
    """A temporary failure; the job will be tried again."""

    code = "transient_error"
    category = ErrorCategory.TRANSIENT
    retryable = True


class PermanentError(JobError):
    """The document cannot be processed; retrying the same file will not help."""

    code = "permanent_error"
    category = ErrorCategory.PERMANENT
    retryable = False


class UserActionRequired(JobError):
    """The document needs an action from you before it can be processed."""

    code = "user_action_required"
    category = ErrorCategory.USER_ACTION_REQUIRED
    retryable = True
