"""The SDK (`knowledgeops.client`) against a real server (uvicorn on a port): every operation of
the OpenAPI spec reached through it, typed models and errors, uploads of paths, bytes and file
objects with an idempotency key per call, paging iterators, `wait` following the job stream
(and polling where no stream is to be had), the asynchronous twin, and retries that honour
Retry-After, against a real HTTP server scripted to refuse."""

from __future__ import annotations

import asyncio
import io
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from knowledgeops.client import (
    AsyncKnowledgeOps,
    AuthenticationFailed,
    Conflict,
    ConnectionFailed,
    KnowledgeOps,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ServiceUnavailable,
    UnsupportedFileType,
    ValidationFailed,
    WaitTimeout,
)
from knowledgeops.lab.devpg import free_port
from knowledgeops.roles.embedded import EmbeddedRole
from knowledgeops.schemas import DatasetPublic, JobPublic, SearchResults, UploadAccepted
from tests.fixtures.documents import make_text
from tests.fixtures.live import LiveServer, serve
from tests.fixtures.receiver import Receiver


@pytest.fixture
def live(make_runtime: Callable[..., EmbeddedRole]) -> Iterator[Callable[..., LiveServer]]:
    servers: list[Any] = []

    def make(**overrides: Any) -> LiveServer:
        overrides.setdefault("stream_poll_s", 0.05)
        context = serve(make_runtime(start=False, **overrides))
        servers.append(context)
        return context.__enter__()

    yield make
    for context in reversed(servers):
        context.__exit__(None, None, None)


class Recording(httpx.HTTPTransport):
    """A real transport that also notes each request's method and path."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, str, int]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        self.sent.append((request.method, request.url.path, response.status_code))
        return response


def operations(spec: dict[str, Any]) -> dict[tuple[str, str], re.Pattern[str]]:
    """(method, path template) → a pattern matching its concrete paths."""
    found = {}
    for template, methods in spec["paths"].items():
        pattern = re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", template) + "$")
        for method in methods:
            if method in {"get", "post", "put", "patch", "delete"}:
                found[(method.upper(), template)] = pattern
    return found


def text(tmp_path: Path, name: str, words: int = 300) -> Path:
    return make_text(
        tmp_path / name, " ".join(f"{name}-{i} ownership borrowing" for i in range(words))
    )


def test_every_operation_of_the_openapi_spec_is_reachable_from_the_sdk(  # noqa: PLR0915 (one walk)
    live: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = live(webhook_allow_private=True)
    spec = httpx.get(f"{server.url}/api/openapi.json").json()
    wanted = operations(spec)
    recording = Recording()
    receiver = Receiver().start()
    kops = KnowledgeOps(server.url, api_key=server.key, transport=recording)
    try:
        assert kops.health()["status"] == "ok"
        assert kops.ready()["ready"] is True
        assert [m.id for m in kops.models()]
        default = kops.find_dataset()
        assert isinstance(default, DatasetPublic)
        assert default.is_default
        made = kops.create_dataset("sdk", description="made by the SDK", chunk_size=64)
        assert kops.get_dataset(made.id).chunk_size == 64
        assert kops.update_dataset(made.id, description="changed").description == "changed"
        assert made.id in {d.id for d in kops.list_datasets().items}
        hook = kops.create_webhook(receiver.url, dataset_id=made.id)
        accepted = kops.upload(text(tmp_path, "a.txt"), dataset_id=made.id)
        assert isinstance(accepted, UploadAccepted)
        job = kops.wait(accepted.job_id, timeout=60)
        assert isinstance(job, JobPublic)
        assert job.status == "completed"
        changes = kops.follow_job(accepted.job_id)
        assert next(changes).status == "completed"  # the stream opens with the job as it is
        changes.close()
        stream = kops.follow(f"/datasets/{made.id}/events")
        assert next(stream).id is not None  # the opening: where the stream stands
        stream.close()
        document = kops.get_document(accepted.document_id)
        assert [d.id for d in kops.list_documents(made.id).items] == [document.id]
        chunks = list(kops.iter_chunks(document.id, page_size=2))
        assert len(chunks) == document.chunk_count > 2  # several pages, each chunk once
        assert [c.ordinal for c in chunks] == list(range(len(chunks)))
        assert kops.list_chunks(document.id, limit=1).has_more
        found = kops.search(made.id, "ownership borrowing", top_k=3, mode="keyword")
        assert isinstance(found, SearchResults)
        assert found.results[0].document_id == document.id
        reindexed = kops.reindex_document(document.id)
        assert kops.wait(reindexed.job_id, timeout=60).status == "completed"
        assert {j.id for j in kops.iter_jobs(dataset_id=made.id)} == {
            accepted.job_id,
            reindexed.job_id,
        }
        assert kops.list_jobs(document_id=document.id).total == 2
        with pytest.raises(Conflict):
            kops.cancel_job(accepted.job_id)  # ended: a typed refusal, from the endpoint
        broken = kops.upload(b"%PDF-1.7 broken", file_name="broken.pdf", dataset_id=made.id)
        assert kops.wait(broken.job_id, timeout=60).status == "failed"
        assert kops.retry_job(broken.job_id).status == "pending"
        (delivery, *_) = _eventually(lambda: kops.list_deliveries(hook.id).items)
        assert kops.get_webhook(hook.id).secret_hint
        assert [w.id for w in kops.list_webhooks().items] == [hook.id]
        _eventually(lambda: kops.list_deliveries(hook.id).items[-1].status == "completed")
        with pytest.raises(Conflict):
            kops.retry_delivery(hook.id, kops.list_deliveries(hook.id).items[-1].id)
        kops.delete_webhook(hook.id)
        kops.delete_document(document.id)
        kops.delete_dataset(made.id)
        with pytest.raises(NotFound):
            kops.get_dataset(made.id)
    finally:
        kops.close()
        receiver.stop()
    reached = {
        key
        for method, path, status in recording.sent
        for key, pattern in wanted.items()
        if key[0] == method and pattern.match(path) and status != 405
    }
    assert set(wanted) - reached == set(), "operations the SDK did not reach"
    assert delivery.event in {"job.completed", "job.failed"}


def _eventually(probe: Callable[[], Any], timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := probe()):
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.1)
    return value


def test_errors_are_typed_and_carry_the_apis_code(
    live: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = live(max_upload_mb=0.01)
    kops = server.client()
    with pytest.raises(NotFound) as missing:
        kops.get_job("00000000-0000-0000-0000-000000000000")
    assert (missing.value.status, missing.value.code) == (404, "job_not_found")
    with pytest.raises(ValidationFailed) as invalid:
        kops.create_dataset("x", chunk_size=1)
    assert invalid.value.fields
    assert invalid.value.fields[0]["field"].endswith("chunkSize")
    with pytest.raises(UnsupportedFileType) as refused:
        kops.upload(b"MZ\x90\x00 a program", file_name="tool.exe")
    assert refused.value.code
    assert "exe" in str(refused.value).lower()
    with pytest.raises(PayloadTooLarge) as large:
        kops.upload(b"x" * 20_000, file_name="big.txt")
    assert large.value.status == 413
    with pytest.raises(AuthenticationFailed) as unknown:
        KnowledgeOps(server.url, api_key="kops_" + "x" * 43).list_datasets()
    assert "api_key=" in str(unknown.value)
    with pytest.raises(ValueError, match="file_name"):
        kops.upload(b"bytes without a name")


def test_uploads_take_paths_bytes_and_file_objects_with_an_idempotency_key_per_call(
    live: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = live()
    kops = server.client()
    by_path = kops.upload(text(tmp_path, "path.txt"))
    by_bytes = kops.upload(b"bytes given directly " * 50, file_name="bytes.md")
    handle = io.BytesIO(b"prefix that is skipped|" + b"from a file object " * 50)
    handle.seek(len(b"prefix that is skipped|"))
    by_file = kops.upload(handle, file_name="file.txt", metadata={"team": "infra"})
    assert len({by_path.job_id, by_bytes.job_id, by_file.job_id}) == 3
    for accepted in (by_path, by_bytes, by_file):
        assert kops.wait(accepted.job_id, timeout=60).status == "completed"
    document = kops.get_document(by_file.document_id)
    assert (document.file_name, document.metadata) == ("file.txt", {"team": "infra"})
    assert "prefix" not in kops.list_chunks(document.id).items[0].text  # read from where it was
    first = kops.upload(b"the same key, twice " * 40, file_name="k.txt", idempotency_key="k-1")
    replay = kops.upload(b"the same key, twice " * 40, file_name="k.txt", idempotency_key="k-1")
    assert replay.job_id == first.job_id  # the server answered the key's first request again
    with pytest.raises(Conflict):
        kops.upload(b"other bytes, same key " * 40, file_name="k2.txt", idempotency_key="k-1")


def test_wait_sees_completion_within_a_second_of_the_database_change(
    live: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = live()
    kops = server.client()
    lags = []
    for n in range(5):
        accepted = kops.upload(text(tmp_path, f"w{n}.txt", 800))
        job = kops.wait(accepted.job_id, timeout=60)
        seen = datetime.now(UTC)
        assert job.status == "completed"
        assert job.finished_at is not None
        lags.append((seen - job.finished_at).total_seconds())
    print(f"wait: completion seen {max(lags) * 1000:.0f} ms at most after the database change")
    assert max(lags) < 1.0, lags


def test_wait_polls_where_no_stream_is_to_be_had_and_gives_up_at_its_timeout(
    live: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = live(max_streams_per_key=1)
    kops = server.client()
    held = kops.follow(f"/datasets/{kops.find_dataset().id}/events")
    next(held)  # this key's one stream, taken: wait gets 429 and reads the job instead
    accepted = kops.upload(text(tmp_path, "polled.txt"))
    assert kops.wait(accepted.job_id, timeout=60).status == "completed"
    with pytest.raises(NotFound):
        kops.wait("00000000-0000-0000-0000-000000000000", timeout=5)
    slow = kops.upload(text(tmp_path, "slow.txt", 20_000))  # takes longer than 0.2 s
    with pytest.raises(WaitTimeout) as timed_out:
        kops.wait(slow.job_id, timeout=0.2)
    assert timed_out.value.job is not None
    assert timed_out.value.job.id == slow.job_id
    held.close()


def test_the_async_client_does_the_same(live: Callable[..., LiveServer], tmp_path: Path) -> None:
    server = live()

    async def scenario() -> None:
        async with AsyncKnowledgeOps(server.url, api_key=server.key) as kops:
            dataset = await kops.find_dataset()
            accepted = await kops.upload(text(tmp_path, "async.txt"), dataset_id=dataset.id)
            other = await kops.upload(b"async bytes " * 60, file_name="async.md")
            job = await kops.wait(accepted.job_id, timeout=60)
            assert job.status == "completed"
            assert (await kops.wait(other.job_id, timeout=60)).status == "completed"
            documents = [d async for d in kops.iter_documents(dataset.id, page_size=1)]
            assert {d.id for d in documents} == {accepted.document_id, other.document_id}
            changes = kops.follow_job(accepted.job_id)
            assert (await anext(changes)).status == "completed"
            await changes.aclose()
            found = await kops.search(dataset.id, "ownership", mode="keyword")
            sync = server.client().search(dataset.id, "ownership", mode="keyword")
            assert found == sync
            with pytest.raises(NotFound):
                await kops.get_document("00000000-0000-0000-0000-000000000000")

    asyncio.run(scenario())


class Scripted:
    """A real HTTP server that answers each request with the next of `answers` (status,
    headers, body) and notes what it was sent."""

    def __init__(self, answers: list[tuple[int, dict[str, str], Any]]) -> None:
        self.answers = answers
        self.got: list[tuple[float, str, dict[str, str]]] = []
        self.port = free_port()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                self.rfile.read(length)
                owner.got.append((time.monotonic(), self.path, dict(self.headers.items())))
                status, headers, body = owner.answers.pop(0)
                data = json.dumps(body).encode()
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


ACCEPTED = {"jobId": "j", "documentId": "d", "status": "pending", "duplicate": False}
BUSY = {"error": "too many requests for this key", "code": "rate_limited"}


def test_429_and_503_are_sent_again_after_retry_after_with_the_same_idempotency_key() -> None:
    server = Scripted(
        [
            (429, {"Retry-After": "1"}, BUSY),
            (503, {"Retry-After": "0"}, {"error": "starting", "code": "not_ready"}),
            (202, {}, ACCEPTED),
        ]
    )
    try:
        kops = KnowledgeOps(server.url, api_key="kops_test")
        accepted = kops.upload(b"retried " * 10, file_name="r.txt")
        assert accepted.job_id == "j"
        (first, _, _), (second, _, _), (_, _, _last) = server.got
        assert second - first >= 0.95  # Retry-After: 1 was waited for
        keys = {headers["Idempotency-Key"] for _, _, headers in server.got}
        assert len(keys) == 1
        assert keys.pop().startswith("sdk-")
    finally:
        server.close()


def test_retries_are_bounded_and_a_wait_too_long_is_raised_at_once() -> None:
    server = Scripted(
        [(429, {"Retry-After": "0"}, BUSY)] * 3 + [(429, {"Retry-After": "3600"}, BUSY)]
    )
    try:
        kops = KnowledgeOps(server.url, api_key="kops_test", max_retries=2)
        with pytest.raises(RateLimited) as limited:
            kops.list_jobs()
        assert len(server.got) == 3  # the first try and two more
        assert limited.value.code == "rate_limited"
        started = time.monotonic()
        with pytest.raises(RateLimited) as long_wait:
            kops.list_jobs()
        assert time.monotonic() - started < 1  # an hour is not waited for
        assert long_wait.value.retry_after_s == 3600
    finally:
        server.close()
    with pytest.raises(ConnectionFailed, match="cannot reach KnowledgeOps"):
        KnowledgeOps(server.url, max_retries=1).health()


class OnceOnly(io.RawIOBase):
    """A file that can be read once, from where it stands, and not sought (a pipe)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), len(self.data))
        buffer[:n], self.data = self.data[:n], self.data[n:]
        return n


def test_what_cannot_be_sent_twice_is_not_sent_twice() -> None:
    server = Scripted(
        [
            (429, {"Retry-After": "0"}, BUSY),  # a pipe's upload: refused, not sent again
            (503, {"Retry-After": "0"}, {"error": "db down", "code": "not_ready"}),  # a create
            (503, {"Retry-After": "soon"}, {"error": "db down", "code": "not_ready"}),  # a read
            (200, {}, {"status": "ok"}),
        ]
    )
    try:
        kops = KnowledgeOps(server.url, api_key="kops_test")
        pipe = io.BufferedReader(OnceOnly(b"read once " * 100))
        with pytest.raises(RateLimited):
            kops.upload(pipe, file_name="pipe.txt")
        with pytest.raises(ServiceUnavailable):  # it may have been made before the 503
            kops.create_webhook("https://hooks.example.com/in")
        assert kops.health() == {"status": "ok"}  # a read: sent again (the odd wait ignored)
        assert [path for _, path, _ in server.got] == [
            "/docs/upload",
            "/webhooks",
            "/healthz",
            "/healthz",
        ]
    finally:
        server.close()
