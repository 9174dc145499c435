"""What a receiver that is away costs: nothing lost, nothing doubled, nothing held up. A real
HTTP receiver is down for 60 s (its port closed) while documents are ingested; they complete
meanwhile, and once it is back every event arrives, each exactly once after dedupe by event id.
A receiver that hangs (accepts, never answers) holds no ingest worker either: deliveries run
in a lane of their own. (SQLite: the engines' webhook behaviour is the same, and tested in
test_webhooks.py on both; this one takes a minute.)"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from tests.api.test_webhooks import deliveries, ended, subscribe, upload
from tests.conftest import wait_for
from tests.fixtures.receiver import Receiver

DOWN_S = 60.0


@pytest.fixture
def database_url() -> None:
    return None  # the embedded SQLite file only (see the module's docstring)


def test_a_receiver_down_for_60_s_gets_every_event_once_and_ingest_never_waits(
    make_client: Callable[..., TestClient],
) -> None:
    client = make_client(
        webhook_allow_private=True,
        backoff_base_s=0.5,
        backoff_max_s=4.0,  # a retry at most every 4 s while it is away
        webhook_max_attempts=100,
    )
    receiver = Receiver()  # its port is chosen, and closed: connections are refused
    made = subscribe(client, receiver.url, events=["job.completed", "job.failed"])
    went_down = time.monotonic()
    jobs = [upload(client, f"doc{i}.txt", f"document {i} ".encode() * 400) for i in range(8)]
    jobs.append(upload(client, "broken.pdf", b"%PDF-1.7 not a pdf"))
    for job_id in jobs:
        ended(client, job_id)
    ingested_in = time.monotonic() - went_down
    assert ingested_in < 30, f"ingest took {ingested_in:.1f} s with the receiver down"
    attempted = deliveries(client, made["id"])
    assert len(attempted) == len(jobs)
    assert all(d["status"] in {"pending", "running", "retrying"} for d in attempted)
    assert any(d["attempts"] for d in attempted)  # tried, and refused, while it was down
    time.sleep(max(0.0, DOWN_S - (time.monotonic() - went_down)))
    receiver.start()
    try:
        wait_for(
            lambda: all(d["status"] == "completed" for d in deliveries(client, made["id"])),
            timeout=30,
            what="every delivery done after the receiver came back",
        )
        got = receiver.received()
        unique = {r.event_id: r for r in got}  # what a receiver keeps after dedupe
        assert len(unique) == len(jobs)
        assert sorted(r.json["data"]["job"]["id"] for r in unique.values()) == sorted(jobs)
        types = sorted(r.json["type"] for r in unique.values())
        assert types == ["job.completed"] * 8 + ["job.failed"]
        assert len(got) - len(unique) <= 1  # a duplicate only from an attempt cut mid-answer
    finally:
        receiver.stop()


def test_a_receiver_that_never_answers_holds_no_ingest_worker(
    make_client: Callable[..., TestClient],
) -> None:
    client = make_client(
        webhook_allow_private=True, webhook_timeout_s=3.0, webhook_max_attempts=3, workers=2
    )
    receiver = Receiver(hang_s=60.0).start()  # accepts, reads, answers after a minute
    try:
        made = subscribe(client, receiver.url)
        first = [upload(client, f"a{i}.txt", f"first {i} ".encode() * 300) for i in range(4)]
        for job_id in first:
            ended(client, job_id)
        wait_for(lambda: len(receiver.received()) >= 2, what="deliveries hanging")
        started = time.monotonic()
        second = [upload(client, f"b{i}.txt", f"second {i} ".encode() * 300) for i in range(4)]
        for job_id in second:
            ended(client, job_id)
        spent = time.monotonic() - started
        # with the deliveries on the ingest workers, two would hang 3 s per attempt each
        assert spent < 3.0, f"ingest waited {spent:.1f} s behind hanging deliveries"
        wait_for(
            lambda: any(
                "no answer within 3 s" in (a["error"] or "")
                for d in deliveries(client, made["id"])
                for a in d["attempts"]
            ),
            what="an attempt recorded as timed out",
        )
    finally:
        receiver.hang_s = 0.0
        receiver.stop()
