"""The scale-out commands of `kops`: `api`, `worker`, `relay`, and `postgres` for a local
PostgreSQL with pgvector. Registered on the main app in `cli.py`."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from knowledgeops.settings import Settings, SettingsError, load_settings

console = Console()
err = Console(stderr=True)
log = logging.getLogger("knowledgeops.cli")


def _fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


def _settings() -> Settings:
    try:
        return load_settings()
    except SettingsError as exc:
        raise _fail(str(exc)) from None


def _logging(level: str) -> None:
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s", force=True
    )
    logging.getLogger("alembic").setLevel(logging.WARNING)  # its start-up chatter


def _preflight(settings: Settings, role: str, *, broker: bool) -> Any:
    """Check database, schema, pgvector, cache (and broker); returns the Celery app or None.
    The API only warns about the cache: it can accept uploads without it."""
    from knowledgeops.db.engine import Database
    from knowledgeops.preflight import (
        StartupError,
        check_broker,
        check_cache,
        check_database,
        check_index,
        check_schema,
        require_broker,
        require_postgres,
    )
    from knowledgeops.runtime import make_index, model_dimension

    try:
        require_postgres(settings, role)
        url = require_broker(settings, role) if broker else None
        db = Database(settings.resolved_database_url)
        try:
            check_database(db)
            check_schema(db)
            check_index(make_index(db, model_dimension(settings)), db)
        finally:
            db.dispose()
        try:
            check_cache(settings)
        except StartupError as exc:
            if broker:
                raise
            log.warning("%s; searches embed their queries without the cache until it answers", exc)
        if url is None:
            return None
        from knowledgeops.jobs.celery_dispatch import make_celery

        app = make_celery(
            url,
            job_time_limit_s=settings.job_time_limit_s,
            visibility_timeout_s=settings.visibility_timeout_s,
        )
        check_broker(app)
        return app
    except StartupError as exc:
        raise _fail(str(exc)) from None


def api(
    port: Annotated[int | None, typer.Option(help="HTTP port (KOPS_PORT, default 8000).")] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind (KOPS_HOST).")] = None,
    workers: Annotated[int, typer.Option(min=1, help="API processes.")] = 1,
) -> None:
    """Scale-out: serve the HTTP API (stateless; run as many as you like behind a balancer)."""
    import uvicorn

    settings = _settings()
    _logging(settings.log_level)
    _preflight(settings, "api", broker=False)
    log.info("settings: %s", settings.describe())
    uvicorn.run(
        "knowledgeops.api.app:create_scaleout_app",
        factory=True,
        host=host or settings.host,
        port=port or settings.port,
        workers=workers,
        log_level=settings.log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=20,
    )


def worker(
    concurrency: Annotated[int, typer.Option(min=1, help="Jobs run at once (processes).")] = 2,
) -> None:
    """Scale-out: a Celery worker that runs ingest jobs (run one per machine, or more).

    Always Celery's prefork pool: one process per job, so that the job time limit can stop a
    job that hangs (the threads and solo pools cannot enforce it)."""
    settings = _settings()
    _logging(settings.log_level)
    _preflight(settings, "worker", broker=True)
    if settings.model_threads == 0:  # share the cores between the worker processes
        threads = max(1, (os.cpu_count() or 1) // concurrency)
        settings = settings.model_copy(update={"model_threads": threads})
    log.info("settings: %s", settings.describe())

    from knowledgeops.celery_worker import create_worker_app
    from knowledgeops.jobs.celery_dispatch import QUEUE

    app = create_worker_app(settings)
    app.worker_main(
        [
            "worker",
            f"--concurrency={concurrency}",
            "--pool=prefork",
            f"--loglevel={settings.log_level}",
            f"--queues={QUEUE}",
            f"--hostname=kops-{os.getpid()}@%h",
            "--without-gossip",
            "--without-mingle",
        ]
    )


def relay() -> None:
    """Scale-out: publish the outbox to the broker and rescue lost jobs (run two for
    availability: one is active, the other takes over within seconds)."""
    from knowledgeops.jobs.celery_dispatch import CeleryDispatcher
    from knowledgeops.runtime import RelayRuntime

    settings = _settings()
    _logging(settings.log_level)
    app = _preflight(settings, "relay", broker=True)
    log.info("settings: %s", settings.describe())
    runtime = RelayRuntime(settings, CeleryDispatcher(app))

    def stop(signum: int, _frame: FrameType | None) -> None:
        log.info("relay: stopping (signal %d)", signum)
        runtime.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    runtime.run()


def chaos(
    short: Annotated[bool, typer.Option(help="The short form CI runs.")] = False,
    only: Annotated[
        str | None, typer.Option(help="Comma-separated scenarios (default: all).")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Write the results as JSON here.")] = None,
) -> None:
    """Break the scale-out topology on purpose (own PostgreSQL, Redis and provider) and check
    that nothing was lost, doubled or left stuck; exits 1 if anything was."""
    from knowledgeops import chaos as suite
    from knowledgeops.devpg import LocalPostgresError
    from knowledgeops.topology import TopologyError

    _logging("WARNING")

    def stop(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)  # unwinds: every process and folder is cleaned up

    signal.signal(signal.SIGTERM, stop)
    try:
        results = suite.run_chaos(
            short=short, only=[n.strip() for n in only.split(",")] if only else None
        )
    except (ValueError, LocalPostgresError, TopologyError) as exc:
        raise _fail(str(exc)) from None
    console.print(suite.render(results))
    if out is not None:
        suite.write_json(results, out)
    if not all(result.ok for result in results):
        raise typer.Exit(1)


postgres_app = typer.Typer(
    help="A local PostgreSQL 16 with pgvector from the pgserver package (for trying scale-out)."
)
PgDir = Annotated[Path, typer.Option("--dir", help="Folder for the server's data.")]
PgPort = Annotated[int, typer.Option(help="TCP port on 127.0.0.1.")]


@postgres_app.command("start")
def postgres_start(dir: PgDir = Path("./kops-pg"), port: PgPort = 5433) -> None:
    """initdb (first time) and start the server; prints the KOPS_DATABASE_URL to use."""
    from knowledgeops.devpg import LocalPostgres, LocalPostgresError

    server = LocalPostgres(dir.resolve(), port)
    try:
        server.start()
    except LocalPostgresError as exc:
        raise _fail(str(exc)) from None
    console.print(f"PostgreSQL with pgvector runs on {server.host}:{port} (data in {dir})")
    console.print(f"export KOPS_DATABASE_URL={server.url()}", highlight=False, soft_wrap=True)


@postgres_app.command("stop")
def postgres_stop(dir: PgDir = Path("./kops-pg"), port: PgPort = 5433) -> None:
    """Stop the server started by `kops postgres start`."""
    from knowledgeops.devpg import LocalPostgres, LocalPostgresError

    try:
        LocalPostgres(dir.resolve(), port).stop()
    except LocalPostgresError as exc:
        raise _fail(str(exc)) from None
    console.print("stopped")


def register(app: typer.Typer) -> None:
    app.command()(api)
    app.command()(worker)
    app.command()(relay)
    app.command()(chaos)
    app.add_typer(postgres_app, name="postgres")
