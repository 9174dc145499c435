"""Other processes' use of the cores (knowledgeops/cpu.py, `OtherWork`), against the machine's
real CPU: programs spinning beside this process count, this process's own threads do not."""

from __future__ import annotations

import hashlib
import math
import threading
import time

from knowledgeops.cpu import OTHER_WORK_CORES, OtherWork
from tests.unit.test_graph_stage import spinning


def _hash_until(stop: threading.Event) -> None:
    block = b"x" * (1 << 20)
    while not stop.is_set():
        hashlib.sha256(block).digest()  # the GIL released: every thread takes a core


def test_programs_beside_this_process_are_other_work() -> None:
    others = OtherWork(window_s=0.3)
    cores = math.ceil(others.cpu.capacity)
    with spinning(cores, 6.0):
        assert others.cores() == 0.0  # the first ask has nothing to compare with
        measured = []
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            time.sleep(0.35)
            measured.append(others.cores())
        assert len(measured) >= 6
        # a spinner on each core: most of them counted (the machine's ticks are 1/100 s)
        assert all(each is not None and each >= 0.75 * cores for each in measured), measured
        assert others.busy()


def test_this_process_on_every_core_is_not_other_work() -> None:
    others = OtherWork(window_s=0.5)
    cores = math.ceil(others.cpu.capacity)
    stop = threading.Event()
    threads = [threading.Thread(target=_hash_until, args=(stop,)) for _ in range(cores)]
    for thread in threads:
        thread.start()
    try:
        others.cores()
        deadline = time.monotonic() + 20.0  # other tests' processes may still be winding down
        while True:
            time.sleep(0.55)
            measured = others.cores()
            assert measured is not None
            if measured < OTHER_WORK_CORES:
                break
            assert time.monotonic() < deadline, f"{measured:.2f} cores counted as other work"
        assert not others.busy()
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def test_a_measure_asked_within_its_window_answers_the_last_one() -> None:
    others = OtherWork(window_s=60.0)
    others.cores()
    with spinning(1, 2.0):
        assert others.cores() == 0.0  # within the window: not measured again
