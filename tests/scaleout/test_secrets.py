"""No secret leaks: after a scale-out run that used a database password, a Redis password and a
provider key (one job even failing because the provider refused its key), none of them appears in
any process log, API answer, metric, broker message, cache entry or database row."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import redis
from sqlalchemy import create_engine, text

from knowledgeops.lab.devpg import free_port
from knowledgeops.lab.embedders import HashingEmbedder
from knowledgeops.lab.fakeprovider import ProviderState, create_provider_app, serve_in_thread
from knowledgeops.lab.topology import LocalRedis, Topology
from tests.scaleout.conftest import write_corpus

pytestmark = [pytest.mark.postgres, pytest.mark.scaleout]

DB_PASSWORD = "pg-canary-Zq81xw"
REDIS_PASSWORD = "redis-canary-Hn47kd"
PROVIDER_KEY = "sk-canary-Tr59bv2"
SECRETS = (DB_PASSWORD, REDIS_PASSWORD, PROVIDER_KEY)
WRONG_API_KEY = "kops_" + "w" * 43  # someone guessing: refused, and not logged either


def test_no_secret_appears_anywhere_after_a_run_that_used_them(
    make_topology: Callable[..., Topology], pgvector_db: object, tmp_path: Path
) -> None:
    own = LocalRedis(tmp_path / "redis", password=REDIS_PASSWORD)
    own.root.mkdir()
    own.start()
    key_file = tmp_path / "provider.key"
    key_file.write_text(PROVIDER_KEY + "\n")
    state = ProviderState(keys={PROVIDER_KEY})
    app = create_provider_app(HashingEmbedder(dimension=384), state)
    try:
        with serve_in_thread(app, free_port()) as provider_url:
            topology = make_topology(
                own.url(0),
                own.url(1),
                embedder="openai",
                openai_base_url=provider_url,
                openai_model="fake",
                openai_dimensions=384,
                openai_api_key_file=key_file,
            )
            # the password travels in the URL; the test server trusts local connections, so it
            # is never checked, only carried everywhere a real one would be
            topology.database_url = topology.database_url.replace(
                "postgres@", f"postgres:{DB_PASSWORD}@"
            )
            env = topology.env()  # every secret really reaches the processes
            assert DB_PASSWORD in env["KOPS_DATABASE_URL"]
            assert REDIS_PASSWORD in env["KOPS_BROKER_URL"]
            assert REDIS_PASSWORD in env["KOPS_CACHE_URL"]
            with pytest.raises(redis.AuthenticationError):  # and Redis really demands its own
                redis.Redis(port=own.port).ping()
            topology.migrate()
            topology.start(workers=1, local_model=False)
            answers = _run(topology, state, tmp_path)
            logs = topology.logs()
            broker_and_cache = _dump_redis(own)
            rows = _dump_database(topology.database_url)
            api_key = topology.api_key
    finally:
        own.stop()

    assert "embedder_auth" in rows  # the refused key really failed a job
    for name, haystack in {
        "logs": logs,
        "API answers": answers,
        "Redis (broker and cache)": broker_and_cache,
        "database rows": rows,
    }.items():
        for secret in (*SECRETS, api_key, WRONG_API_KEY):
            assert secret, "the run used an API key"
            assert secret not in haystack, f"a secret leaked into the {name}"


def _run(topology: Topology, state: ProviderState, tmp_path: Path) -> str:
    files = write_corpus(tmp_path / "corpus", 3)
    seen: list[str] = []
    with topology.client(60) as client:

        def get(path: str) -> httpx.Response:
            response = client.get(path)
            seen.append(response.text)
            return response

        ok = [
            client.post("/docs/upload", files={"file": (f.name, f.read_bytes())}) for f in files[:2]
        ]
        seen += [r.text for r in ok]
        for response in ok:
            job_id = response.json()["jobId"]
            _wait(lambda job_id=job_id: get(f"/docs/jobs/{job_id}").json()["status"] == "completed")
        state.keys = {"a-key-nobody-has"}  # the provider refuses the key now
        refused = client.post(
            "/docs/upload", files={"file": (files[2].name, files[2].read_bytes())}
        )
        seen.append(refused.text)
        job_id = refused.json()["jobId"]
        _wait(lambda: get(f"/docs/jobs/{job_id}").json()["status"] == "failed")
        dataset = next(d for d in get("/datasets").json()["items"] if d["isDefault"])
        search = client.post(
            f"/datasets/{dataset['id']}/search", json={"query": "tag001", "mode": "vector"}
        )
        seen.append(search.text)  # 503: the provider refuses the query's key too
        for path in ("/docs/jobs", "/metrics", "/readyz", "/healthz", "/api/openapi.json"):
            get(path)
        seen.append(client.post("/docs/upload").text)  # a bad request's error
        wrong = client.get("/datasets", headers={"Authorization": f"Bearer {WRONG_API_KEY}"})
        assert wrong.status_code == 401
        seen.append(wrong.text)
    return "\n".join(seen)


def _wait(predicate: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the job did not finish"
        time.sleep(0.2)


def _dump_redis(server: LocalRedis) -> str:
    parts = []
    for db in (0, 1):
        client = redis.Redis.from_url(server.url(db))
        for key in client.scan_iter():
            kind = client.type(key).decode()
            parts.append(key.decode(errors="replace"))
            if kind == "string":
                parts.append(repr(client.get(key)))
            elif kind == "list":
                parts += [repr(v) for v in client.lrange(key, 0, -1)]
            elif kind == "hash":
                parts += [repr(v) for v in client.hgetall(key).items()]
            elif kind == "set":
                parts += [repr(v) for v in client.smembers(key)]
            elif kind == "zset":
                parts += [repr(v) for v in client.zrange(key, 0, -1)]
        client.close()
    return "\n".join(parts)


def _dump_database(url: str) -> str:
    engine = create_engine(url)
    parts = []
    try:
        with engine.connect() as conn:
            for table in ("ingest_jobs", "outbox", "job_events", "documents", "datasets"):
                parts += [repr(tuple(row)) for row in conn.execute(text(f"SELECT * FROM {table}"))]
    finally:
        engine.dispose()
    return "\n".join(parts)
