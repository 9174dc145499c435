"""Thread CPU priority: workers and the model run below the API's threads (KOPS_WORKER_NICE)."""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger(__name__)


def lower_priority(nice: int) -> bool:
    """Lower the calling thread's CPU priority by `nice` (Linux: nice is per thread). Threads it
    starts afterwards inherit it. False where that is not possible."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return False
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError as exc:
        log.warning("could not lower the priority of %s: %s", threading.current_thread().name, exc)
        return False
    return True
