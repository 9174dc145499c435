"""The graphs' stage (ingest/index/stage.py): the chunks a graph has not taken in yet, scored
exactly by each search, taken in the order logged; and the watch for a spare core, against the
machine's real CPU."""

from __future__ import annotations

import math
import multiprocessing
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from knowledgeops.ingest.index import stage
from knowledgeops.ingest.index.stage import SpareCores, Stage


def unit(rng: np.random.Generator, n: int, dimension: int = 16) -> np.ndarray:
    vectors = rng.normal(size=(n, dimension)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_the_nearest_staged_are_exact_and_dropped_ones_never_answer() -> None:
    rng = np.random.default_rng(1)
    vectors = unit(rng, 500)
    staged = Stage(16)
    for n, vector in enumerate(vectors):
        staged.put(1000 + n, 10 + n, 3.0 * vector)  # any length: cosine
    for n in range(0, 500, 3):
        staged.drop(1000 + n)
    live = [n for n in range(500) if n % 3]
    for question in unit(rng, 20):
        scores = vectors[live] @ question
        best = {1000 + live[i] for i in np.argsort(-scores)[:10]}
        assert set(staged.nearest(question, 10)) == best
    assert len(staged) == len(live)
    assert set(staged.nearest(vectors[0], 10_000)) == {1000 + n for n in live}


def test_chunks_are_taken_in_the_order_logged_and_the_floor_follows() -> None:
    rng = np.random.default_rng(2)
    vectors = unit(rng, 10)
    staged = Stage(16)
    assert staged.floor() is None
    for n in range(10):
        staged.put(n, 100 + n, vectors[n])
    staged.drop(0)
    staged.put(3, 110, vectors[3])  # logged again: its later row is the one that counts
    assert staged.floor() == 100  # seq 1, log row 101, is the first still staged
    seqs, taken = staged.take(3)
    assert seqs == [1, 2, 4]
    np.testing.assert_allclose(taken, vectors[[1, 2, 4]], rtol=1e-6)
    assert staged.floor() == 104  # seq 5's row
    assert 3 in staged
    assert 1 not in staged
    seqs, _ = staged.take(100)
    assert seqs == [5, 6, 7, 8, 9, 3]
    assert staged.floor() is None
    assert len(staged) == 0
    assert staged.nearest(vectors[0], 5) == []


def test_a_stage_that_grows_and_empties_keeps_every_live_chunk() -> None:
    """Rows are used again once all are taken, and the dead ones go when the arrays grow."""
    rng = np.random.default_rng(3)
    vectors = unit(rng, 3000)
    staged = Stage(16)
    expected: dict[int, int] = {}
    for n in range(3000):
        staged.put(n, n + 1, vectors[n])
        expected[n] = n
        if n % 7 == 0:
            seqs, _ = staged.take(3)
            for seq in seqs:
                del expected[seq]
        if n % 11 == 0 and n - 5 in expected:
            staged.drop(n - 5)
            del expected[n - 5]
    assert len(staged) == len(expected)
    assert set(staged.nearest(vectors[0], 3000)) == set(expected)
    for seq in rng.choice(sorted(expected), 20):
        assert staged.nearest(vectors[seq], 1) == [seq]
    seqs, taken = staged.take(3000)
    assert seqs == sorted(expected)  # staged in seq order here: taken in that order
    np.testing.assert_allclose(taken, vectors[seqs], rtol=1e-6)
    assert staged.memory_bytes() > 0


def test_chunks_logged_again_and_again_behind_one_that_waits_do_not_pile_up() -> None:
    """A chunk staged long ago holds the first row; the dead rows behind it go when the
    arrays fill, so the stage's size follows its live chunks, not the log's length."""
    rng = np.random.default_rng(4)
    vectors = unit(rng, 101)
    staged = Stage(16)
    staged.put(0, 1, vectors[0])
    log_id = 1
    for _ in range(200):
        for seq in range(1, 101):
            log_id += 1
            staged.put(seq, log_id, vectors[seq])
    assert len(staged) == 101
    assert staged.memory_bytes() <= 512 * (16 * 4 + 2 * 8)  # 512 rows at most, not 20,001
    assert staged.floor() == 0
    assert set(staged.nearest(vectors[0], 200)) == set(range(101))
    seqs, _ = staged.take(1000)
    assert seqs == list(range(101))


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@contextmanager
def spinning(cores: int, seconds: float) -> Iterator[None]:
    """A process spinning on each of `cores` cores for `seconds` (or until the block ends)."""
    context = multiprocessing.get_context("spawn")
    spinners = [context.Process(target=_spin, args=(seconds,)) for _ in range(cores)]
    for spinner in spinners:
        spinner.start()
    try:
        time.sleep(1.0)  # every spinner running
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.join()


def test_no_core_is_spare_while_every_core_is_busy_and_one_is_once_they_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stage, "SLICE_S", 0.2)
    cores = math.ceil(SpareCores().capacity)  # the cores this process may use
    with spinning(cores, 6.0):
        spare = SpareCores()
        answers = []
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            answers.append(spare.allow())
            time.sleep(0.05)
        assert len(answers) > 20
        assert not any(answers)
    spare = SpareCores()
    deadline = time.monotonic() + 20.0  # other tests' processes may still be winding down
    while not spare.allow():
        assert time.monotonic() < deadline, "no spare core on a resting machine"
        time.sleep(0.05)
    assert spare.allow()  # within its slice
    time.sleep(0.25)
    assert not spare.allow()  # the slice is over: the machine is watched again first
