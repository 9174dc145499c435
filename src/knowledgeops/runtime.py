"""Wiring, in one place: the embedded default built from `Settings`, started and stopped.

One process holds it all (DESIGN.md §2): SQLite, the in-process queue, the relay thread, the
heartbeat thread and the worker threads, plus the use cases the API and CLI call.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import datetime

from knowledgeops.blobs import LocalBlobStore
from knowledgeops.db.engine import Database
from knowledgeops.db.migrate import upgrade
from knowledgeops.db.schema import utcnow
from knowledgeops.ingest.chunker import HFTokenizer
from knowledgeops.ingest.embedders.base import Embedder
from knowledgeops.ingest.embedders.local import LocalMiniLM, load_tokenizer
from knowledgeops.ingest.index.sqlite import SqliteIndex
from knowledgeops.ingest.lifecycle import DocumentLifecycle
from knowledgeops.ingest.pipeline import IngestPipeline
from knowledgeops.jobs.heartbeat import Heartbeat
from knowledgeops.jobs.inprocess import InProcessQueue
from knowledgeops.jobs.relay import Relay
from knowledgeops.jobs.retry import RetryPolicy
from knowledgeops.jobs.runner import Runner
from knowledgeops.jobs.sql_store import SqlJobStore
from knowledgeops.jobs.store import LeaseLost
from knowledgeops.jobs.worker_pool import WorkerPool
from knowledgeops.lockfile import DataDirLock
from knowledgeops.service.blob_refs import sweep_unreferenced
from knowledgeops.service.datasets import DatasetDefaults, Datasets
from knowledgeops.service.documents import Documents
from knowledgeops.service.jobs import Jobs
from knowledgeops.service.search import Search
from knowledgeops.service.uploads import Uploads
from knowledgeops.settings import Settings

log = logging.getLogger(__name__)


class Embedded:
    def __init__(
        self,
        settings: Settings,
        *,
        embedder: Embedder | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.settings = settings
        self.started_at: float | None = None
        self.lock = DataDirLock(settings.data_dir)
        self.db = Database(settings.resolved_database_url)
        self.blobs = LocalBlobStore(settings.data_dir)
        self.embedder: Embedder = embedder or LocalMiniLM(threads=settings.model_threads)
        self.index = SqliteIndex(self.db, self.embedder.dimension)
        self.store = SqlJobStore(self.db, DocumentLifecycle(self.index))
        self.queue = InProcessQueue()
        policy = RetryPolicy(settings.backoff_base_s, settings.backoff_max_s)
        self.heartbeat = Heartbeat(self.store, settings.heartbeat_interval_s, clock)
        self.relay = Relay(
            self.store,
            self.queue,
            policy=policy,
            stale_after_s=settings.stale_after_s,
            republish_after_s=settings.republish_after_s,
            interval_s=settings.relay_interval_s,
            clock=clock,
        )
        self.pipeline = IngestPipeline(
            self.db,
            self.blobs,
            self.index,
            self.embedder,
            HFTokenizer(load_tokenizer()),
            batch_size=settings.embed_batch_size,
        )
        self.runner = Runner(
            self.store,
            self.pipeline,
            policy=policy,
            heartbeat=self.heartbeat,
            clock=clock,
            owner_prefix=f"serve-{os.getpid()}",
        )
        self.workers = WorkerPool(self.queue, self.runner, settings.workers)

        notify = self.relay.wake
        defaults = DatasetDefaults(
            self.embedder.model_id, settings.chunk_size, settings.chunk_overlap
        )
        self.datasets = Datasets(self.db, self.index, self.blobs, defaults)
        self.jobs = Jobs(self.db, self.store, retry_attempts=settings.max_attempts, notify=notify)
        self.documents = Documents(
            self.db,
            self.store,
            self.index,
            self.blobs,
            max_attempts=settings.max_attempts,
            notify=notify,
        )
        self.uploads = Uploads(
            self.db,
            self.store,
            self.datasets,
            self.jobs,
            max_attempts=settings.max_attempts,
            notify=notify,
        )
        self.search = Search(self.db, self.datasets, self.index, self.embedder)

    # --- lifecycle ------------------------------------------------------------------------------
    def acquire(self) -> None:
        """Take the data folder (raises DataDirLocked when another process has it)."""
        self.lock.acquire()

    def start(self) -> None:
        started = time.perf_counter()
        self.acquire()
        upgrade(self.db.engine)
        self.index.ensure()
        self.datasets.ensure_default()
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
        self._preload_model()
        self.started_at = time.perf_counter()
        log.info("embedded runtime started in %.2f s", self.started_at - started)

    def stop(self) -> None:
        self.workers.stop(timeout=self.settings.shutdown_grace_s)
        self._release_unfinished()
        self.relay.stop()
        self.heartbeat.stop()
        self.db.dispose()
        self.lock.release()

    def _release_unfinished(self) -> None:
        """Jobs a worker is still inside after the grace period go back to the queue without
        spending an attempt; the worker's next write is then refused, so it cannot finish them."""
        for lease in self.heartbeat.held():
            try:
                self.store.release(lease, now=self.runner.clock())
                log.info("job %s: released at shutdown", lease.job_id)
            except LeaseLost:
                pass

    def _preload_model(self) -> None:
        load = getattr(self.embedder, "load", None)
        if callable(load):
            threading.Thread(target=load, name="kops-model-load", daemon=True).start()

    def readiness(self) -> dict[str, object]:
        """What /readyz reports: the database answers and the background threads run."""
        checks: dict[str, object] = {}
        try:
            self.db.ping()
            checks["database"] = "ok"
        except Exception as exc:
            checks["database"] = f"unavailable: {type(exc).__name__}"
        alive = self.workers.alive()
        checks["workers"] = f"{alive}/{self.workers.size} running"
        checks["relay"] = "running" if self.relay.is_alive() else "stopped"
        checks["heartbeat"] = "running" if self.heartbeat.is_alive() else "stopped"
        checks["model"] = "loaded" if getattr(self.embedder, "loaded", True) else "loading"
        checks["ready"] = (
            checks["database"] == "ok"
            and alive == self.workers.size
            and self.relay.is_alive()
            and self.heartbeat.is_alive()
        )
        return checks
