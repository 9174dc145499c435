"""Wiring, in one place: every process role built from `Settings`, started and stopped.

- `Embedded` (`kops serve`): one process holds it all (DESIGN.md §2): SQLite, the in-process
  queue, the relay thread, the heartbeat thread and the worker threads, plus the use cases.
- `ApiRuntime` (`kops api`): the use cases only; uploads are recorded with their outbox row and
  the relay publishes them.
- `WorkerRuntime` (`kops worker`, inside each Celery worker process): the pipeline, the runner
  and the heartbeat.
- `RelayRuntime` (`kops relay`): the relay publishing to Celery, active only while it holds the
  leader lock.

Adapters are chosen here from the settings (SQLite or PostgreSQL index, SQL or Redis cache); the
layers below never look at the settings themselves.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from knowledgeops.blobs import LocalBlobStore
from knowledgeops.db.engine import Database
from knowledgeops.db.migrate import upgrade
from knowledgeops.db.schema import utcnow
from knowledgeops.ingest.chunker import HFTokenizer
from knowledgeops.ingest.embedders.base import Embedder
from knowledgeops.ingest.embedders.cache import (
    CachedEmbedder,
    EmbeddingCache,
    RedisEmbeddingCache,
    SqlEmbeddingCache,
)
from knowledgeops.ingest.embedders.limits import ConcurrencyLimit, LocalLimit, RedisLimit
from knowledgeops.ingest.embedders.local import LocalMiniLM, load_tokenizer
from knowledgeops.ingest.embedders.onnx_int8 import OnnxMiniLM
from knowledgeops.ingest.embedders.openai import KeySource, OpenAIEmbedder
from knowledgeops.ingest.embedders.scheduler import ModelScheduler
from knowledgeops.ingest.index.pgvector import PgVectorIndex
from knowledgeops.ingest.index.sqlite import SqliteIndex
from knowledgeops.ingest.lifecycle import DocumentLifecycle
from knowledgeops.ingest.parsers.isolated import InlineParsing, IsolatedParsing
from knowledgeops.ingest.pipeline import IngestPipeline
from knowledgeops.jobs.dispatch import Dispatcher
from knowledgeops.jobs.heartbeat import Heartbeat
from knowledgeops.jobs.inprocess import InProcessQueue
from knowledgeops.jobs.relay import Relay
from knowledgeops.jobs.retry import RetryPolicy
from knowledgeops.jobs.runner import Handler, Runner
from knowledgeops.jobs.sql_store import SqlJobStore
from knowledgeops.jobs.store import LeaseLost
from knowledgeops.jobs.worker_pool import WorkerPool
from knowledgeops.lockfile import DataDirLock
from knowledgeops.service.blob_refs import sweep_unreferenced
from knowledgeops.service.datasets import DatasetDefaults, Datasets
from knowledgeops.service.documents import Documents
from knowledgeops.service.jobs import Jobs
from knowledgeops.service.keys import DEFAULT_TENANT, ApiKeys
from knowledgeops.service.search import Search
from knowledgeops.service.uploads import Uploads
from knowledgeops.settings import Settings

log = logging.getLogger(__name__)

Index = SqliteIndex | PgVectorIndex
BROKER_CHECK_S = 5.0  # s: /readyz asks the broker at most this often


def make_index(db: Database, dimension: int) -> Index:
    return SqliteIndex(db, dimension) if db.is_sqlite else PgVectorIndex(db, dimension)


def model_dimension(settings: Settings) -> int:
    """The configured model's vector size, known without loading the model (the relay and
    `kops migrate` need it for the index tables)."""
    if settings.embedder == "openai":
        return settings.openai_dimensions
    return LocalMiniLM.dimension


def make_model(settings: Settings) -> Embedder:
    if settings.embedder == "openai":
        limit: ConcurrencyLimit = (
            RedisLimit(
                settings.cache_url.get_secret_value(),
                settings.openai_concurrency,
                lease_s=settings.openai_timeout_s + 30,
            )
            if settings.cache_url is not None
            else LocalLimit(settings.openai_concurrency)
        )
        key = settings.openai_api_key
        return OpenAIEmbedder(
            base_url=settings.openai_base_url,
            model=settings.openai_model,
            dimension=settings.openai_dimensions,
            keys=KeySource(
                key.get_secret_value() if key is not None else None,
                settings.openai_api_key_file,
            ),
            limit=limit,
            timeout_s=settings.openai_timeout_s,
        )
    if settings.model_variant == "int8":
        return OnnxMiniLM(settings.data_dir / "models", threads=settings.model_threads)
    return LocalMiniLM(threads=settings.model_threads)


def make_embedder(
    settings: Settings, db: Database, embedder: Embedder | None = None, *, nice: int = 0
) -> Embedder:
    """The model (or the one given, in tests), behind the embedding cache unless it is off. The
    local model runs in its own thread, fed in batches across documents (ModelScheduler), `nice`
    below the process's priority (the embedded default, whose API shares the process)."""
    model: Embedder = embedder or make_model(settings)
    if isinstance(model, LocalMiniLM | OnnxMiniLM):
        model = ModelScheduler(model, batch_size=settings.embed_batch_size, nice=nice)
    if not settings.embed_cache:
        return model
    cache: EmbeddingCache = (
        RedisEmbeddingCache(settings.cache_url.get_secret_value())
        if settings.cache_url is not None
        else SqlEmbeddingCache(db)
    )
    return CachedEmbedder(model, cache)


def direct_model(embedder: Embedder) -> Embedder:
    """The model itself, past the cache and the scheduler (search embeds a query at once, not
    behind the ingestion batches waiting for the model thread)."""
    if isinstance(embedder, CachedEmbedder):
        embedder = embedder.inner
    if isinstance(embedder, ModelScheduler):
        embedder = embedder.model
    return embedder


def close_embedder(embedder: Embedder) -> None:
    """Stop the model thread, if there is one."""
    inner = embedder.inner if isinstance(embedder, CachedEmbedder) else embedder
    if isinstance(inner, ModelScheduler):
        inner.close()


def preload(embedder: Embedder) -> None:
    """Load the model in the background so the first job or query does not wait for it; a model
    that must prove itself first (the int8 build and its check) loads now, and its failure stops
    the start with its message instead of failing every job."""
    load = getattr(embedder, "load", None)
    if not callable(load):
        return
    if getattr(direct_model(embedder), "load_before_ready", False):
        load()
        return
    threading.Thread(target=load, name="kops-model-load", daemon=True).start()


def retry_policy(settings: Settings) -> RetryPolicy:
    return RetryPolicy(settings.backoff_base_s, settings.backoff_max_s)


class Services(ABC):
    """The use cases the API and the CLI share, over one database and one file store; each
    process role says how it starts, stops and reports readiness."""

    runs_workers = False  # whether this process runs the pipeline beside the API

    def __init__(
        self,
        settings: Settings,
        *,
        embedder: Embedder | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.started_at: float | None = None
        self.db = Database(settings.resolved_database_url)
        self.blobs = LocalBlobStore(settings.data_dir)
        # workers sharing this process with the API run below it (KOPS_WORKER_NICE)
        nice = settings.worker_nice if self.runs_workers else 0
        self.embedder = make_embedder(settings, self.db, embedder, nice=nice)
        self.index: Index = make_index(self.db, self.embedder.dimension)
        self.store = SqlJobStore(self.db, DocumentLifecycle(self.index))

        notify = self.notify
        defaults = DatasetDefaults(
            self.embedder.model_id, settings.chunk_size, settings.chunk_overlap
        )
        self.keys = ApiKeys(self.db)
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
            max_waiting_jobs=settings.max_waiting_jobs,
        )
        # queries go to the model directly: caching each one would cost a write per search
        model = direct_model(self.embedder)
        if isinstance(model, OpenAIEmbedder):
            model = model.for_queries()  # a query does not queue behind ingestion for a slot
        self.search = Search(self.db, self.datasets, self.index, model)

    @abstractmethod
    def notify(self) -> None:
        """Called after a transaction wrote an outbox row."""

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    @abstractmethod
    def readiness(self) -> dict[str, object]:
        """What /readyz reports; `ready` says whether the process can serve."""

    def _check_auth(self, *, first_key: bool) -> None:
        """Warn when the API runs open; on a database without any key, create the first one
        (embedded default) and print it once: only its hash is kept."""
        if self.settings.auth == "off":
            log.warning(
                "KOPS_AUTH=off: the API is open to anyone who can reach it, all as one tenant; "
                "use this only on a trusted machine"
            )
            return
        secret = self.keys.ensure_first_key() if first_key else None
        if secret is not None:
            announce_first_key(secret, self.settings.data_dir)
        elif self.keys.count_active() == 0:
            log.warning(
                "no active API key: every request gets 401; create one with `kops keys create`"
            )

    def _database_check(self) -> str:
        try:
            self.db.ping()
        except Exception as exc:
            return f"unavailable: {type(exc).__name__}"
        return "ok"


FIRST_KEY_FILE = "first-api-key"


def announce_first_key(secret: str, data_dir: Path) -> None:
    """Show the first key once. On a terminal it is printed (stderr); otherwise (a service
    manager, a container) stderr is a log that is kept and shipped, so the key goes to a file
    only this user can read, and the log says where."""
    if sys.stderr.isatty():
        sys.stderr.write(
            "\n"
            "  An API key was created for the default tenant. It is shown only this once:\n\n"
            f"      {secret}\n\n"
            "  Send it as `Authorization: Bearer <key>` (the kops CLI reads KOPS_API_KEY).\n"
            "  More keys: `kops keys create --tenant T --name N`; list: `kops keys list`.\n\n"
        )
        sys.stderr.flush()
        return
    path = data_dir / FIRST_KEY_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secret + "\n")
    log.warning(
        "an API key was created for the default tenant and written to %s (readable only by "
        "this user); read it, then delete the file",
        path,
    )


def make_pipeline(
    settings: Settings, db: Database, blobs: LocalBlobStore, index: Index, embedder: Embedder
) -> IngestPipeline:
    limits = settings.parse_limits
    parsing = (
        IsolatedParsing(limits) if settings.parse_isolation == "process" else InlineParsing(limits)
    )
    return IngestPipeline(
        db,
        blobs,
        index,
        embedder,
        HFTokenizer(load_tokenizer()),
        batch_size=settings.embed_batch_size,
        parsing=parsing,
        part_pages=settings.pdf_part_pages,
    )


class Embedded(Services):
    runs_workers = True

    def __init__(
        self,
        settings: Settings,
        *,
        embedder: Embedder | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        super().__init__(settings, embedder=embedder, clock=clock)
        self.lock = DataDirLock(settings.data_dir)
        self.queue = InProcessQueue()
        policy = retry_policy(settings)
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
        self.pipeline = make_pipeline(settings, self.db, self.blobs, self.index, self.embedder)
        self.runner = Runner(
            self.store,
            self.pipeline,
            policy=policy,
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

    def notify(self) -> None:
        self.relay.wake()

    # --- lifecycle ------------------------------------------------------------------------------
    def acquire(self) -> None:
        """Take the data folder (raises DataDirLocked when another process has it)."""
        self.lock.acquire()

    def start(self) -> None:
        started = time.perf_counter()
        self.acquire()
        upgrade(self.db.engine)
        self.index.ensure()
        self.datasets.ensure_default(DEFAULT_TENANT)
        self._check_auth(first_key=True)
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
        self._release_unfinished()  # first: a parse cut short below must not fail its job
        self.pipeline.parsing.close()
        close_embedder(self.embedder)
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
        preload(self.embedder)

    def readiness(self) -> dict[str, object]:
        """What /readyz reports: the database answers and the background threads run."""
        checks: dict[str, object] = {"database": self._database_check()}
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


# --- scale-out roles ----------------------------------------------------------------------------
class ApiRuntime(Services):
    """`kops api`: the use cases behind HTTP. Uploads commit their job with its outbox row; the
    relay (another process) publishes them, so an upload is accepted while the broker is down."""

    _broker_seen: tuple[float, str] | None = None

    def notify(self) -> None:
        """Nothing to do: the relay, another process, scans the outbox every interval."""

    def start(self) -> None:
        from knowledgeops.preflight import check_database, check_index, check_schema

        started = time.perf_counter()
        check_database(self.db)
        check_schema(self.db)
        check_index(self.index, self.db)
        self.datasets.ensure_default(DEFAULT_TENANT)
        self._check_auth(first_key=False)  # keys come from `kops keys create` here
        preload(self.embedder)  # search embeds queries
        self.started_at = time.perf_counter()
        log.info("api runtime started in %.2f s", self.started_at - started)

    def stop(self) -> None:
        self.db.dispose()

    def readiness(self) -> dict[str, object]:
        """Ready when the database answers. The broker's state is shown but does not decide:
        uploads are accepted into the outbox while it is down, so taking the API out of a load
        balancer then would refuse work that could be accepted."""
        checks: dict[str, object] = {"database": self._database_check()}
        if self.settings.broker_url is not None:
            checks["broker"] = self._broker_check()
        checks["model"] = "loaded" if getattr(self.embedder, "loaded", True) else "loading"
        checks["ready"] = checks["database"] == "ok"
        return checks

    def _broker_check(self) -> str:
        from knowledgeops.jobs.celery_dispatch import broker_status

        now = time.monotonic()
        if self._broker_seen is None or now - self._broker_seen[0] > BROKER_CHECK_S:
            assert self.settings.broker_url is not None
            self._broker_seen = (now, broker_status(self.settings.broker_url.get_secret_value()))
        return self._broker_seen[1]


class WorkerRuntime:
    """One Celery worker process: the pipeline behind the shared `Runner`, with its heartbeat."""

    def __init__(
        self,
        settings: Settings,
        *,
        embedder: Embedder | None = None,
        handler_wrapper: Callable[[Handler], Handler] | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.settings = settings
        self.db = Database(settings.resolved_database_url)
        self.blobs = LocalBlobStore(settings.data_dir)
        self.embedder = make_embedder(settings, self.db, embedder)
        self.index: Index = make_index(self.db, self.embedder.dimension)
        self.store = SqlJobStore(self.db, DocumentLifecycle(self.index))
        self.heartbeat = Heartbeat(self.store, settings.heartbeat_interval_s, clock)
        self.pipeline = make_pipeline(settings, self.db, self.blobs, self.index, self.embedder)
        handler: Handler = self.pipeline
        if handler_wrapper is not None:
            handler = handler_wrapper(handler)
        self.runner = Runner(
            self.store,
            handler,
            policy=retry_policy(settings),
            heartbeat=self.heartbeat,
            clock=clock,
            owner_prefix=f"worker-{os.uname().nodename}-{os.getpid()}",
        )

    def start(self) -> None:
        self.heartbeat.start()
        preload(self.embedder)
        self.pipeline.parsing.prestart()  # Celery runs this process's jobs on this thread

    def stop(self) -> None:
        """Stop taking jobs; leases still held go back to the queue without using an attempt."""
        self.runner.stopping.set()
        for lease in self.heartbeat.held():
            try:
                self.store.release(lease, now=self.runner.clock())
            except LeaseLost:
                pass
            except Exception:
                log.warning("job %s: could not be released at shutdown", lease.job_id)
        self.heartbeat.stop()
        self.pipeline.parsing.close()
        close_embedder(self.embedder)
        self.db.dispose()


class RelayRuntime:
    """`kops relay`: the outbox relay publishing to the broker, while it holds the leader lock.

    A standby process runs the same loop and only tries the lock; when the active relay dies its
    session ends, the lock is free, and the standby takes over on its next try."""

    def __init__(
        self,
        settings: Settings,
        dispatcher: Dispatcher,
        *,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        from knowledgeops.jobs.leader import AdvisoryLeader

        self.settings = settings
        self.db = Database(settings.resolved_database_url)
        self.index: Index = make_index(self.db, model_dimension(settings))
        self.store = SqlJobStore(self.db, DocumentLifecycle(self.index))
        self.dispatcher = dispatcher
        self.relay = Relay(
            self.store,
            dispatcher,
            policy=retry_policy(settings),
            stale_after_s=settings.stale_after_s,
            republish_after_s=settings.republish_after_s,
            interval_s=settings.relay_interval_s,
            clock=clock,
        )
        self.leader = AdvisoryLeader(settings.resolved_database_url)
        self.stopping = threading.Event()

    def run(self) -> None:
        """Until `stopping` is set: lead or stand by."""
        was_leader: bool | None = None
        while not self.stopping.is_set():
            try:
                leading = self.leader.try_acquire()
            except Exception as exc:
                log.warning("relay: cannot reach the database for the leader lock: %s", exc)
                leading = False
            if leading != was_leader:
                log.info("relay: %s", "active" if leading else "standing by")
                was_leader = leading
            if leading:
                try:
                    self.relay.run_once()
                except Exception:
                    log.exception("relay pass failed")
            self.stopping.wait(self.settings.relay_interval_s)
        self.leader.release()
        self.db.dispose()

    def stop(self) -> None:
        self.stopping.set()
