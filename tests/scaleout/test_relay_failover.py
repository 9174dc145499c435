"""Two `kops relay` processes: one is active; kill -9 it and the other takes over within
seconds and publishes what is uploaded next."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from sqlalchemy import text

from knowledgeops.db.engine import Database
from knowledgeops.jobs.celery_dispatch import QUEUE
from knowledgeops.lab.topology import Proc, Topology
from tests.scaleout.conftest import write_corpus

pytestmark = [pytest.mark.postgres, pytest.mark.scaleout]
ACTIVE = "relay: active"


def wait_active(relays: list[Proc], timeout: float) -> Proc:
    deadline = time.monotonic() + timeout
    while True:
        active = [r for r in relays if r.alive() and ACTIVE in r.log()]
        if active:
            assert len(active) == 1, "two relays active at once"
            return active[0]
        if time.monotonic() > deadline:
            pytest.fail("no relay became active:\n" + "\n".join(r.log()[-2000:] for r in relays))
        time.sleep(0.1)


def test_the_standby_relay_takes_over_when_the_active_one_is_killed(
    make_topology: Callable[..., Topology],
    machine_redis: tuple[str, str],
    pgvector_db: Database,
    tmp_path: Path,
) -> None:
    broker_url, cache_url = machine_redis
    topology = make_topology(broker_url, cache_url)
    topology.migrate()
    topology.start_api()
    relays = [topology.start_relay(), topology.start_relay()]
    topology.wait_ready(models=0)
    first = wait_active(relays, timeout=60)
    (standby,) = [r for r in relays if r is not first]
    broker = redis.Redis.from_url(broker_url)
    files = write_corpus(tmp_path / "corpus", 2)

    def published(job_id: str) -> bool:
        with pgvector_db.read() as conn:
            return bool(
                conn.execute(
                    text(
                        "SELECT count(*) FROM outbox WHERE job_id = :j AND published_at IS NOT NULL"
                    ),
                    {"j": job_id},
                ).scalar_one()
            )

    with topology.client(30) as client:
        with files[0].open("rb") as handle:
            before = client.post("/docs/upload", files={"file": (files[0].name, handle)}).json()
        deadline = time.monotonic() + 30
        while not published(before["jobId"]):
            assert time.monotonic() < deadline, "the active relay did not publish"
            time.sleep(0.1)
        assert ACTIVE not in standby.log()

        first.kill()
        killed_at = time.monotonic()
        assert wait_active([standby], timeout=15) is standby
        takeover_s = time.monotonic() - killed_at

        with files[1].open("rb") as handle:
            after = client.post("/docs/upload", files={"file": (files[1].name, handle)}).json()
        deadline = time.monotonic() + 30
        while not published(after["jobId"]):
            assert time.monotonic() < deadline, "the new active relay did not publish"
            time.sleep(0.1)
    assert broker.llen(QUEUE) == 2  # both messages wait in the broker for a worker
    broker.close()
    print(f"\nrelay takeover after kill -9: {takeover_s:.2f} s")
