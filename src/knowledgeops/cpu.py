"""The CPU this process may use: how many cores, and how busy they are.

A container given "2 CPUs" on a 64-core host may use 2 (a cgroup v2 quota), and a process pinned
to some cores (its affinity) only those: the model's threads are sized by `usable_cores`, and
the embedded graphs' upkeep watches the same cores for one to spare (ingest/index/stage.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psutil

CGROUP = Path("/sys/fs/cgroup")


def _affinity() -> list[int] | None:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _quota_cores() -> int | None:
    """The cores a cgroup v2 CPU quota allows (rounded up); None without a quota."""
    try:
        quota, period = (CGROUP / "cpu.max").read_text().split()[:2]
        if quota == "max":
            return None
        return max(1, -(-int(quota) // int(period)))
    except (OSError, ValueError):
        return None


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota
    (a container given "2 CPUs" on a 64-core host gets 2, not 64)."""
    affinity = _affinity()
    cores = len(affinity) if affinity else (os.cpu_count() or 1)
    quota = _quota_cores()
    return max(1, min(cores, quota) if quota is not None else cores)


class BusyCpu:
    """Seconds of CPU spent busy, since some fixed moment, on the cores this process may use:
    its cgroup's own usage under a quota (the host's other tenants are not its business),
    else the busy time of the cores of its affinity, from the kernel's per-core counters."""

    def __init__(self) -> None:
        self.cores = usable_cores()
        self._quota = _quota_cores() is not None
        self._affinity = _affinity()

    def seconds(self) -> float | None:
        """None where it cannot be read (no /proc/stat, no cgroup counters)."""
        if self._quota:
            return _cgroup_usage_s()
        try:
            per_core = psutil.cpu_times(percpu=True)
        except (OSError, psutil.Error):
            return None
        cores = self._affinity if self._affinity else range(len(per_core))
        return sum(_busy(per_core[core]) for core in cores if core < len(per_core))


def _busy(times: Any) -> float:
    idle = times.idle + getattr(times, "iowait", 0.0)
    # a guest's time is counted in user and nice already (Linux)
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return float(total - idle)


def _cgroup_usage_s() -> float | None:
    try:
        for line in (CGROUP / "cpu.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "usage_usec":
                return int(value) / 1e6
    except (OSError, ValueError):
        return None
    return None
