"""Webhooks in the scale-out topology: the relay publishes each delivery to its own Celery
queue (kops.webhooks), so a worker started with `--lanes webhooks` runs every delivery and a
`--lanes jobs` worker none; the events reach a real receiver, signed, once each."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from knowledgeops.client import verify_signature
from knowledgeops.lab.topology import Topology
from tests.conftest import wait_for
from tests.fixtures.documents import make_text
from tests.fixtures.receiver import Receiver

pytestmark = [pytest.mark.postgres, pytest.mark.scaleout]
STARTED = re.compile(r"job (\S+): attempt \d+ started by")


def test_deliveries_run_in_their_own_lane_and_reach_the_receiver_once_each(
    make_topology: Callable[..., Topology], machine_redis: tuple[str, str], tmp_path: Path
) -> None:
    receiver = Receiver().start()
    topology = make_topology(*machine_redis, webhook_allow_private=True)
    topology.migrate()
    topology.start_api()
    topology.start_relay()
    ingest = topology.start_worker(lanes="jobs")
    deliver = topology.start_worker(lanes="webhooks")
    topology.wait_ready(models=2)
    try:
        with topology.client(60) as client:
            made = client.post("/webhooks", json={"url": receiver.url})
            assert made.status_code == 201, made.text
            secret = made.json()["secret"]
            jobs = set()
            for n in range(3):
                path = make_text(tmp_path / f"lane{n}.txt", f"lanes of work {n} " * 300)
                with path.open("rb") as handle:
                    response = client.post("/docs/upload", files={"file": (path.name, handle)})
                assert response.status_code == 202, response.text
                jobs.add(response.json()["jobId"])
            got = wait_for(
                lambda: len(receiver.received()) >= 3 and receiver.received(),
                timeout=180,
                what="three deliveries",
            )
        assert {r.json["data"]["job"]["id"] for r in got} == jobs
        assert len({r.event_id for r in got}) == 3
        assert all(r.json["type"] == "job.completed" for r in got)
        for request in got:
            verify_signature(secret, request.body, request.headers)
        ran_ingest = set(STARTED.findall(ingest.log()))
        ran_delivery = set(STARTED.findall(deliver.log()))
        assert ran_ingest == jobs  # the documents, on the jobs lane
        assert len(ran_delivery) == 3  # the deliveries, on theirs
        assert not ran_ingest & ran_delivery
    finally:
        receiver.stop()
