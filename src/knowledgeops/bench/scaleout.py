"""`kops bench scaleout`: the scale-out topology measured as a user meets it, over HTTP.

For each worker count it starts a fresh topology (`kops api`, `kops relay`, N `kops worker`
processes of one job each) on a throwaway PostgreSQL with pgvector and a throwaway Redis, waits
until every worker has loaded the model, uploads the corpus over HTTP (timing each accept while
the workers are busy with the earlier uploads) and follows every job to the end. The model's
threads are split evenly between the worker processes, so 1 and 2 workers use the same cores.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from knowledgeops.bench.endtoend import RunFigures, connect, corpus_files, measure
from knowledgeops.devpg import LocalPostgres, free_port
from knowledgeops.topology import LocalRedis, Topology


def run_scaleout(
    corpus: Path, *, worker_counts: list[int], timeout_s: float = 3600
) -> list[RunFigures]:
    files = corpus_files(corpus)
    if not files:
        raise SystemExit(f"no documents in {corpus}")
    root = Path(tempfile.mkdtemp(prefix="kops-bench-scaleout-"))
    root.chmod(0o755)  # PostgreSQL runs as `postgres` when we are root
    postgres = LocalPostgres(root / "pg", free_port(), durable=False)
    redis_server = LocalRedis(root / "redis")
    redis_server.root.mkdir(parents=True)
    results = []
    try:
        postgres.start()
        redis_server.start()
        for workers in worker_counts:
            results.append(_one_run(files, workers, postgres, redis_server, root, timeout_s))
    finally:
        redis_server.stop()
        postgres.destroy()
        shutil.rmtree(root, ignore_errors=True)
    return results


def _one_run(
    files: list[Path],
    workers: int,
    postgres: LocalPostgres,
    redis_server: LocalRedis,
    root: Path,
    timeout_s: float,
) -> RunFigures:
    import psycopg
    import redis

    database = f"kops_bench_{workers}w"
    with psycopg.connect(
        host=postgres.host, port=postgres.port, user="postgres", autocommit=True
    ) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}"')
        conn.execute(f'CREATE DATABASE "{database}"')
    for db in (0, 1):  # an empty broker, and no vectors cached by the previous run
        redis.Redis.from_url(redis_server.url(db)).flushdb()
    threads = max(1, (os.cpu_count() or 1) // workers)
    topology = Topology(
        root / f"run-{workers}w",
        database_url=postgres.url(database),
        broker_url=redis_server.url(0),
        cache_url=redis_server.url(1),
        settings={"model_threads": threads, "max_upload_mb": 1024, "log_level": "INFO"},
    )
    try:
        topology.migrate()
        started = time.perf_counter()
        topology.start(workers=workers, concurrency=1)
        log = topology.root / "logs" / "api1.log"
        with connect(topology.url, started, log, api_key=topology.api_key) as (client, ready_s):
            figures = measure(
                f"scale-out, {workers} worker(s)",
                client,
                files,
                ready_s=ready_s,
                workers=workers,
                timeout_s=timeout_s,
            )
    finally:
        topology.stop()
    figures.extra["model_threads_per_worker"] = threads
    figures.extra["topology"] = f"1 api, 1 relay, {workers} worker process(es) of 1 job"
    return figures


def render(results: list[RunFigures]) -> str:
    rows: list[tuple[str, list[Any]]] = []
    names = [n for n in asdict(results[0]) if n != "extra"]
    for name in names:
        rows.append((name, [asdict(r)[name] for r in results]))
    if len(results) > 1 and results[0].documents_per_s:
        ratio = results[-1].documents_per_s / results[0].documents_per_s
        rows.append(
            (f"speed-up {results[-1].workers} vs {results[0].workers} workers", [f"{ratio:.2f}×"])
        )
    width = max(len(name) for name, _ in rows)
    return "\n".join(
        f"{name:<{width}}  " + "  ".join(f"{v!s:>14}" for v in values) for name, values in rows
    )
