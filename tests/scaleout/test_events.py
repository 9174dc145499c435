"""Event streams in the scale-out topology: the API process streams changes that a worker
process on its own makes, read from PostgreSQL's record (nothing in-process carries them);
resumed with Last-Event-ID; another tenant's stream is 404."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from knowledgeops.lab.topology import Topology
from tests.fixtures.documents import make_text
from tests.fixtures.live import Stream

pytestmark = [pytest.mark.postgres, pytest.mark.scaleout]
TERMINAL = {"completed", "failed", "cancelled"}


def test_a_workers_changes_reach_the_api_processs_streams_and_resume(
    make_topology: Callable[..., Topology], machine_redis: tuple[str, str], tmp_path: Path
) -> None:
    topology = make_topology(*machine_redis, stream_poll_s=0.1)
    topology.migrate()
    topology.start(workers=1, concurrency=1)
    key = topology.api_key or ""
    with topology.client(60) as client:
        dataset = next(d["id"] for d in client.get("/datasets").json()["items"] if d["isDefault"])
        stream = Stream(f"{topology.url}/datasets/{dataset}/events", key).start()
        stream.next()  # open: what follows is after it
        jobs = set()
        for n in range(2):
            path = make_text(tmp_path / f"far{n}.txt", f"far away {n} " * 400)
            with path.open("rb") as handle:
                response = client.post("/docs/upload", files={"file": (path.name, handle)})
            assert response.status_code == 202, response.text
            jobs.add(response.json()["jobId"])
        ended: dict[str, str] = {}

        def all_ended(event: object) -> bool:
            data = getattr(event, "data", None)
            if isinstance(data, dict) and data["status"] in TERMINAL:
                ended[data["jobId"]] = data["status"]
            return set(ended) >= jobs

        events = stream.until(all_ended, timeout=180)
        stream.close()
        assert ended == dict.fromkeys(jobs, "completed")
        changes = [e for e in events if e.event == "job"]
        stages = {e.data["stage"] for e in changes}
        assert {"queued", "done"} <= stages  # the upload (API) and the end (the worker)
        assert any(e.data["status"] == "running" for e in changes)  # made by the worker
        ids = [int(e.id or 0) for e in changes]
        assert ids == sorted(ids)
        assert len(set(ids)) == len(ids)

        one = next(iter(jobs))
        mine = [e for e in changes if e.data["jobId"] == one]
        again = Stream(
            f"{topology.url}/docs/jobs/{one}/events", key, last_event_id=mine[0].id
        ).start()
        assert again.next().id == mine[0].id
        resumed = again.until(lambda e: e.event == "job" and e.data["status"] in TERMINAL)
        again.close()
        assert [(e.id, e.data) for e in resumed] == [(e.id, e.data) for e in mine[1:]]

        made = topology.run("keys", "create", "--tenant", "elsewhere", "--name", "other")
        assert made.returncode == 0, made.stderr
        stranger = {"Authorization": f"Bearer {made.stdout.strip()}"}
        for path in (f"/docs/jobs/{one}/events", f"/datasets/{dataset}/events"):
            response = httpx.get(topology.url + path, headers=stranger, timeout=30)
            assert response.status_code == 404, response.text
