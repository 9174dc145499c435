"""`kops api`: the use cases behind HTTP, as many processes as you like. Uploads commit
their job with its outbox row; the relay (another process) publishes them, so an upload is
accepted while the broker is down."""

from __future__ import annotations

import logging
import time

from fastapi import FastAPI

from knowledgeops.api import app as http
from knowledgeops.mcp_server import http as mcp_http
from knowledgeops.roles import wiring
from knowledgeops.roles.base import DataRole
from knowledgeops.roles.first_key import check_auth
from knowledgeops.roles.logs import configure_logging
from knowledgeops.roles.preflight import check_database, check_index, check_schema
from knowledgeops.settings import DEFAULT_TENANT, Settings, load_settings
from knowledgeops.ui import app as ui

log = logging.getLogger(__name__)

BROKER_CHECK_S = 5.0  # s: /readyz asks the broker at most this often


class ApiRole(DataRole):
    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)  # its embedder embeds search queries
        self.started_at: float | None = None
        # nothing to wake: the relay, another process, scans the outbox every interval
        self.service = self.use_cases(notify=lambda: None, readiness=self.readiness)
        self._broker_seen: tuple[float, str] | None = None

    def app(self) -> FastAPI:
        app = http.create_app(self.service, on_start=self.start, on_stop=self.stop)
        ui.install(app)  # the dashboard at /ui, on the same app and streams
        mcp_http.install(app, self.settings)  # the MCP server at /mcp
        return app

    def start(self) -> None:
        started = time.perf_counter()
        check_database(self.db)
        check_schema(self.db)
        check_index(self.index, self.db)
        self.service.datasets.ensure_default(DEFAULT_TENANT)
        check_auth(self.settings, self.service.keys, first_key=False)  # `kops keys create`
        wiring.preload(self.embedder)
        self.started_at = time.perf_counter()
        log.info("api runtime started in %.2f s", self.started_at - started)

    def stop(self) -> None:
        self.index.close()  # the keyword index it keeps, committed: the next process opens it
        self.db.dispose()

    def readiness(self) -> dict[str, object]:
        """Ready when the database answers. The broker's state is shown but does not decide:
        uploads are accepted into the outbox while it is down, so taking the API out of a load
        balancer then would refuse work that could be accepted."""
        checks: dict[str, object] = {"database": self.database_check()}
        if self.settings.broker_url is not None:
            checks["broker"] = self._broker_check(self.settings.broker_url.get_secret_value())
        checks["model"] = "loaded" if self.embedder.loaded else "loading"
        checks["ready"] = checks["database"] == "ok"
        return checks

    def _broker_check(self, url: str) -> str:
        from knowledgeops.jobs.celery_dispatch import broker_status  # noqa: PLC0415 (celery: heavy, only with a broker)

        now = time.monotonic()
        if self._broker_seen is None or now - self._broker_seen[0] > BROKER_CHECK_S:
            self._broker_seen = (now, broker_status(url))
        return self._broker_seen[1]


def create_app() -> FastAPI:
    """The app of one `kops api` process (uvicorn's factory; settings from the environment:
    `kops api --workers N` spawns fresh interpreters, which log like the parent process)."""
    settings = load_settings()
    configure_logging(settings.log_level)
    return ApiRole(settings).app()
