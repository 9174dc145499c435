"""The inverted lists of int8 codes that the embedded index searches large datasets through
(ingest/index/lists.py), on their own: what they hold, what a search returns at the shares the
index uses, and how many lists a dataset gets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from knowledgeops.ingest.index import lists
from knowledgeops.ingest.index.lists import Lists, lists_for, sample_size, units


def clustered(seed: int, count: int, dimension: int = 64, centres: int = 200) -> np.ndarray:
    """Vectors around random centres, as a model's embeddings of a corpus's topics are."""
    rng = np.random.default_rng(seed)
    middle = rng.standard_normal((centres, dimension))
    rows = middle[rng.integers(0, centres, count)] + 0.6 * rng.standard_normal((count, dimension))
    return units(rows)


def test_how_many_lists_a_dataset_gets() -> None:
    assert lists_for(1) == lists.LISTS_MIN
    assert lists_for(1_000) == 32  # √1000 ≈ 31.6
    assert lists_for(100_000) == 256  # √ ≈ 316: 2^8 is nearer than 2^9 on the log scale
    assert lists_for(1_000_000) == 1024
    assert lists_for(10**9) == lists.LISTS_MAX
    assert sample_size(500) == 500  # a small dataset trains on all of it
    assert sample_size(1_000_000) == lists.TRAIN_PER_LIST * 1024


def test_what_is_added_is_held_and_what_is_removed_is_gone() -> None:
    vectors = clustered(1, 2_000)
    index = Lists.trained(vectors[:500], 500)
    index.add(range(10, 2_010), vectors)
    assert len(index) == 2_000
    assert 10 in index
    assert 2_009 in index
    assert 9 not in index
    assert index.search(vectors[5], 1, 1.0) == [15]  # a vector's nearest is itself
    assert index.remove([15, 16, 99_999]) == 2  # the key never held is not counted
    assert len(index) == 1_998
    assert 15 not in index
    assert 15 not in index.search(vectors[5], 20, 1.0)
    index.add([15], vectors[5:6] * 3.0)  # added again (any length: the lists keep unit vectors)
    assert index.search(vectors[5], 1, 1.0) == [15]
    stored = index.index.reconstruct(15)  # read by key through the hash table
    assert float(stored @ vectors[5]) == pytest.approx(1.0, abs=0.01)  # int8: about the vector
    index.add([15], vectors[6:7])  # a key held is replaced, not kept twice
    assert len(index) == 1_999
    assert index.search(vectors[6], 1, 1.0) == [15]  # (16, whose vector it is, was removed)
    assert index.remove([15]) == 1
    assert 15 not in index.search(vectors[6], 50, 1.0)
    with pytest.raises(ValueError, match="3 keys for 2 vectors"):
        index.add([1, 2, 3], vectors[:2])
    with pytest.raises(ValueError, match="twice"):
        index.add([1, 1], vectors[:2])


def test_a_saved_copy_holds_the_same_keys_and_answers_the_same(tmp_path: Path) -> None:
    vectors = clustered(2, 3_000)
    index = Lists.trained(vectors, 3_000)
    index.add(range(3_000), vectors)
    index.remove(range(0, 3_000, 3))
    index.save(str(tmp_path / "lists"))
    copy = Lists.restore(str(tmp_path / "lists"), trained_for=3_000)
    assert (len(copy), copy.trained_for, copy.lists) == (2_000, 3_000, index.lists)
    assert 1 in copy
    assert 3 not in copy
    for row in (1, 500, 2_999):
        assert copy.search(vectors[row], 10) == index.search(vectors[row], 10)
    assert float(copy.index.reconstruct(1) @ vectors[1]) == pytest.approx(1.0, abs=0.01)
    copy.remove([1])  # the lookup by key came back too (reading a vector by key needs it)
    assert 1 not in copy.search(vectors[1], 10, 1.0)


def test_the_shares_chosen_find_the_nearest_ten_once_scored_exactly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The index asks the lists for 40 candidates and scores them exactly: on clustered
    vectors, the share a search scans finds nearly all of the exact top 10, a single list far
    less, and a dataset under PROBE_MIN_VECTORS is scanned whole whatever the share."""
    vectors = clustered(3, 20_000)
    index = Lists.trained(vectors[np.random.default_rng(0).choice(20_000, 8_000)], 20_000)
    index.add(range(20_000), vectors)
    questions = units(vectors[:200] + 0.5 * np.random.default_rng(4).standard_normal((200, 64)))
    exact = np.argsort(-(questions @ vectors.T), axis=1)[:, :10]

    def recall(share: float) -> float:
        found = 0
        for question, best in zip(questions, exact, strict=True):
            candidates = np.array(index.search(question, 40, share))
            scored = candidates[np.argsort(-(vectors[candidates] @ question))][:10]
            found += len(set(scored.tolist()) & set(best.tolist()))
        return found / (10 * len(questions))

    assert recall(0.0) == recall(1.0) >= 0.99  # 20,000 vectors: every list, at any share
    monkeypatch.setattr(lists, "PROBE_MIN_VECTORS", 0)  # as a dataset of millions is searched
    assert recall(lists.PROBE_SHARE) >= 0.98
    assert recall(lists.PROBE_SHARE_FUSED) >= 0.98
    assert recall(0.0) < 0.9
    assert recall(1.0) >= 0.99  # every list: only the int8 codes' ranking of the 40 errs


def test_lists_are_stale_once_they_hold_regrow_times_what_they_were_trained_for() -> None:
    vectors = clustered(5, 1_000)
    index = Lists.trained(vectors[:100], 100)
    index.add(range(399), vectors[:399])
    assert not index.stale
    index.add([399], vectors[399:400])
    assert index.stale  # 400 = REGROW × 100


def test_a_dataset_smaller_than_its_lists_still_trains_and_answers() -> None:
    vectors = clustered(6, 3)
    index = Lists.trained(vectors, 3)
    assert index.lists == 3
    index.add([7, 8, 9], vectors)
    assert index.search(vectors[1], 3, 1.0)[0] == 8
    assert index.search(vectors[1], 0) == []
    with pytest.raises(ValueError, match="one vector"):
        Lists.trained(np.zeros((0, 8), dtype=np.float32), 10)
