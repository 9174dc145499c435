"""The scale-out topology for real: `kops api`, `kops relay` and `kops worker` processes against
PostgreSQL with pgvector (pgserver's binaries) and Redis, spoken to over HTTP.

The machine's Redis serves as broker and cache on database numbers of the tests' own (flushed
before and after); a test that stops Redis starts a `redis-server` of its own instead.
"""

from __future__ import annotations

import random
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from knowledgeops.db.engine import Database
from knowledgeops.lab.topology import LocalRedis, Topology, TopologyError
from tests.conftest import unavailable
from tests.e2e.corpus import long_text
from tests.fixtures.documents import (
    Heading,
    Para,
    make_docx,
    make_html,
    make_markdown,
    make_pdf,
    make_text,
)

REDIS_HOST = "redis://127.0.0.1:6379"
BROKER_DB, CACHE_DB = 11, 12  # the tests' own database numbers on the machine's Redis


@pytest.fixture
def machine_redis() -> Iterator[tuple[str, str]]:
    """(broker URL, cache URL) on the machine's Redis, both databases empty."""
    clients = [redis.Redis.from_url(f"{REDIS_HOST}/{db}") for db in (BROKER_DB, CACHE_DB)]
    try:
        for client in clients:
            client.flushdb()
    except redis.RedisError as exc:
        unavailable(f"Redis is not reachable at {REDIS_HOST}: {exc}")
    yield f"{REDIS_HOST}/{BROKER_DB}", f"{REDIS_HOST}/{CACHE_DB}"
    for client in clients:
        client.flushdb()
        client.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[LocalRedis]:
    server = LocalRedis(tmp_path / "redis")
    server.root.mkdir()
    try:
        server.start()
    except TopologyError as exc:
        unavailable(str(exc))
    yield server
    server.stop()


FAST = {
    "heartbeat_interval_s": 1,
    "stale_after_s": 10,
    "relay_interval_s": 0.2,
    "backoff_base_s": 0.2,
    "backoff_max_s": 1,
    "embed_batch_size": 32,
    "log_level": "INFO",
}


@pytest.fixture
def make_topology(
    tmp_path: Path, pgvector_db: Database, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Topology]]:
    """Build a topology on a fresh pgvector database; every process is stopped at teardown and
    the logs are printed when the test failed."""
    built: list[Topology] = []

    def make(broker_url: str, cache_url: str, **settings: Any) -> Topology:
        topology = Topology(
            tmp_path / f"topology{len(built)}",
            database_url=pgvector_db.url,
            broker_url=broker_url,
            cache_url=cache_url,
            settings={**FAST, **settings},
        )
        built.append(topology)
        return topology

    yield make
    failed = getattr(request.node, "rep_call", None)
    for topology in built:
        logs = topology.logs()
        topology.stop()
        if failed is None or failed.failed:
            print(logs[-20000:])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]


def write_corpus(folder: Path, count: int, seed: int = 3) -> list[Path]:
    """`count` distinct small documents, the five formats in turn (PDF, DOCX, HTML, Markdown,
    text), each with a tag word of its own."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    files = []
    for n in range(count):
        tag = f"tag{n:03d}"
        body = long_text(tag, paragraphs=rng.randint(2, 4), seed=seed * 1000 + n)
        paragraphs = body.strip().split("\n\n")
        kind = n % 5
        if kind == 0:
            pages = ["\n".join(textwrap.wrap(p, 85)) for p in paragraphs]
            files.append(make_pdf(folder / f"doc{n:03d}.pdf", pages))
        elif kind == 1:
            parts = [Heading(f"Document {n}", 1), *(Para(p) for p in paragraphs)]
            files.append(make_docx(folder / f"doc{n:03d}.docx", parts))
        elif kind == 2:
            html = "".join(f"<p>{p}</p>\n" for p in paragraphs)
            files.append(make_html(folder / f"doc{n:03d}.html", html, title=f"Document {n}"))
        elif kind == 3:
            files.append(make_markdown(folder / f"doc{n:03d}.md", f"# Document {n}\n\n{body}"))
        else:
            files.append(make_text(folder / f"doc{n:03d}.txt", body))
    return files
