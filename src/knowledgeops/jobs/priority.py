"""Thread CPU priority: workers and the model run below the API's threads (KOPS_WORKER_NICE)."""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger(__name__)


def lower_priority(nice: int) -> bool:
    """Set the calling thread's CPU priority `nice` below the process's main thread (Linux: nice
    is per thread; the main thread's id is the process id). Absolute, so a thread started by an
    already lowered one does not go lower still. Threads it starts afterwards inherit it. False
    where that is not possible."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return False
    try:
        base = os.getpriority(os.PRIO_PROCESS, os.getpid())
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, base + nice))
    except OSError as exc:
        log.warning("could not lower the priority of %s: %s", threading.current_thread().name, exc)
        return False
    return True
