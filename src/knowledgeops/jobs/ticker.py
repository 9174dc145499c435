"""A background thread that does one thing every interval, for the heartbeat and the relay: woken
early on request, stopped with a join, and never ended by a failing tick (it is logged; the next
tick tries again)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Ticker:
    """Runs `tick` in a daemon thread named `name` every `interval_s` seconds (the first time at
    once when `at_once`, else after one interval) until `stop()`; `wake()` runs it now. A tick
    that raises is logged as `failure`. The heartbeat and the relay are tickers."""

    def __init__(
        self,
        name: str,
        interval_s: float,
        tick: Callable[[], object],
        *,
        at_once: bool,
        failure: str,
        join_timeout_s: float,
    ) -> None:
        self.name = name
        self.failure = failure
        self.interval_s = interval_s
        self.tick = tick
        self.at_once = at_once
        self.join_timeout_s = join_timeout_s  # s: how long stop() waits for the thread
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Tick now rather than at the next interval (the relay: after an upload commits)."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.join_timeout_s)

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        if not self.at_once and self._wait():
            return
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # the database may be briefly unavailable; the next tick retries
                log.exception(self.failure)
            if self._wait():
                return

    def _wait(self) -> bool:
        """Wait out the interval (or a wake); True once stopped."""
        self._wake.wait(self.interval_s)
        self._wake.clear()
        return self._stop.is_set()
