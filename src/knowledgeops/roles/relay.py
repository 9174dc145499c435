"""`kops relay`: the outbox relay publishing to the broker, active only while it holds the leader
lock (docs/architecture.md, "The outbox and the relay").

A standby process runs the same loop and only tries the lock; when the active relay dies its
session ends, the lock is free, and the standby takes over on its next try."""

from __future__ import annotations

import logging
import threading

from knowledgeops.clock import Clock, utcnow
from knowledgeops.jobs.dispatch import Dispatcher
from knowledgeops.jobs.leader import AdvisoryLeader
from knowledgeops.roles import wiring
from knowledgeops.roles.base import Role
from knowledgeops.settings import Settings

log = logging.getLogger(__name__)


class RelayRole(Role):
    def __init__(self, settings: Settings, dispatcher: Dispatcher, *, clock: Clock = utcnow):
        super().__init__(settings, clock=clock)
        self.index = wiring.make_index(self.db, wiring.model_dimension(settings))
        self.store = wiring.make_store(self.db, self.index, settings)
        self.dispatcher = dispatcher
        self.relay = wiring.make_relay(settings, self.store, dispatcher, clock)
        self.leader = AdvisoryLeader(settings.resolved_database_url)
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Lead or stand by in a thread of its own, until `stop()`."""
        self._thread = threading.Thread(target=self._lead, name="kops-relay-leader", daemon=True)
        self._thread.start()

    def run(self) -> None:
        """`start()`, then wait for `stop()` (a signal handler calls it): `kops relay`."""
        self.start()
        assert self._thread is not None
        while self._thread.is_alive():
            self._thread.join(timeout=0.5)

    def stop(self) -> None:
        self.stopping.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def _lead(self) -> None:
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
