"""`kops bench live`: what live progress and the dashboard cost, on `kops serve` (null embedder:
the subject is the API process, not the model).

1. upload accept latency (open loop) with no stream open;
2. STREAMS event streams opened on a quiet dataset (raw sockets, read by one thread, as
   dashboards left open): the server's RSS before and after, and the accept latency again;
3. the same streams on the dataset the uploads go to, so every upload's changes go out to all
   of them (the worst case): accept latency, and how long a change takes from the database to a
   stream (the change's `at` to its arrival, same clock);
3. DOCUMENTS documents in one dataset, then the dashboard's pages timed (signed in by cookie):
   the documents page (first page, last page, a status filter), the datasets page, a
   document's chunks, the deployment page.
"""

from __future__ import annotations

import json
import re
import selectors
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from knowledgeops.lab.bench.endtoend import (
    AcceptFigures,
    EmbeddedServer,
    accept_latency,
    connect,
    percentile,
)

FILLER = "Live progress probe: the event streams follow the record of job changes. " * 40


@dataclass
class LiveFigures:
    streams: int
    rss_before_mb: float
    rss_with_streams_mb: float
    stream_cost_mb: float  # target < 50 MB for 200 streams
    accept_without_streams: AcceptFigures
    accept_with_idle_streams: AcceptFigures  # target p99 <= 50 ms
    accept_with_busy_streams: AcceptFigures  # every upload's changes to every stream
    rss_after_busy_mb: float
    events_to_each_stream_min: int
    change_to_stream_ms_p50: float
    change_to_stream_ms_p95: float
    documents: int
    upload_seconds: float
    pages_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # target p95 <= 100 ms


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


class StreamReaders:
    """`count` raw HTTP event streams of one path, read by one thread: events counted per
    stream; on the first, each change's delay from its `at` to its arrival."""

    def __init__(self, url: str, path: str, key: str, count: int) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.selector = selectors.DefaultSelector()
        self.events = [0] * count
        self.delays_ms: list[float] = []
        self._pending = ""
        self._stop = threading.Event()
        request = (
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {key}\r\n"
            "Accept: text/event-stream\r\n\r\n"
        ).encode()
        for n in range(count):
            sock = socket.create_connection((host, int(port)))
            sock.sendall(request)
            head = sock.recv(65536).decode(errors="replace")
            if not head.startswith("HTTP/1.1 200"):
                raise SystemExit(f"stream {n} was refused: {head.splitlines()[0]}")
            sock.setblocking(False)
            self.selector.register(sock, selectors.EVENT_READ, n)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            for key, _ in self.selector.select(timeout=0.2):
                try:
                    data = key.fileobj.recv(262144).decode(errors="replace")  # type: ignore[union-attr]
                except BlockingIOError:
                    continue
                arrived = time.time()
                self.events[key.data] += data.count("event: job")
                if key.data == 0:
                    self._timed(self._pending + data, arrived)

    def _timed(self, text: str, arrived: float) -> None:
        *whole, self._pending = text.split("\n\n")
        for block in whole:
            for line in block.splitlines():
                if line.startswith("data: {"):
                    at = json.loads(line[6:])["at"]
                    sent = datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()
                    self.delays_ms.append((arrived - sent) * 1000)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(5)
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]


def _timed_gets(client: httpx.Client, path: str, rounds: int) -> dict[str, float]:
    client.get(path).raise_for_status()  # warm
    took = []
    for _ in range(rounds):
        began = time.perf_counter()
        response = client.get(path)
        took.append((time.perf_counter() - began) * 1000)
        response.raise_for_status()
    return {"p50": round(percentile(took, 50), 1), "p95": round(percentile(took, 95), 1)}


def _fill(client: httpx.Client, dataset_id: str, documents: int) -> float:
    began = time.perf_counter()

    def send(n: int) -> None:
        body = f"Document {n} of the dashboard bench: okapi{n} grazes by the river.\n".encode()
        response = client.post(
            "/docs/upload",
            params={"datasetId": dataset_id},
            files={"file": (f"doc-{n:05d}.txt", body, "text/plain")},
        )
        response.raise_for_status()

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(send, range(documents)))
    return time.perf_counter() - began


def run_live_bench(
    *, streams: int = 200, documents: int = 10_000, rate: float = 20.0, seconds: float = 10.0
) -> LiveFigures:
    env = {
        "KOPS_MAX_STREAMS_PER_KEY": str(streams + 10),
        "KOPS_WORKERS": "2",
    }
    with (
        EmbeddedServer(workers=2, null_embedder=True, env=env) as server,
        connect(server.url, server.started, server.log) as (client, _),
    ):
        assert server.process is not None
        key = client.headers["Authorization"].removeprefix("Bearer ")
        time.sleep(1)
        alone = accept_latency(client, server, rate=rate, seconds=seconds, filler=FILLER)
        quiet = client.post("/datasets", json={"name": "bench-quiet"}).json()["id"]
        dataset = client.post("/datasets", json={"name": "bench-live"}).json()["id"]
        time.sleep(2)
        before = rss_mb(server.process.pid)
        idle = StreamReaders(server.url, f"/datasets/{quiet}/events", key, streams)
        time.sleep(2)
        opened = rss_mb(server.process.pid)
        with_idle = accept_latency(client, server, rate=rate, seconds=seconds, filler=FILLER)
        idle.close()
        time.sleep(2)
        readers = StreamReaders(server.url, f"/datasets/{dataset}/events", key, streams)
        with_busy = accept_latency(
            client, server, rate=rate, seconds=seconds, filler=FILLER, dataset_id=dataset
        )
        time.sleep(2)
        after_busy = rss_mb(server.process.pid)
        readers.close()
        delays = readers.delays_ms or [0.0]
        upload_s = _fill(client, dataset, documents)
        pages = _pages(client, server.url, key, dataset)
    return LiveFigures(
        streams=streams,
        rss_before_mb=before,
        rss_with_streams_mb=opened,
        stream_cost_mb=round(opened - before, 1),
        accept_without_streams=alone,
        accept_with_idle_streams=with_idle,
        accept_with_busy_streams=with_busy,
        rss_after_busy_mb=after_busy,
        events_to_each_stream_min=min(readers.events),
        change_to_stream_ms_p50=round(percentile(delays, 50), 1),
        change_to_stream_ms_p95=round(percentile(delays, 95), 1),
        documents=documents,
        upload_seconds=round(upload_s, 1),
        pages_ms=pages,
    )


def _pages(client: httpx.Client, url: str, key: str, dataset: str) -> dict[str, dict[str, float]]:
    with httpx.Client(base_url=url, timeout=60) as browser:
        signed = browser.post("/ui/login", data={"key": key}, headers={"Origin": url})
        if signed.status_code != 303:
            raise SystemExit(f"could not sign in to the dashboard: {signed.status_code}")
        first = browser.get(f"/ui/datasets/{dataset}").text
        pages = re.search(r"page 1 of (\d+)", first)
        last = int(pages.group(1)) if pages else 1
        document = re.search(r'href="/ui/documents/([0-9a-f-]{36})"', first)
        paths = {
            "documents page 1": f"/ui/datasets/{dataset}",
            f"documents page {last} (last)": f"/ui/datasets/{dataset}?page={last}",
            "documents, status filter": f"/ui/datasets/{dataset}?status=ready",
            "datasets": "/ui/datasets",
            "deployment": "/ui/deployment",
        }
        if document:
            paths["a document's chunks"] = f"/ui/documents/{document.group(1)}"
        return {name: _timed_gets(browser, path, 40) for name, path in paths.items()}


def report(figures: LiveFigures) -> dict[str, Any]:
    return asdict(figures)
