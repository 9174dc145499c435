"""Fault injection for the chaos suite, off unless `KOPS_FAULT` names a point.

    KOPS_FAULT=before_complete   the worker process dies (exit 137, no clean-up, as kill -9)
                                 after the job's last index write and before it is marked
                                 completed
    KOPS_FAULT_ONCE=/path        with it, only the first process to reach the point dies: it
                                 creates this file, and the point is spent for everyone

Nothing in production sets these; the point costs one dictionary lookup when off.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

POINTS = frozenset({"before_complete"})
KILLED_EXIT = 137  # what a shell reports for a process killed by SIGKILL


def hit(point: str) -> None:
    """Die here if the environment says so."""
    if os.environ.get("KOPS_FAULT") != point:
        return
    marker = os.environ.get("KOPS_FAULT_ONCE")
    if marker:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return  # another process already died here
        os.write(fd, f"{os.getpid()}\n".encode())
        os.close(fd)
    log.error("fault injection: dying at %s (KOPS_FAULT)", point)
    logging.shutdown()
    os._exit(KILLED_EXIT)
