"""`kops bench scaleout`: the scale-out topology measured as a user meets it, over HTTP.

For each worker count it starts a fresh topology (`kops api`, `kops relay`, N `kops worker`
processes of one job each) on a throwaway PostgreSQL with pgvector and a throwaway Redis, waits
until every worker has loaded the model, uploads the corpus over HTTP (timing each accept while
the workers are busy with the earlier uploads) and follows every job to the end. The model's
threads are split evenly between the worker processes, so 1 and 2 workers use the same cores.

Then one large PDF alone (600 pages, made of the corpus's PDFs), with each worker held to one
model thread: a worker count's speed-up there comes from the document's page-range parts
(KOPS_PDF_PART_PAGES) running on different workers. The embedding cache is off for it, so every
chunk costs the model its time.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psycopg
import pypdfium2 as pdfium
import redis

from knowledgeops.lab.bench.endtoend import RunFigures, connect, corpus_files, measure
from knowledgeops.lab.devpg import LocalPostgres, free_port
from knowledgeops.lab.topology import LocalRedis, Topology

SPLIT_PDF_PAGES = 600
SPLIT_NAME = "split PDF"


def run_scaleout(
    corpus: Path,
    *,
    worker_counts: list[int],
    timeout_s: float = 3600,
    split_pdf_pages: int = SPLIT_PDF_PAGES,
    whole_corpus: bool = True,
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
        for workers in worker_counts if whole_corpus else ():
            threads = max(1, (os.cpu_count() or 1) // workers)
            name = f"scale-out, {workers} worker(s)"
            results.append(
                _one_run(name, files, workers, threads, postgres, redis_server, root, timeout_s)
            )
        big = built_pdf(files, split_pdf_pages, root / "split.pdf") if split_pdf_pages else None
        if big is not None:
            for workers in worker_counts:  # each worker held to one model thread
                name = f"{SPLIT_NAME}, {workers} worker(s)"
                results.append(
                    _one_run(
                        name,
                        [big],
                        workers,
                        1,
                        postgres,
                        redis_server,
                        root,
                        timeout_s,
                        embed_cache=False,
                    )
                )
    finally:
        redis_server.stop()
        postgres.destroy()
        shutil.rmtree(root, ignore_errors=True)
    return results


def built_pdf(files: list[Path], pages: int, out: Path) -> Path | None:
    """A PDF of `pages` pages made of the corpus's PDFs, largest first, their pages repeated
    if they hold fewer; None when the corpus has no PDF."""

    sources = []
    for path in files:
        if path.suffix.lower() == ".pdf":
            try:
                sources.append(pdfium.PdfDocument(str(path)))
            except pdfium.PdfiumError:
                continue
    sources = [pdf for pdf in sources if len(pdf)]
    if not sources:
        return None
    sources.sort(key=len, reverse=True)
    target = pdfium.PdfDocument.new()
    try:
        while len(target) < pages:
            for source in sources:
                wanted = min(len(source), pages - len(target))
                if wanted > 0:
                    target.import_pages(source, list(range(wanted)))
        target.save(str(out))
    finally:
        target.close()
        for source in sources:
            source.close()
    return out


def _one_run(
    name: str,
    files: list[Path],
    workers: int,
    threads: int,
    postgres: LocalPostgres,
    redis_server: LocalRedis,
    root: Path,
    timeout_s: float,
    *,
    embed_cache: bool = True,
) -> RunFigures:

    database = f"kops_bench_{len(list(root.glob('run-*')))}"
    with psycopg.connect(
        host=postgres.host, port=postgres.port, user="postgres", autocommit=True
    ) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}"')
        conn.execute(f'CREATE DATABASE "{database}"')
    for db in (0, 1):  # an empty broker, and no vectors cached by the previous run
        redis.Redis.from_url(redis_server.url(db)).flushdb()
    topology = Topology(
        root / f"run-{database}",
        database_url=postgres.url(database),
        broker_url=redis_server.url(0),
        cache_url=redis_server.url(1),
        settings={
            "model_threads": threads,
            "max_upload_mb": 1024,
            "log_level": "INFO",
            "embed_cache": embed_cache,
        },
    )
    try:
        topology.migrate()
        started = time.perf_counter()
        topology.start(workers=workers, concurrency=1)
        log = topology.root / "logs" / "api1.log"
        with connect(topology.url, started, log, api_key=topology.api_key) as (client, ready_s):
            figures = measure(
                name,
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
    figures.extra["embedding_cache"] = embed_cache
    return figures


def render(results: list[RunFigures]) -> str:
    rows: list[tuple[str, list[Any]]] = []
    names = [n for n in asdict(results[0]) if n != "extra"]
    for name in names:
        rows.append((name, [asdict(r)[name] for r in results]))
    for label, (first, last) in speedups(results).items():
        rows.append((label, [f"{last.chunks_per_s / first.chunks_per_s:.2f}×"]))
    width = max(len(name) for name, _ in rows)
    return "\n".join(
        f"{name:<{width}}  " + "  ".join(f"{v!s:>14}" for v in values) for name, values in rows
    )


def speedups(results: list[RunFigures]) -> dict[str, tuple[RunFigures, RunFigures]]:
    """For the corpus and for the split PDF: (fewest workers, most workers), by chunks/s."""
    found = {}
    for label, prefix in (("corpus", "scale-out"), (SPLIT_NAME, SPLIT_NAME)):
        runs = sorted((r for r in results if r.name.startswith(prefix)), key=lambda r: r.workers)
        if len(runs) > 1 and runs[0].chunks_per_s:
            found[f"{label}: speed-up {runs[-1].workers} vs {runs[0].workers} workers"] = (
                runs[0],
                runs[-1],
            )
    return found
