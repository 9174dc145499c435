"""One contract for every Dispatcher: the in-process queue, and Celery over Redis and over
RabbitMQ (real brokers). A published job id reaches a consumer, only the id travels, and
messages published before anyone listens wait for a consumer.

The Celery side is read the way a Celery worker reads it: from the `kops.jobs` queue, checking
the task name and arguments in the message.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from kombu import Connection

from knowledgeops.errors import PublishError
from knowledgeops.jobs.celery_dispatch import QUEUE, TASK_NAME, CeleryDispatcher, make_celery
from knowledgeops.jobs.inprocess import InProcessQueue
from tests.conftest import unavailable

REDIS_URL = "redis://127.0.0.1:6379/13"  # the tests' own database number
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"


@dataclass
class Harness:
    publish: Callable[[str], None]
    receive: Callable[[float], str | None]
    backlog: Callable[[], int | None]


def _celery(url: str) -> Iterator[Harness]:
    app = make_celery(url, job_time_limit_s=60, visibility_timeout_s=300)
    dispatcher = CeleryDispatcher(app)
    try:
        conn = Connection(url, connect_timeout=3)
        conn.ensure_connection(max_retries=1)
    except Exception as exc:
        unavailable(f"broker {url.rsplit('@', maxsplit=1)[-1]} is not reachable: {exc}")
    queue = conn.SimpleQueue(QUEUE)
    queue.clear()

    def receive(timeout: float) -> str | None:
        try:
            message = queue.get(block=True, timeout=timeout)
        except queue.Empty:
            return None
        message.ack()
        assert message.headers["task"] == TASK_NAME
        args, kwargs, _embed = message.payload
        assert kwargs == {}  # the id is all that travels: no credential, no document data
        (job_id,) = args
        return str(job_id)

    yield Harness(dispatcher.publish, receive, dispatcher.backlog)
    queue.clear()
    queue.close()
    conn.release()


@pytest.fixture(params=["inprocess", "celery-redis", "celery-rabbitmq"])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    if request.param == "inprocess":
        queue = InProcessQueue()
        yield Harness(queue.publish, queue.get, queue.backlog)
    elif request.param == "celery-redis":
        yield from _celery(REDIS_URL)
    else:
        yield from _celery(AMQP_URL)


def test_a_published_job_id_is_delivered(harness: Harness) -> None:
    job_id = str(uuid.uuid4())
    harness.publish(job_id)
    assert harness.receive(10) == job_id
    assert harness.receive(0.2) is None


def test_messages_published_before_anyone_listens_are_all_delivered(harness: Harness) -> None:
    job_ids = {str(uuid.uuid4()) for _ in range(25)}
    for job_id in sorted(job_ids):
        harness.publish(job_id)
    received = set()
    deadline = time.monotonic() + 20
    while received != job_ids and time.monotonic() < deadline:
        got = harness.receive(2)
        if got is not None:
            received.add(got)
    assert received == job_ids


def test_the_backlog_counts_messages_waiting_for_a_worker(harness: Harness) -> None:
    """The relay re-publishes unclaimed jobs only when nothing waits in the broker."""

    def settles_at(expected: int) -> bool:
        deadline = time.monotonic() + 10
        while harness.backlog() != expected:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    assert settles_at(0)
    for _ in range(3):
        harness.publish(str(uuid.uuid4()))
    assert settles_at(3)
    for _ in range(3):
        assert harness.receive(10) is not None
    assert settles_at(0)


def test_an_unreachable_broker_has_no_known_backlog() -> None:
    app = make_celery("redis://127.0.0.1:1/0", job_time_limit_s=60, visibility_timeout_s=300)
    assert CeleryDispatcher(app).backlog() is None


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:1/0", "amqp://guest:guest@127.0.0.1:1//"], ids=["redis", "amqp"]
)
def test_an_unreachable_broker_fails_the_publish_quickly(url: str) -> None:
    """The relay keeps the outbox row and tries again; it must not hang on a dead broker."""
    dispatcher = CeleryDispatcher(make_celery(url, job_time_limit_s=60, visibility_timeout_s=300))
    started = time.monotonic()
    with pytest.raises(PublishError):
        dispatcher.publish(str(uuid.uuid4()))
    assert time.monotonic() - started < 15


def test_celery_is_configured_for_at_least_once_with_the_database_as_truth() -> None:
    app = make_celery(REDIS_URL, job_time_limit_s=600, visibility_timeout_s=1800)
    conf = app.conf
    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is True
    assert conf.worker_prefetch_multiplier == 1
    assert conf.task_ignore_result is True
    assert conf.task_soft_time_limit == 600
    assert conf.task_time_limit > conf.task_soft_time_limit
    assert conf.broker_transport_options["visibility_timeout"] > conf.task_time_limit
    assert conf.broker_transport_options["socket_timeout"] <= 10


def test_rabbitmq_gets_its_own_timeouts_and_publisher_confirms() -> None:
    """py-amqp ignores Redis' socket options: RabbitMQ needs read/write timeouts and confirms
    (a publish counts only once the broker has the message)."""
    options = make_celery(AMQP_URL, job_time_limit_s=60, visibility_timeout_s=300).conf[
        "broker_transport_options"
    ]
    assert options["confirm_publish"] is True
    assert options["read_timeout"] <= 10
    assert options["write_timeout"] <= 10
    assert "visibility_timeout" not in options
