"""Every error KnowledgeOps raises on purpose, under one root.

    KopsError                      base: a message for a person and a machine code
    ├── RequestError               the caller's request cannot be served
    │   ├── InvalidRequest         malformed or invalid (400 / 422)
    │   ├── Unauthorized           no valid API key (401)
    │   ├── NotFound               no such thing, or not the caller's (404)
    │   ├── Conflict               conflicts with the current state (409)
    │   ├── PayloadTooLarge        over the upload limit (413)
    │   ├── UnsupportedMediaType   a type of file that cannot be parsed (415)
    │   ├── TooManyRequests        over a rate or the waiting jobs' limit (429, retry_after_s)
    │   └── ServiceUnavailable     not right now; try again shortly (503, retry_after_s)
    ├── JobError                   a job could not be done; carries its category (failure classes
    │   │                          in docs/architecture.md)
    │   ├── TransientError         retried with backoff while attempts are left
    │   ├── PermanentError         failed at once; retrying the same input cannot help
    │   └── UserActionRequired     failed with a message that says what the user must do
    ├── JobStateError              the job engine refused an operation or lost a job
    │   ├── InvalidTransition      the job's status does not allow this (409)
    │   ├── JobNotFound            no job has this id (404)
    │   ├── LeaseLost              the worker no longer holds this attempt (jobs/store.py)
    │   └── WorkerStopping         the worker is shutting down; the job goes back unspent
    ├── PublishError               the broker did not take a message; the outbox row stays
    ├── StartupError               the process cannot start; the message says what to fix
    │   ├── SettingsError          a KOPS_* setting is invalid
    │   ├── DataDirLocked          another process uses the data folder
    │   ├── IndexUnavailable       the index's tables or extension are missing (PgVectorMissing)
    │   └── ModelCheckFailed       the int8 model did not reach fp32's vectors
    ├── ClientError                KnowledgeOps could not be reached or refused (client.py)
    └── LabError                   the lab's own services failed (lab/: LocalPostgresError,
                                   TopologyError)

Errors from lower layers (parsers, the database, the model) are translated into these in one place
each: the parser registry, the runner's classifier and the API's exception handler. HTTP statuses
are the API's business: api/errors.py maps these classes to them, and nothing else does.
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


# --- the caller's request -----------------------------------------------------------------------
class RequestError(KopsError):
    """The request cannot be served."""


class InvalidRequest(RequestError):
    """The request is not valid."""

    code = "invalid_request"


class InvalidField(InvalidRequest):
    """A field of the request names something that is not there (a model, a filter field)."""

    code = "invalid_field"


class NotFound(RequestError):
    """Not found."""

    code = "not_found"


class Conflict(RequestError):
    """The request conflicts with the current state."""

    code = "conflict"


class Unauthorized(RequestError):
    """No valid API key came with the request."""

    code = "unauthorized"


class Forbidden(RequestError):
    """The caller is known but may not do this (a dashboard form without its CSRF token)."""

    code = "forbidden"


class PayloadTooLarge(RequestError):
    """The upload is larger than this server accepts."""

    code = "payload_too_large"


class UnsupportedMediaType(RequestError):
    """This type of file cannot be parsed."""

    code = "unsupported_media_type"


class _RetryLater(RequestError):
    default_retry_after_s = 5

    def __init__(
        self,
        message: str | None = None,
        *,
        code: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message, code=code)
        self.retry_after_s = self.default_retry_after_s if retry_after_s is None else retry_after_s


class ServiceUnavailable(_RetryLater):
    """The service cannot take this request right now; try again shortly."""

    code = "service_unavailable"
    default_retry_after_s = 5  # s


class TooManyRequests(_RetryLater):
    """The service is busy with earlier work; try again after `retry_after_s`."""

    code = "too_many_requests"
    default_retry_after_s = 30  # s


# --- a job's work -------------------------------------------------------------------------------
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


# --- the job engine ------------------------------------------------------------------------------
class JobStateError(KopsError):
    """The job engine could not do this to the job."""

    code = "job_state"


class InvalidTransition(JobStateError):
    """The job is not in a state that allows this."""

    code = "invalid_transition"


class JobNotFound(JobStateError, LookupError):
    """No job has this id."""

    code = "job_not_found"


class WorkerStopping(JobStateError):
    """The worker is shutting down; the job goes back to the queue without using an attempt."""

    code = "worker_stopping"


class PublishError(KopsError):
    """The broker did not take the message; the outbox row stays unpublished and is tried again."""

    code = "publish_failed"


# --- starting a process --------------------------------------------------------------------------
class StartupError(KopsError):
    """The process cannot start; the message says which setting to fix and how."""

    code = "startup"


class SettingsError(StartupError):
    """Settings are invalid; the message names each setting and what is wrong."""

    code = "invalid_settings"


class DataDirLocked(StartupError):
    """Another KnowledgeOps process is using this data folder."""

    code = "data_dir_locked"


class IndexUnavailable(StartupError):
    """The index's tables (or the database extension they need) are missing."""

    code = "index_unavailable"


class ModelCheckFailed(StartupError):
    """The int8 model's vectors are too far from the fp32 model's; it is not used."""

    code = "model_check_failed"


# --- around the product --------------------------------------------------------------------------
class ClientError(KopsError):
    """KnowledgeOps could not be reached or refused the request; the message says which."""

    code = "client_error"

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None):
        super().__init__(message, code=code)
        self.status = status  # the HTTP status of the refusal; None when nothing answered


class LabError(KopsError):
    """A service the lab started for a test or a benchmark failed."""

    code = "lab"
