"""The handler of `webhook` jobs: one attempt at delivering one event.

The stored body is signed (HMAC-SHA256 of `timestamp.body`, the Kops-Signature header) and
POSTed to the address the guard checked, redirects not followed. Each attempt is recorded with
what the receiver answered. The answer decides the rest, through the jobs core's retries:
2xx delivered; a timeout, a connection error, 408, 429 (its Retry-After honoured) or a 5xx is
transient; any other answer is permanent, and so is a URL the guard refuses
(docs/architecture.md: Webhooks).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NoReturn

import httpx
from sqlalchemy import insert, select, update

from knowledgeops.client.calls import retry_after
from knowledgeops.client.signatures import (
    EVENT_ID_HEADER,
    EVENT_TYPE_HEADER,
    SIGNATURE_HEADER,
    sign,
)
from knowledgeops.clock import Clock
from knowledgeops.db.engine import Database, Tx
from knowledgeops.db.schema import webhook_attempts, webhook_deliveries, webhooks
from knowledgeops.errors import PermanentError, TransientError, UserActionRequired
from knowledgeops.jobs.runner import JobContext
from knowledgeops.webhooks import guard

log = logging.getLogger(__name__)

USER_AGENT = "KnowledgeOps-Webhooks/1"
RETRIED = frozenset({408, 429, *range(500, 600)})  # answers that say "later"
ATTEMPT_HEADER = "Kops-Delivery-Attempt"


@dataclass(frozen=True, slots=True)
class Attempt:
    status_code: int | None
    error: str | None
    duration_ms: int


class Deadline:
    """The whole attempt's limit: httpx's timeouts bound each read, so a receiver that trickles
    its answer a byte at a time could hold a delivery worker for ever. When the time is up the
    attempt's socket (caught from httpcore's trace as it connects) is shut down, which ends the
    blocked read at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self._socket: socket.socket | None = None
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def trace(self, event: str, info: dict[str, Any]) -> None:
        if event == "connection.connect_tcp.complete":
            stream = info.get("return_value")
            if stream is not None:
                self._socket = stream.get_extra_info("socket")

    def __enter__(self) -> Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def _expire(self) -> None:
        self.expired = True
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.shutdown(socket.SHUT_RDWR)


@dataclass(eq=False)
class Deliverer:
    db: Database
    clock: Clock
    allow_private: bool = False
    timeout_s: float = 10.0  # the whole attempt: connect, send, the receiver's answer
    _http: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self._http = httpx.Client(
            timeout=self.timeout_s,
            follow_redirects=False,
            # a new connection per attempt (the deadline watches its socket), and none through
            # a proxy from the environment: the connection goes to the address the guard checked
            limits=httpx.Limits(max_keepalive_connections=0),
            trust_env=False,
            headers={"User-Agent": USER_AGENT},
        )

    def close(self) -> None:
        self._http.close()

    def __call__(self, ctx: JobContext) -> None:
        with self.db.read() as conn:
            row = conn.execute(
                select(
                    webhook_deliveries.c.id,
                    webhook_deliveries.c.event,
                    webhook_deliveries.c.body,
                    webhook_deliveries.c.delivered_at,
                    webhooks.c.url,
                    webhooks.c.secret,
                )
                .join(webhooks, webhooks.c.id == webhook_deliveries.c.webhook_id)
                .where(webhook_deliveries.c.job_id == ctx.job.id)
            ).first()
        if row is None or row.delivered_at is not None:
            return  # the webhook was deleted, or an earlier attempt got through
        try:
            target = guard.resolve(row.url, allow_private=self.allow_private)
        except guard.UrlRefused as exc:
            self._record(ctx, row.id, Attempt(None, str(exc), 0))
            raise UserActionRequired(str(exc), code="webhook_url_refused") from None
        except OSError as exc:
            message = f"cannot resolve the receiver's host: {exc}"
            self._record(ctx, row.id, Attempt(None, message, 0))
            raise TransientError(message, code="webhook_unreachable") from None
        self._send(ctx, row.id, row.event, row.body.encode(), row.secret, target)

    def _send(
        self,
        ctx: JobContext,
        delivery_id: str,
        event: str,
        body: bytes,
        secret: str,
        target: guard.Target,
    ) -> None:
        timestamp = int(self.clock().timestamp())
        url = httpx.URL(target.url)  # its host IDNA-encoded, as the Host header and TLS need
        headers = {
            "Host": url.netloc.decode("ascii"),
            "Content-Type": "application/json",
            EVENT_ID_HEADER: delivery_id,
            EVENT_TYPE_HEADER: event,
            ATTEMPT_HEADER: str(ctx.lease.attempt),
            SIGNATURE_HEADER: sign(secret, body, timestamp),
        }
        deadline = Deadline(self.timeout_s)
        extensions: dict[str, Any] = {"trace": deadline.trace}
        if url.scheme == "https":
            extensions["sni_hostname"] = url.raw_host.decode("ascii")
        started = time.monotonic()
        try:
            with (
                deadline,
                self._http.stream(
                    "POST", target.pinned_url, content=body, headers=headers, extensions=extensions
                ) as response,
            ):  # the body is not read: a receiver's answer is its status
                status = response.status_code
                location = response.headers.get("Location")
                wait = retry_after(response) if status in RETRIED else None
        except httpx.TransportError as exc:
            if deadline.expired or isinstance(exc, httpx.TimeoutException):
                self._fail(ctx, delivery_id, started, f"no answer within {self.timeout_s:g} s")
            self._fail(ctx, delivery_id, started, f"{type(exc).__name__}: {exc or 'no detail'}")
        spent = int((time.monotonic() - started) * 1000)
        if 200 <= status < 300:
            self._record(ctx, delivery_id, Attempt(status, None, spent), delivered=self.clock())
            return
        error = f"the receiver answered HTTP {status}"
        if 300 <= status < 400:
            error += f" (a redirect to {location}; redirects are not followed: use the final URL)"
        self._record(ctx, delivery_id, Attempt(status, error, spent))
        if status in RETRIED:
            raise TransientError(error, code="webhook_unavailable", retry_after_s=wait)
        raise PermanentError(error, code="webhook_refused")

    def _fail(self, ctx: JobContext, delivery_id: str, started: float, error: str) -> NoReturn:
        spent = int((time.monotonic() - started) * 1000)
        self._record(ctx, delivery_id, Attempt(None, error, spent))
        raise TransientError(
            f"the receiver could not be reached: {error}", code="webhook_unreachable"
        )

    def _record(
        self,
        ctx: JobContext,
        delivery_id: str,
        attempt: Attempt,
        *,
        delivered: datetime | None = None,
    ) -> None:
        """The attempt, with the job's heartbeat (fenced: a cancelled delivery writes nothing).
        Written even while the worker stops: the request was sent, and what came back must not
        be lost (a delivered event sent again, a refusal tried again)."""

        def write(tx: Tx) -> None:
            tx.execute(
                insert(webhook_attempts).values(
                    delivery_id=delivery_id,
                    attempt=ctx.lease.attempt,
                    at=self.clock(),
                    status_code=attempt.status_code,
                    error=attempt.error,
                    duration_ms=attempt.duration_ms,
                )
            )
            if delivered is not None:
                tx.execute(
                    update(webhook_deliveries)
                    .where(webhook_deliveries.c.id == delivery_id)
                    .values(delivered_at=delivered)
                )

        ctx.store.report(ctx.lease, now=self.clock(), work=write)
