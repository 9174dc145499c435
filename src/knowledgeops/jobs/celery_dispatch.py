"""Celery as the scale-out broker, configured for at-least-once delivery with the database as the
truth (docs/architecture.md: Two topologies; Failure classes).

- `task_acks_late` + `task_reject_on_worker_lost`: a message is acknowledged only after the job
  ran, and a worker that dies mid-job gives its message back.
- `worker_prefetch_multiplier = 1`: a worker holds no more jobs than it runs.
- explicit soft/hard time limits; a Redis `visibility_timeout` longer than the hard limit, so Redis
  never hands a running job to a second worker while the first still works on it.
- short socket timeouts on the broker connection (Redis: socket timeouts; RabbitMQ: connect,
  read and write timeouts, and publisher confirms so that a publish counts only once the broker
  has it): a dead broker fails a publish in seconds, and the outbox keeps the row.
- results ignored: state lives in the database. Backoff is the database's `run_after`, never a
  Celery countdown.

The message is only the job id. This module knows nothing of what a job does: the worker wiring
registers the task that calls the shared `run_job`.
"""

from __future__ import annotations

import contextlib
import logging

from amqp.exceptions import ChannelError, NotFound
from celery import Celery
from kombu.connection import Connection

from knowledgeops.jobs.dispatch import PublishError
from knowledgeops.settings import HARD_LIMIT_GRACE_S

log = logging.getLogger(__name__)

TASK_NAME = "kops.run_job"
QUEUE = "kops.jobs"
SOCKET_TIMEOUT_S = 5.0  # s: broker connect/read timeout
SUPPORTED_SCHEMES = ("redis", "rediss", "amqp", "amqps", "pyamqp", "memory")


def make_celery(
    broker_url: str,
    *,
    job_time_limit_s: float,
    visibility_timeout_s: float,
    name: str = "knowledgeops",
) -> Celery:
    app = Celery(name, broker=broker_url, set_as_current=False)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        task_soft_time_limit=job_time_limit_s,
        task_time_limit=job_time_limit_s + HARD_LIMIT_GRACE_S,
        task_ignore_result=True,
        result_backend=None,
        task_default_queue=QUEUE,
        task_routes={TASK_NAME: {"queue": QUEUE}},
        task_serializer="json",
        accept_content=["json"],
        broker_transport_options=_transport_options(broker_url, visibility_timeout_s),
        broker_connection_timeout=SOCKET_TIMEOUT_S,
        broker_connection_retry_on_startup=True,
        broker_heartbeat=30,
        broker_pool_limit=4,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        worker_cancel_long_running_tasks_on_connection_loss=False,
        task_publish_retry=False,
    )
    return app


def _transport_options(broker_url: str, visibility_timeout_s: float) -> dict[str, object]:
    if scheme_of(broker_url) in ("amqp", "amqps", "pyamqp"):
        return {
            "confirm_publish": True,
            "connect_timeout": SOCKET_TIMEOUT_S,
            "read_timeout": SOCKET_TIMEOUT_S,
            "write_timeout": SOCKET_TIMEOUT_S,
        }
    return {
        "visibility_timeout": int(visibility_timeout_s),
        "socket_timeout": SOCKET_TIMEOUT_S,
        "socket_connect_timeout": SOCKET_TIMEOUT_S,
    }


def scheme_of(broker_url: str) -> str:
    return broker_url.split("://", 1)[0].lower() if "://" in broker_url else ""


def masked(broker_url: str) -> str:
    """The URL with any password replaced, for messages and logs."""
    return str(Connection(broker_url).as_uri(include_password=False))  # type: ignore[no-untyped-call]


def broker_status(broker_url: str, timeout_s: float = 1.0) -> str:
    """ "ok", or "unavailable: <why>" (for /readyz; the password never appears)."""
    try:
        with Connection(broker_url, connect_timeout=timeout_s) as conn:  # type: ignore[no-untyped-call]
            conn.ensure_connection(
                max_retries=1, interval_start=0, interval_step=0, timeout=timeout_s
            )
    except Exception as exc:
        return f"unavailable: {type(exc).__name__}"
    return "ok"


def check_broker(app: Celery, timeout_s: float = SOCKET_TIMEOUT_S) -> None:
    """Connect once; raises ConnectionError with a message naming the broker (password hidden)."""
    url = str(app.conf.broker_url)
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=timeout_s)
    except Exception as exc:
        raise ConnectionError(f"cannot reach the broker at {masked(url)}: {exc}") from None


def _queue_missing(exc: BaseException) -> bool:
    """A passive declare of a queue that does not exist: RabbitMQ answers 404 NOT_FOUND, and
    kombu's Redis transport raises the same channel error (an empty queue has no Redis key)."""

    return isinstance(exc, NotFound) or (isinstance(exc, ChannelError) and "NOT_FOUND" in str(exc))


class CeleryDispatcher:
    """Publishes job ids as `kops.run_job` tasks; any broker error is a PublishError."""

    def __init__(self, app: Celery, queues: dict[str, str] | None = None) -> None:
        self.app = app
        self.queues = queues or {}  # kind → its own queue (e.g. webhook deliveries)

    def publish(self, job_id: str, kind: str = "ingest") -> None:
        queue = self.queues.get(kind, QUEUE)
        try:
            self.app.send_task(TASK_NAME, args=[job_id], queue=queue, retry=False)
        except Exception as exc:
            raise PublishError(f"{type(exc).__name__}: {exc}") from exc

    def backlog(self) -> int | None:
        """Messages in the jobs queue and each kind's own (not counting those workers are
        running)."""
        total = 0
        try:
            with self.app.connection_for_read() as conn:
                conn.ensure_connection(max_retries=1, timeout=SOCKET_TIMEOUT_S)
                for queue in (QUEUE, *sorted(set(self.queues.values()) - {QUEUE})):
                    channel = conn.channel()  # a missing queue's error closes its channel
                    try:
                        declared = channel.queue_declare(queue=queue, passive=True)
                        total += int(declared.message_count)
                    except Exception as exc:
                        if not _queue_missing(exc):  # no queue yet: nothing waits in it
                            raise
                    finally:
                        with contextlib.suppress(Exception):
                            channel.close()
        except Exception as exc:
            log.debug("broker backlog unknown: %s", exc)  # the broker is down
            return None
        return total
