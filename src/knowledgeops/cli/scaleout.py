"""The scale-out commands: `kops api`, `kops worker` and `kops relay` (docs/scale-out.md). Each
checks its database, schema, index, cache and broker first and exits 2 with one sentence naming
the setting to fix when one is wrong."""

from __future__ import annotations

import logging
import os
import signal
from enum import StrEnum
from types import FrameType
from typing import Annotated, Any

import typer

from knowledgeops.cli.common import cannot_start, settings
from knowledgeops.errors import StartupError
from knowledgeops.roles.logs import configure_logging
from knowledgeops.settings import Settings

log = logging.getLogger("knowledgeops.cli")


def _checked(role: str, *, broker: bool) -> tuple[Settings, Any]:
    """The settings, logging configured, and (for a role with a broker) the Celery app."""

    from knowledgeops.roles.preflight import check_scaleout  # noqa: PLC0415 (SQLAlchemy, the wiring)

    chosen = settings()
    configure_logging(chosen.log_level)
    try:
        celery_app = check_scaleout(chosen, role, broker=broker)
    except StartupError as exc:
        raise cannot_start(exc) from None
    return chosen, celery_app


def api(
    port: Annotated[int | None, typer.Option(help="HTTP port (KOPS_PORT, default 8000).")] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind (KOPS_HOST).")] = None,
    workers: Annotated[int, typer.Option(min=1, help="API processes.")] = 1,
) -> None:
    """Scale-out: serve the HTTP API (stateless; run as many as you like behind a balancer)."""
    import uvicorn  # noqa: PLC0415 (uvicorn: the HTTP server, for this command only)

    from knowledgeops.api import server  # noqa: PLC0415

    chosen, _ = _checked("api", broker=False)
    log.info("settings: %s", chosen.describe())
    options: dict[str, Any] = {
        "factory": True,
        "host": host or chosen.host,
        "port": port or chosen.port,
        "log_level": chosen.log_level.lower(),
        "access_log": False,
    }
    if workers == 1:  # one process: its event streams end as soon as it is told to stop
        server.run("knowledgeops.roles.api:create_app", **options)
        return
    # several processes under uvicorn's supervisor: open streams end at the graceful timeout
    uvicorn.run(
        "knowledgeops.roles.api:create_app",
        workers=workers,
        timeout_graceful_shutdown=server.GRACEFUL_SHUTDOWN_S,
        **options,
    )


class Lane(StrEnum):
    ALL = "all"
    JOBS = "jobs"
    WEBHOOKS = "webhooks"


def worker(
    concurrency: Annotated[int, typer.Option(min=1, help="Jobs run at once (processes).")] = 2,
    lanes: Annotated[
        Lane,
        typer.Option(
            help="What this worker runs: all jobs, only documents' and datasets' (jobs), or "
            "only webhook deliveries (webhooks: run one such worker so that a slow receiver "
            "never holds a process an upload needs)."
        ),
    ] = Lane.ALL,
) -> None:
    """Scale-out: a Celery worker that runs ingest jobs (run one per machine, or more).

    Always Celery's prefork pool: one process per job, so that the job time limit can stop a
    job that hangs (the threads and solo pools cannot enforce it)."""
    from knowledgeops.jobs.celery_dispatch import QUEUE  # noqa: PLC0415 (celery: heavy, for this command only)
    from knowledgeops.roles.wiring import CELERY_LANES  # noqa: PLC0415 (the wiring: heavy)
    from knowledgeops.roles.worker import create_worker_app  # noqa: PLC0415 (celery: heavy, for this command only)

    chosen, _ = _checked("worker", broker=True)
    if chosen.model_threads == 0:  # share the cores between the worker processes
        threads = max(1, (os.cpu_count() or 1) // concurrency)
        chosen = chosen.model_copy(update={"model_threads": threads})
    log.info("settings: %s", chosen.describe())
    create_worker_app(chosen).worker_main(
        [
            "worker",
            f"--concurrency={concurrency}",
            "--pool=prefork",
            f"--loglevel={chosen.log_level}",
            f"--queues={','.join(_queues(lanes, QUEUE, sorted(CELERY_LANES.values())))}",
            f"--hostname=kops-{os.getpid()}@%h",
            "--without-gossip",
            "--without-mingle",
        ]
    )


def _queues(lanes: Lane, jobs: str, others: list[str]) -> list[str]:
    if lanes is Lane.JOBS:
        return [jobs]
    if lanes is Lane.WEBHOOKS:
        return others
    return [jobs, *others]


def relay() -> None:
    """Scale-out: publish the outbox to the broker and rescue lost jobs (run two for
    availability: one is active, the other takes over within seconds)."""
    from knowledgeops.jobs.celery_dispatch import CeleryDispatcher  # noqa: PLC0415 (celery: heavy, for this command only)
    from knowledgeops.roles.relay import RelayRole  # noqa: PLC0415 (SQLAlchemy, the wiring)
    from knowledgeops.roles.wiring import CELERY_LANES  # noqa: PLC0415 (the wiring: heavy)

    chosen, celery_app = _checked("relay", broker=True)
    log.info("settings: %s", chosen.describe())
    role = RelayRole(chosen, CeleryDispatcher(celery_app, CELERY_LANES))

    def stop(signum: int, _frame: FrameType | None) -> None:
        log.info("relay: stopping (signal %d)", signum)
        role.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    role.run()


def register(app: typer.Typer) -> None:
    for command in (api, worker, relay):
        app.command()(command)
