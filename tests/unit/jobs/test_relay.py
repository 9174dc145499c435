from __future__ import annotations

import threading

import pytest

from knowledgeops.jobs.inprocess import InProcessQueue
from knowledgeops.jobs.memory_store import MemoryJobStore
from knowledgeops.jobs.relay import Relay
from knowledgeops.jobs.retry import RetryPolicy
from knowledgeops.jobs.states import JobStatus
from knowledgeops.jobs.worker_pool import WorkerPool

from .helpers import Clock, add_job, counting_handler, make_runner


class FlakyBroker:
    """A real in-process queue behind a switch that makes publishing fail, like a broker down."""

    def __init__(self) -> None:
        self.queue = InProcessQueue()
        self.down = False
        self.published: list[str] = []

    def publish(self, job_id: str, kind: str = "ingest") -> None:
        if self.down:
            raise ConnectionError("broker unreachable")
        self.published.append(job_id)
        self.queue.publish(job_id)

    def backlog(self) -> int | None:
        return None if self.down else self.queue.backlog()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store() -> MemoryJobStore:
    return MemoryJobStore()


def make_relay(store: MemoryJobStore, broker: FlakyBroker, clock: Clock) -> Relay:
    return Relay(
        store,
        broker,
        policy=RetryPolicy(base_s=1.0, cap_s=10.0),
        stale_after_s=30,
        republish_after_s=300,
        interval_s=0.05,
        clock=clock,
    )


def test_new_jobs_are_published_once(store: MemoryJobStore, clock: Clock) -> None:
    broker = FlakyBroker()
    relay = make_relay(store, broker, clock)
    jobs = [add_job(store, clock) for _ in range(3)]
    assert relay.run_once().published == 3
    assert broker.published == [job.id for job in jobs]
    assert relay.run_once().published == 0
    assert store.outbox_backlog(now=clock()) == (0, 0.0)


def test_a_broker_outage_loses_nothing(store: MemoryJobStore, clock: Clock) -> None:
    broker = FlakyBroker()
    relay = make_relay(store, broker, clock)
    broker.down = True
    job = add_job(store, clock)
    result = relay.run_once()
    assert (result.published, result.publish_failed) == (0, 1)
    clock.advance(60)
    assert store.outbox_backlog(now=clock()) == (1, 60.0)
    broker.down = False
    assert relay.run_once().published == 1
    assert broker.published == [job.id]


def test_stale_running_jobs_are_rescued_and_offered_again(
    store: MemoryJobStore, clock: Clock
) -> None:
    broker = FlakyBroker()
    relay = make_relay(store, broker, clock)
    job = add_job(store, clock)
    relay.run_once()
    assert store.claim(job.id, "crashed-worker", now=clock()) is not None
    clock.advance(29)
    assert relay.run_once().rescued == 0  # heartbeat not stale yet
    clock.advance(2)
    assert relay.run_once().rescued == 1
    rescued = store.get(job.id)
    assert rescued is not None
    assert (rescued.status, rescued.error_code) == (JobStatus.RETRYING, "worker_lost")
    assert rescued.run_after is not None
    clock.advance(11)  # past the backoff
    relay.run_once()
    assert broker.published == [job.id, job.id]


def test_backlog_is_not_failure_but_forgotten_jobs_are_offered_again(
    store: MemoryJobStore, clock: Clock
) -> None:
    broker = FlakyBroker()
    relay = make_relay(store, broker, clock)
    job = add_job(store, clock)
    relay.run_once()
    assert broker.queue.get(timeout=0.1) == job.id  # delivered, then lost before any claim
    clock.advance(299)
    assert relay.run_once().requeued == 0
    clock.advance(2)
    result = relay.run_once()
    assert (result.requeued, result.published) == (1, 1)
    assert broker.published == [job.id, job.id]


def test_recovery_after_a_restart(store: MemoryJobStore, clock: Clock) -> None:
    broker = FlakyBroker()
    relay = make_relay(store, broker, clock)
    orphan, waiting = add_job(store, clock), add_job(store, clock)
    relay.run_once()
    assert store.claim(orphan.id, "dead-process", now=clock()) is not None
    fresh_broker = FlakyBroker()  # the new process has an empty queue
    restarted = make_relay(store, fresh_broker, clock)
    result = restarted.recover_after_restart()
    assert (result.rescued, result.requeued) == (1, 1)
    assert fresh_broker.published == [waiting.id]
    got = store.get(orphan.id)
    assert got is not None
    assert got.status is JobStatus.RETRYING


def test_relay_and_workers_run_every_job_once(store: MemoryJobStore, clock: Clock) -> None:
    broker = FlakyBroker()
    relay = make_relay(store, broker, clock)
    runner = make_runner(store, counting_handler(), clock)
    pool = WorkerPool(broker.queue, runner, size=3)
    jobs = [add_job(store, clock) for _ in range(20)]
    pool.start()
    relay.start()
    done = threading.Event()

    def all_completed() -> bool:
        return all(store.get(j.id).status is JobStatus.COMPLETED for j in jobs)  # type: ignore[union-attr]

    for _ in range(200):
        if all_completed():
            done.set()
            break
        relay.wake()
        threading.Event().wait(0.02)
    relay.stop()
    pool.stop()
    assert done.is_set()
    assert {store.get(j.id).attempt for j in jobs} == {1}  # type: ignore[union-attr]


def test_in_process_queue_drops_ids_already_waiting() -> None:
    queue = InProcessQueue()
    queue.publish("a")
    queue.publish("a")
    queue.publish("b")
    assert len(queue) == 2
    assert queue.get(0.1) == "a"
    queue.publish("a")  # taken out already: may be queued again
    assert [queue.get(0.1), queue.get(0.1), queue.get(0.01)] == ["b", "a", None]


def test_waking_the_queue_releases_a_blocked_worker_at_once() -> None:
    queue = InProcessQueue()
    got: list[str | None] = ["unset"]
    thread = threading.Thread(target=lambda: got.__setitem__(0, queue.get(timeout=30)))
    thread.start()
    queue.wake(1)
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert got == [None]


def test_unclaimed_jobs_wait_longer_for_a_new_copy_while_the_broker_queue_is_busy(
    store: MemoryJobStore, clock: Clock
) -> None:
    """While messages wait in the broker an unclaimed job's message may be among them; copies
    would only pile up, so it waits ten times as long. An empty queue with a job still
    unclaimed means its message was lost: it is published again after the normal wait."""
    broker = FlakyBroker()
    relay = make_relay(store, broker, clock)
    busy, lost = add_job(store, clock), add_job(store, clock)
    assert relay.run_once().published == 2
    assert broker.queue.get(timeout=0.1) == busy.id  # taken by a worker that died unclaimed
    clock.advance(301)
    assert relay.run_once().requeued == 0  # `lost`'s message still waits in the queue
    clock.advance(300 * 9)
    result = relay.run_once()  # ten times as long: both get a new copy anyway
    assert (result.requeued, result.published) == (2, 2)
    while broker.queue.get(timeout=0.1) is not None:  # now the queue empties
        pass
    clock.advance(301)
    assert relay.run_once().requeued == 2  # empty queue, still unclaimed: the normal wait
    assert broker.published.count(busy.id) == broker.published.count(lost.id) == 3
