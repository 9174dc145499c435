"""`kops serve`, the embedded default: one process holds it all (docs/architecture.md, "Two
topologies"): SQLite, the in-process queue, the relay, heartbeat and worker threads, and the API's
use cases. One per data folder (a lock file says so).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence

from fastapi import FastAPI

from knowledgeops.api.app import create_app
from knowledgeops.clock import Clock, utcnow
from knowledgeops.db.lockfile import DataDirLock
from knowledgeops.db.migrate import upgrade
from knowledgeops.ingest.embedders.base import Embedder
from knowledgeops.jobs.heartbeat import Heartbeat
from knowledgeops.jobs.inprocess import InProcessQueue
from knowledgeops.jobs.kinds import Lanes
from knowledgeops.jobs.runner import Runner
from knowledgeops.jobs.worker_pool import WorkerPool
from knowledgeops.mcp_server import http as mcp_http
from knowledgeops.roles import wiring
from knowledgeops.roles.base import DataRole
from knowledgeops.roles.first_key import check_auth
from knowledgeops.roles.logs import configure_logging
from knowledgeops.service.blob_refs import sweep_unreferenced
from knowledgeops.settings import DEFAULT_TENANT, Settings
from knowledgeops.ui import app as ui
from knowledgeops.webhooks import WEBHOOK_KIND

log = logging.getLogger(__name__)


class EmbeddedRole(DataRole):
    def __init__(
        self,
        settings: Settings,
        *,
        embedder: Embedder | Sequence[Embedder] | None = None,
        clock: Clock = utcnow,
    ) -> None:
        # the workers share this process with the API: they run below it (KOPS_WORKER_NICE)
        super().__init__(settings, embedder=embedder, nice=settings.worker_nice, clock=clock)
        self.started_at: float | None = None
        self.lock = DataDirLock(settings.data_dir)
        self.queue = InProcessQueue()
        self.webhook_queue = InProcessQueue()  # deliveries' own lane: never ahead of an upload
        lanes = Lanes(self.queue, {WEBHOOK_KIND: self.webhook_queue})
        self.heartbeat = Heartbeat(self.store, settings.heartbeat_interval_s, clock)
        self.relay = wiring.make_relay(settings, self.store, lanes, clock)
        self.pipeline = wiring.make_pipeline(settings, self.db, self.blobs, self.index, self.models)
        self.runner = Runner(
            self.store,
            wiring.make_handler(settings, self.db, self.pipeline, clock),
            policy=wiring.retry_policy(settings),
            heartbeat=self.heartbeat,
            clock=clock,
            owner_prefix=f"serve-{os.getpid()}",
            on_split=self.relay.wake,
        )
        self.workers = WorkerPool(
            self.queue,
            self.runner,
            settings.workers,
            nice=settings.worker_nice,
            on_start=self.pipeline.parsing.prestart,  # each worker's parser, ready before work
        )
        self.deliverers = WorkerPool(self.webhook_queue, self.runner, settings.webhook_workers)
        # an upload wakes the relay: its job is published now, not at the relay's next tick
        self.service = self.use_cases(notify=self.relay.wake, readiness=self.readiness)

    def app(self) -> FastAPI:
        """The HTTP API over this role; the app's lifespan starts and stops it."""
        app = create_app(self.service, on_start=self.start, on_stop=self.stop)
        ui.install(app)  # the dashboard at /ui, on the same app and streams
        mcp_http.install(app, self.settings)  # the MCP server at /mcp
        return app

    def acquire(self) -> None:
        """Take the data folder (raises DataDirLocked when another process has it)."""
        self.lock.acquire()

    def start(self) -> None:
        started = time.perf_counter()
        self.acquire()
        upgrade(self.db.engine)
        self.index.ensure()
        self.service.datasets.ensure_default(DEFAULT_TENANT)
        check_auth(self.settings, self.service.keys, first_key=True)
        leftovers = self.blobs.clear_incoming()
        orphans = sweep_unreferenced(self.db, self.blobs)
        if leftovers or orphans:
            log.info(
                "removed %d partial uploads and %d unreferenced files left by the last run",
                leftovers,
                orphans,
            )
        self.relay.recover_after_restart()
        self.heartbeat.start()
        self.relay.start()
        self.workers.start()
        self.deliverers.start()
        wiring.preload(self.embedder)
        self.started_at = time.perf_counter()
        log.info("embedded runtime started in %.2f s", self.started_at - started)

    def stop(self) -> None:
        self.workers.stop(timeout=self.settings.shutdown_grace_s)
        self.deliverers.stop(timeout=self.settings.webhook_timeout_s)
        # first: a parse cut short below must not fail its job
        self.heartbeat.release_held()
        self.pipeline.parsing.close()
        self.models.close()
        self.relay.stop()
        self.heartbeat.stop()
        self.index.close()  # snapshots the vector graphs: the next start loads them
        self.db.dispose()
        self.lock.release()

    def readiness(self) -> dict[str, object]:
        """The database answers and the background threads run."""
        checks: dict[str, object] = {"database": self.database_check()}
        alive = self.workers.alive()
        checks["workers"] = f"{alive}/{self.workers.size} running"
        delivering = self.deliverers.alive()
        checks["webhook_workers"] = f"{delivering}/{self.deliverers.size} running"
        checks["relay"] = "running" if self.relay.is_alive() else "stopped"
        checks["heartbeat"] = "running" if self.heartbeat.is_alive() else "stopped"
        checks["model"] = "loaded" if self.embedder.loaded else "loading"
        checks["ready"] = (
            checks["database"] == "ok"
            and alive == self.workers.size
            and delivering == self.deliverers.size
            and self.relay.is_alive()
            and self.heartbeat.is_alive()
        )
        return checks


def serve(settings: Settings, embedder: Embedder | Sequence[Embedder] | None = None) -> None:
    """Run `kops serve` with these settings until it is stopped (SIGINT, SIGTERM); `embedder`
    replaces the configured model (`kops bench`'s null embedder only). Raises DataDirLocked
    before anything starts when another process holds the data folder."""
    from knowledgeops.api import server  # noqa: PLC0415 (uvicorn: only when serving)

    configure_logging(settings.log_level)
    log.info("settings: %s", settings.describe())
    role = EmbeddedRole(settings, embedder=embedder)
    role.acquire()
    server.run(
        role.app(),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        access_log=False,
    )
