"""The CPU this process may use: how many cores, and how busy they are.

A container given "2 CPUs" on a 64-core host may use 2 (a cgroup v2 quota), and a process pinned
to some cores (its affinity) only those: the model's threads are sized by `usable_cores`, and
the embedded graphs' upkeep watches the same cores for one to spare (ingest/index/stage.py).
`OtherWork` says how many of them other processes keep busy: a hybrid search runs its two lists
side by side on free cores and in turn on taken ones (service/search.py).
"""

from __future__ import annotations

import functools
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import psutil

CGROUP = Path("/sys/fs/cgroup")


def _affinity() -> list[int] | None:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _quota() -> float | None:
    """The CPUs a cgroup v2 quota allows (`cpu.max` at the cgroup root this process sees: a
    container's own); None without a quota. cgroup v1 quotas are not read."""
    try:
        quota, period = (CGROUP / "cpu.max").read_text().split()[:2]
        if quota == "max":
            return None
        return max(0.01, int(quota) / int(period))
    except (OSError, ValueError, ZeroDivisionError):
        return None


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota
    rounded up (a container given "2 CPUs" on a 64-core host gets 2, not 64)."""
    affinity = _affinity()
    cores = len(affinity) if affinity else (os.cpu_count() or 1)
    quota = _quota()
    return max(1, min(cores, math.ceil(quota)) if quota is not None else cores)


class BusyCpu:
    """Seconds of CPU spent busy, since some fixed moment, on the CPU this process may use, and
    how much that is (`capacity`, in cores: under a quota of 2.2 CPUs, 2.2). Under a quota, its
    cgroup's own usage (the host's other tenants are not its business); else the busy time of
    the cores of its affinity, each read by its number from /proc/stat (Linux), or of the whole
    machine where that cannot be done (another system, a core of the affinity not listed)."""

    def __init__(self) -> None:
        affinity = _affinity()
        quota = _quota()
        self._quota = quota is not None and _cgroup_usage_s() is not None
        per_core = _per_core_busy()
        if affinity and per_core is not None and all(core in per_core for core in affinity):
            self._cores: list[int] | None = affinity
            cores = float(len(affinity))
        else:  # the whole machine's counters
            self._cores = None
            cores = float(os.cpu_count() or 1)
        self.capacity = min(cores, quota) if self._quota and quota is not None else cores

    def seconds(self) -> float | None:
        """None where it cannot be read."""
        if self._quota:
            return _cgroup_usage_s()
        if self._cores is not None:
            per_core = _per_core_busy()
            if per_core is not None:
                return sum(per_core.get(core, 0.0) for core in self._cores)
        try:
            return _busy(psutil.cpu_times())
        except (OSError, psutil.Error):
            return None


OTHER_WORK_CORES = 0.5  # cores other processes keep busy from which they count as working
OTHER_WORK_WINDOW_S = 0.5  # s: the shortest stretch their use is measured over


class OtherWork:
    """How many of the usable cores other processes kept busy lately: the busy CPU (`BusyCpu`)
    less this process's own, over the stretch since the last measure (OTHER_WORK_WINDOW_S at
    least: a measure asked for sooner answers the last one, without reading /proc again).
    This process's own threads are left out whatever they do (its searches, and its model,
    which runs `nice` below them); a parser's child process or any other program counts.
    The first ask has nothing to compare with and answers 0."""

    def __init__(self, window_s: float = OTHER_WORK_WINDOW_S) -> None:
        self.window_s = window_s
        self.cpu = BusyCpu()
        self._lock = threading.Lock()
        self._since: tuple[float, float, float] | None = None  # wall, busy CPU, own CPU
        self._cores: float | None = 0.0

    def cores(self) -> float | None:
        """Other processes' busy cores; None where the CPU cannot be read."""
        now = time.monotonic()
        if not self._lock.acquire(blocking=False):  # another search measures right now
            return self._cores
        try:
            if self._since is not None and now - self._since[0] < self.window_s:
                return self._cores
            busy, own = self.cpu.seconds(), time.process_time()
            if busy is None:
                self._cores = None
                return None
            if self._since is not None:
                began, busy_then, own_then = self._since
                others = ((busy - busy_then) - (own - own_then)) / (now - began)
                self._cores = max(0.0, others)
            self._since = (now, busy, own)
            return self._cores
        finally:
            self._lock.release()

    def busy(self) -> bool:
        """Other processes keep OTHER_WORK_CORES or more busy (or their use cannot be read)."""
        cores = self.cores()
        return cores is None or cores >= OTHER_WORK_CORES


@functools.cache
def other_work() -> OtherWork:
    """The process's one measure of other processes' CPU (each asker shares its window)."""
    return OtherWork()


USER_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _per_core_busy() -> dict[int, float] | None:
    """Each core's busy seconds by its number (the `cpuN` lines of /proc/stat, which list the
    online cores only); None off Linux."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    found: dict[int, float] = {}
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        try:
            ticks = [int(value) for value in rest.split()]
        except ValueError:
            continue
        # user nice system idle iowait irq softirq steal guest guest_nice: a guest's time is
        # counted in user and nice already
        busy = sum(ticks[:8]) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)
        found[int(name[3:])] = busy / USER_HZ
    return found or None


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
