"""The model scheduler: one model thread, batches across callers sorted by length, and every
caller gets exactly the vectors the model gives its texts alone."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence

import numpy as np
import pytest

from knowledgeops.errors import PermanentError, TransientError, WorkerStopping
from knowledgeops.ingest.embedders.base import Vectors
from knowledgeops.ingest.embedders.scheduler import ModelScheduler, length_batches
from knowledgeops.jobs.priority import lower_priority
from knowledgeops.lab.embedders import HashingEmbedder


class RecordingEmbedder(HashingEmbedder):
    """Records each call's texts and the thread it ran on; the first call can be held at a gate
    so that requests pile up behind it; a text containing BAD is rejected like a bad input."""

    def __init__(self) -> None:
        super().__init__(dimension=64)
        self.calls_texts: list[list[str]] = []
        self.threads: set[str] = set()
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def embed(self, texts: Sequence[str]) -> Vectors:
        self.entered.set()
        assert self.gate.wait(10)
        self.calls_texts.append(list(texts))
        self.threads.add(threading.current_thread().name)
        if any("BAD" in t for t in texts):
            raise PermanentError("the model could not embed this text", code="bad_text")
        return super().embed(texts)


def texts_of(prefix: str, n: int, *, varied: bool = True) -> list[str]:
    """`n` texts; of varied lengths (so that sorting has something to do), or all alike."""
    if not varied:
        return [f"{prefix} {i:02d} word word word" for i in range(n)]
    return [f"{prefix} {i} " + "word " * ((i * 7) % 11) for i in range(n)]


@pytest.fixture
def model() -> RecordingEmbedder:
    return RecordingEmbedder()


@pytest.fixture
def scheduler(model: RecordingEmbedder) -> ModelScheduler:
    s = ModelScheduler(model, batch_size=4, nice=0)
    yield s  # type: ignore[misc]
    s.close()


def test_every_caller_gets_the_vectors_of_its_own_texts(
    model: RecordingEmbedder, scheduler: ModelScheduler
) -> None:
    requests = {f"doc{n}": texts_of(f"doc{n}", 3 + n) for n in range(6)}
    results: dict[str, Vectors] = {}

    def run(name: str) -> None:
        results[name] = scheduler.embed(requests[name])

    threads = [threading.Thread(target=run, args=(name,)) for name in requests]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    reference = HashingEmbedder(dimension=64)
    for name, texts in requests.items():
        np.testing.assert_array_equal(results[name], reference.embed(texts))
    assert model.threads == {"kops-model"}  # only the model thread ever ran the model


def test_waiting_requests_of_several_documents_share_batches_sorted_by_length(
    model: RecordingEmbedder, scheduler: ModelScheduler
) -> None:
    model.gate.clear()
    first = scheduler.submit(["held back"])
    assert model.entered.wait(5)  # the model thread is busy with `first`
    small = [scheduler.submit(texts_of(f"small{n}", 2, varied=False)) for n in range(3)]
    bigger = scheduler.submit(texts_of("bigger", 5, varied=False))
    model.gate.set()
    first.result(10)
    outputs = [f.result(10) for f in [*small, bigger]]
    assert [len(o) for o in outputs] == [2, 2, 2, 5]
    # after the held call: 11 texts of 4 documents in batches of 4, not one short batch each
    merged = model.calls_texts[1:]
    assert [len(batch) for batch in merged] == [4, 4, 3]
    assert {t.split()[0] for t in merged[0] + merged[1] + merged[2]} == {
        "small0",
        "small1",
        "small2",
        "bigger",
    }


def test_texts_of_varied_length_are_sorted_and_cut_where_lengths_part(
    model: RecordingEmbedder, scheduler: ModelScheduler
) -> None:
    model.gate.clear()
    first = scheduler.submit(["held back"])
    assert model.entered.wait(5)
    a = scheduler.submit(["x" * 100, "x" * 10, "x" * 50])
    b = scheduler.submit(["y" * 11, "y" * 101, "y" * 52, "y" * 12, "y" * 10])
    model.gate.set()
    first.result(10)
    assert len(a.result(10)) == 3
    assert len(b.result(10)) == 5
    assert [[len(t) for t in batch] for batch in model.calls_texts[1:]] == [
        [10, 10, 11, 12],  # batch size 4
        [50, 52],  # 100 is more than 10% longer than 50
        [100, 101],
    ]


def test_length_batches_bounds_size_and_padding() -> None:
    lengths = [200, 30, 31, 199, 120, 201, 32, 200, 200, 200, 200, 33]
    batches = length_batches(lengths, 4)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) <= 4
        longest, shortest = max(lengths[i] for i in batch), min(lengths[i] for i in batch)
        assert longest <= shortest * 1.1 + 4
    flat = [lengths[i] for batch in batches for i in batch]
    assert flat == sorted(flat)
    assert length_batches([], 4) == []


def test_a_text_the_model_rejects_fails_only_its_own_document(
    model: RecordingEmbedder, scheduler: ModelScheduler
) -> None:
    model.gate.clear()
    first = scheduler.submit(["held back"])
    assert model.entered.wait(5)
    good = scheduler.submit(texts_of("good", 3))
    bad = scheduler.submit(["fine text", "a BAD text"])
    model.gate.set()
    first.result(10)
    np.testing.assert_array_equal(
        good.result(10), HashingEmbedder(dimension=64).embed(texts_of("good", 3))
    )
    with pytest.raises(PermanentError):
        bad.result(10)


def test_empty_requests_and_closing(model: RecordingEmbedder) -> None:
    scheduler = ModelScheduler(model, batch_size=4, nice=0)
    assert scheduler.embed([]).shape == (0, 64)
    assert scheduler.embed(["one"]).shape == (1, 64)
    scheduler.close()
    with pytest.raises(WorkerStopping):  # a job then goes back to the queue, no attempt spent
        scheduler.embed(["after close"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_the_model_thread_runs_at_a_lower_priority(model: RecordingEmbedder) -> None:
    seen: dict[str, int] = {}
    original = model.embed

    def embed(texts: Sequence[str]) -> Vectors:
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        return original(texts)

    model.embed = embed  # type: ignore[method-assign]
    scheduler = ModelScheduler(model, batch_size=4, nice=7)
    try:
        scheduler.embed(["hello"])
    finally:
        scheduler.close()
    assert seen["nice"] == min(19, os.getpriority(os.PRIO_PROCESS, os.getpid()) + 7)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) < seen["nice"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_a_thread_lowered_twice_is_still_only_nice_below_the_main_thread() -> None:

    seen: list[int] = []

    def inner() -> None:
        lower_priority(5)
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    def outer() -> None:
        lower_priority(5)
        thread = threading.Thread(target=inner)  # starts at the outer thread's priority
        thread.start()
        thread.join()

    thread = threading.Thread(target=outer)
    thread.start()
    thread.join()
    assert seen == [min(19, os.getpriority(os.PRIO_PROCESS, os.getpid()) + 5)]


class Fatal(BaseException):
    """Something `except Exception` does not catch (as a bug or an interpreter error might be)."""


def test_a_model_thread_that_dies_fails_its_callers_and_the_next_request_starts_another(
    model: RecordingEmbedder,
) -> None:
    scheduler = ModelScheduler(model, batch_size=4, nice=0)
    original = model.embed
    calls = {"n": 0}

    def embed(texts: Sequence[str]) -> Vectors:
        calls["n"] += 1
        if calls["n"] == 1:
            raise Fatal
        return original(texts)

    model.embed = embed  # type: ignore[method-assign]
    try:
        with pytest.raises(TransientError) as caught:
            scheduler.embed(["first"])
        assert caught.value.code == "model_unavailable"  # a retry, not a failed document
        np.testing.assert_array_equal(
            scheduler.embed(["second"]), HashingEmbedder(dimension=64).embed(["second"])
        )
    finally:
        scheduler.close()


def test_close_hands_waiting_requests_back_and_lets_the_round_in_progress_finish(
    model: RecordingEmbedder,
) -> None:
    scheduler = ModelScheduler(model, batch_size=4, nice=0)
    model.gate.clear()
    running = scheduler.submit(["in progress"])
    assert model.entered.wait(5)
    waiting = scheduler.submit(["not started"])
    closer = threading.Thread(target=scheduler.close)
    closer.start()
    with pytest.raises(WorkerStopping):
        waiting.result(5)
    model.gate.set()
    assert running.result(5).shape == (1, 64)
    closer.join(5)
    assert not closer.is_alive()
