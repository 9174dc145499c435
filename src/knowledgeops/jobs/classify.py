"""Turning any exception a job raised into a classified `JobError`, in one place
(docs/architecture.md: Failure classes)."""

from __future__ import annotations

import errno
import logging
import secrets

from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from knowledgeops.errors import JobError, PermanentError, TransientError

log = logging.getLogger(__name__)

_TRANSIENT_ERRNOS = {errno.ENOSPC, errno.EAGAIN, errno.EMFILE, errno.ENFILE, errno.EIO}


def classify(exc: BaseException, *, job_id: str) -> JobError:
    """The category, code and public message for `exc`. Unknown errors are bugs: permanent,
    with a reference an operator can find in the log."""
    if isinstance(exc, JobError):
        return exc
    if isinstance(exc, OperationalError | PoolTimeoutError) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    ):
        return TransientError("the database was unavailable", code="database_unavailable")
    if isinstance(exc, TimeoutError | ConnectionError):
        return TransientError(f"a connection failed: {type(exc).__name__}", code="connection_error")
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return TransientError(f"a system resource ran out: {exc.strerror}", code="resource_busy")
    if isinstance(exc, MemoryError):
        return PermanentError(
            "the document needs more memory than the worker has", code="too_large"
        )
    reference = secrets.token_hex(4)
    log.error("job %s: unexpected error (reference %s)", job_id, reference, exc_info=exc)
    return PermanentError(
        f"internal error (reference {reference}); the operator can find it in the server log",
        code="internal_error",
    )
