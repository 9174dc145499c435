"""Event streams of job changes over real HTTP (uvicorn on a port, httpx reading the stream):
a job's stream and a dataset's, resumed with Last-Event-ID, scoped to the tenant, bounded per
key, kept alive by comments; on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from knowledgeops.errors import ClientError
from knowledgeops.events_wire import StreamEvent
from knowledgeops.roles.embedded import EmbeddedRole
from tests.conftest import wait_for
from tests.fixtures.documents import make_text
from tests.fixtures.live import LiveServer, error_of, serve

TERMINAL = {"completed", "failed", "cancelled"}


@pytest.fixture
def live(
    make_runtime: Callable[..., EmbeddedRole], database_url: str | None
) -> Iterator[Callable[..., LiveServer]]:
    """`live(**settings)`: a started server over a runtime with those settings."""
    servers: list[Any] = []

    def make(**overrides: Any) -> LiveServer:
        if database_url is not None:
            overrides.setdefault("database_url", database_url)
        overrides.setdefault("stream_poll_s", 0.05)
        runtime = make_runtime(start=False, **overrides)
        context = serve(runtime)
        servers.append(context)
        return context.__enter__()

    yield make
    for context in reversed(servers):
        context.__exit__(None, None, None)


def text_file(tmp_path: Path, name: str, words: int = 400) -> Path:
    body = " ".join(f"{name}-word{i}" for i in range(words))
    return make_text(tmp_path / f"{name}.txt", body)


def jobs_only(events: list[StreamEvent]) -> list[dict[str, Any]]:
    return [e.data for e in events if e.event == "job"]


def test_a_job_stream_shows_the_job_then_every_change_to_completion(
    live: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = live()
    client = server.client()
    accepted = client.upload(text_file(tmp_path, "alpha", 600))
    stream = server.stream(f"/docs/jobs/{accepted.job_id}/events")
    opening = stream.next()
    assert opening.data is None  # the opening: only where the stream begins
    assert opening.retry_ms == 2000
    events = stream.until(lambda e: e.event == "job" and e.data["status"] in TERMINAL)
    stream.close()
    changes = jobs_only(events)
    first, last = changes[0], changes[-1]
    assert first["jobId"] == accepted.job_id  # the job as it stood when the stream opened
    assert int(events[0].id or 0) == int(opening.id or 0)
    assert last["status"] == "completed"
    assert last["stage"] == "done"
    assert last["processedChunks"] == last["totalChunks"] > 0
    assert last["unit"] == "chunks"
    ids = [int(e.id or 0) for e in events]
    assert ids == sorted(ids)
    assert len(set(ids[1:])) == len(ids) - 1  # no change twice (the snapshot may share its id)
    embedding = [c for c in changes if c["stage"] == "embedding"]
    if embedding:  # counts only go up, and never past the total
        counts = [c["processedChunks"] for c in embedding]
        assert counts == sorted(counts)
        assert all(c["processedChunks"] <= (c["totalChunks"] or 0) for c in embedding)
    assert client.get_job(accepted.job_id).status == "completed"


def test_a_dataset_stream_follows_every_upload_of_its_dataset_and_no_other(
    live: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = live()
    client = server.client()
    dataset = client.find_dataset().id
    other = client.create_dataset("elsewhere").id
    stream = server.stream(f"/datasets/{dataset}/events")
    stream.next()  # opened: what follows is after it
    mine = {client.upload(text_file(tmp_path, f"doc{i}")).job_id for i in range(3)}
    theirs = client.upload(text_file(tmp_path, "other"), dataset_id=other).job_id
    done: dict[str, str] = {}

    def all_done(event: StreamEvent) -> bool:
        if event.event == "job" and event.data["status"] in TERMINAL:
            done[event.data["jobId"]] = event.data["status"]
        return set(done) >= mine

    events = stream.until(all_done, timeout=60)
    stream.close()
    assert done == dict.fromkeys(mine, "completed")
    seen = {c["jobId"] for c in jobs_only(events)}
    assert seen == mine
    assert theirs not in seen
    statuses = [c["status"] for c in jobs_only(events)]
    assert "pending" in statuses  # the uploads themselves are changes too


def test_a_stream_resumed_with_last_event_id_sends_exactly_what_came_after(
    live: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = live()
    client = server.client()
    job_id = client.upload(text_file(tmp_path, "resume", 500)).job_id
    first = server.stream(f"/docs/jobs/{job_id}/events")
    first.next()
    everything = first.until(lambda e: e.event == "job" and e.data["status"] in TERMINAL)
    first.close()
    changes = everything[1:]  # after the snapshot: the recorded changes
    assert len(changes) >= 2
    cut = changes[0]
    again = server.stream(f"/docs/jobs/{job_id}/events", last_event_id=cut.id)
    opening = again.next()
    assert opening.id == cut.id
    resumed = again.until(lambda e: e.event == "job" and e.data["status"] in TERMINAL)
    again.close()
    assert [(e.id, e.data) for e in resumed] == [(e.id, e.data) for e in changes[1:]]


def test_streams_are_scoped_to_the_tenant_and_need_a_key(
    live: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = live()
    client = server.client()
    job_id = client.upload(text_file(tmp_path, "private")).job_id
    dataset = client.find_dataset().id
    _, other_key = server.runtime.service.keys.create("tenant-b", "other")
    stranger = server.client(other_key)
    for path in (f"/docs/jobs/{job_id}/events", f"/datasets/{dataset}/events"):
        exc = error_of(lambda path=path: next(iter(stranger.follow(path))))
        assert exc.status == 404
        assert exc.code in {"job_not_found", "dataset_not_found"}
        response = httpx.get(server.url + path)
        assert response.status_code == 401
        assert "API key" in response.json()["error"]
    bad = httpx.get(
        f"{server.url}/datasets/{dataset}/events",
        headers={"Authorization": f"Bearer {server.key}", "Last-Event-ID": "yesterday"},
    )
    assert bad.status_code == 400
    assert bad.json()["code"] == "invalid_last_event_id"


def test_open_streams_are_bounded_per_key_and_a_closed_one_frees_its_place(
    live: Callable[..., LiveServer],
) -> None:
    server = live(max_streams_per_key=2)
    dataset = server.client().find_dataset().id
    path = f"/datasets/{dataset}/events"
    held = [server.stream(path) for _ in range(2)]
    for stream in held:
        stream.next()
    refused = httpx.get(server.url + path, headers={"Authorization": f"Bearer {server.key}"})
    assert refused.status_code == 429
    assert refused.json()["code"] == "too_many_streams"
    assert "KOPS_MAX_STREAMS_PER_KEY" in refused.json()["error"]
    assert refused.headers["Retry-After"] == "5"
    _, other_key = server.runtime.service.keys.create("default", "second key")
    server.stream(path, key=other_key).next()  # another key has its own places
    held[0].close()  # the place comes back when the server sees the connection go

    def reopened() -> bool:
        probe = server.stream(path)
        try:
            return probe.next().data is None
        except ClientError:
            return False
        finally:
            probe.close()

    wait_for(reopened, timeout=10, what="a place freed by the closed stream")


def test_an_idle_stream_gets_a_comment_line_as_its_heartbeat(
    live: Callable[..., LiveServer],
) -> None:
    server = live(stream_heartbeat_s=0.2)
    dataset = server.client().find_dataset().id
    headers = {"Authorization": f"Bearer {server.key}"}
    lines: list[str] = []
    with httpx.stream(
        "GET", f"{server.url}/datasets/{dataset}/events", headers=headers, timeout=10
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        for line in response.iter_lines():
            lines.append(line)
            if lines.count(": heartbeat") >= 2:
                break
    assert lines[0] == ": stream open"
    assert lines.count(": heartbeat") == 2
