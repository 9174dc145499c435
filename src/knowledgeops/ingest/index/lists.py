"""A dataset's vectors in inverted lists of int8 codes: the embedded index's approximate search
(graphs.py keeps one per large dataset; docs/architecture.md: Vector search at a million chunks).

faiss's IVF with an 8-bit scalar quantizer, on unit vectors by inner product (the cosine):
`lists_for(n)` centroids are trained on a sample of the dataset, each vector is kept in the list
of its nearest centroid as 8-bit codes (a byte a dimension), and a search scans the codes of the
share of the lists nearest to the question (`PROBE_SHARE`) and returns the best `want`, which the
caller scores exactly against the database.

Why lists and not a graph: a vector is taken in by finding its nearest centroid, 0.04 ms of one
core at a million chunks, where an HNSW graph's insert walked the graph for 2.3 to 4.5 ms, 4 to
15% of the CPU the model spends embedding a chunk (docs/performance.md). The scan costs what the
graph's walk cost at the same recall on the bench's vectors, and a quarter of its memory.

Lists trained on a dataset of one size serve it as it grows, but their centroids stop fitting:
`stale` says when they hold `REGROW` times the vectors they were trained for, and the keeper
trains new ones from the database.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import cast

import faiss
import numpy as np
import numpy.typing as npt

from knowledgeops.cpu import usable_cores

# chosen by measurement (docs/performance.md: Inverted lists instead of graphs)
LISTS_MIN = 8
LISTS_MAX = 4096
TRAIN_PER_LIST = 64  # sample vectors per centroid trained (faiss asks for 39 at least)
PROBE_SHARE = 0.625  # of the lists a search scans, nearest first …
PROBE_SHARE_FUSED = 0.5625  # … (a hybrid search's vector list) …
PROBE_MIN_VECTORS = 200_000  # … and lists holding this many vectors at least (all of a smaller
# dataset's: a scan of 200,000 codes takes a few ms, and a small dataset's lists are small, so a
# share of them finds less: recall@10 0.95 at 20,000 chunks where 0.98 at 180,000)
REGROW = 4  # lists holding this many times the vectors they were trained for are retrained
SEARCH_THREADS = min(8, usable_cores())  # a search scans its lists on every core (8 at most)


def lists_for(n: int) -> int:
    """How many lists for a dataset of n vectors: the power of two nearest to √n (a list holds
    about as many vectors as there are lists), within LISTS_MIN and LISTS_MAX."""
    if n <= 1:
        return LISTS_MIN
    return int(min(LISTS_MAX, max(LISTS_MIN, 2 ** round(math.log2(math.sqrt(n))))))


def sample_size(n: int) -> int:
    """How many of a dataset's n vectors train its lists."""
    return min(n, TRAIN_PER_LIST * lists_for(n))


def units(vectors: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """The rows as unit vectors, float32, contiguous (a zero row stays zero)."""
    rows = np.atleast_2d(np.asarray(vectors, dtype=np.float32))
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    norms[norms == 0.0] = 1.0
    return np.ascontiguousarray(rows / norms)


class Lists:
    """One dataset's inverted lists. Not safe for a search during an add or a remove: the keeper
    holds the dataset's lock for each (graphs.py)."""

    def __init__(self, index: faiss.IndexIVFScalarQuantizer, trained_for: int) -> None:
        self.index = index
        self.trained_for = trained_for  # the dataset's size when its centroids were trained
        # a search of one question scans its lists on several threads (faiss's parallel_mode 1;
        # the default spreads a batch's questions instead)
        index.parallel_mode = 1
        self.dimension = int(index.d)
        self._keys: set[int] = set(_held(index))

    @classmethod
    def trained(cls, sample: npt.ArrayLike, planned: int) -> Lists:
        """Empty lists whose centroids and int8 ranges are trained on `sample`, for a dataset
        of `planned` vectors."""
        rows = units(sample)
        if not len(rows):
            raise ValueError("lists are trained on one vector at least")
        count = min(lists_for(planned), len(rows))
        quantizer = faiss.IndexFlatIP(rows.shape[1])
        index = faiss.IndexIVFScalarQuantizer(
            quantizer,
            rows.shape[1],
            count,
            faiss.ScalarQuantizer.QT_8bit,
            faiss.METRIC_INNER_PRODUCT,
        )
        # removes and lookups by key without a scan of every list
        index.set_direct_map_type(faiss.DirectMap.Hashtable)  # type: ignore[attr-defined]
        index.cp.min_points_per_centroid = 1  # a small dataset trains as many as it has
        faiss.omp_set_num_threads(1)  # this thread's setting: upkeep takes one core at most
        index.train(rows)
        return cls(index, max(1, planned))

    @classmethod
    def restore(cls, path: str, trained_for: int) -> Lists:
        return cls(cast("faiss.IndexIVFScalarQuantizer", faiss.read_index(path)), trained_for)

    def save(self, path: str) -> None:
        faiss.write_index(self.index, path)

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def __contains__(self, key: int) -> bool:
        return key in self._keys

    @property
    def lists(self) -> int:
        return int(self.index.nlist)

    @property
    def stale(self) -> bool:
        """The lists hold REGROW times the vectors they were trained for: train new ones."""
        return len(self) >= REGROW * self.trained_for and len(self) >= 2 * LISTS_MIN

    def add(self, keys: Iterable[int], vectors: npt.ArrayLike) -> None:
        """Keep the vectors under their keys (a key held already is replaced: faiss would keep
        both codes under it, one that no remove reaches)."""
        ids = np.fromiter((int(key) for key in keys), dtype=np.int64)
        rows = units(vectors)
        if len(ids) != len(rows):
            raise ValueError(f"{len(ids)} keys for {len(rows)} vectors")
        if not len(ids):
            return
        if len(set(ids.tolist())) != len(ids):
            raise ValueError("a key is given twice")
        self.remove(key for key in ids.tolist() if key in self._keys)
        faiss.omp_set_num_threads(1)  # this thread's setting: upkeep takes one core at most
        self.index.add_with_ids(rows, ids)
        self._keys.update(int(key) for key in ids)

    def remove(self, keys: Iterable[int]) -> int:
        """Drop the keys held: how many were."""
        held = np.fromiter((int(key) for key in keys if key in self._keys), dtype=np.int64)
        if not len(held):
            return 0
        faiss.omp_set_num_threads(1)
        # the hash table's remove takes the keys as an array (a batch selector would scan)
        selector = faiss.IDSelectorArray(len(held), faiss.swig_ptr(held))
        removed = int(self.index.remove_ids(selector))
        self._keys.difference_update(int(key) for key in held)
        return removed

    def search(
        self,
        vector: npt.ArrayLike,
        want: int,
        share: float = PROBE_SHARE,
        selector: faiss.IDSelector | None = None,
    ) -> list[int]:
        """The keys of the `want` vectors nearest to `vector` in the `share` of the lists nearest
        to it (more where that holds fewer than PROBE_MIN_VECTORS), nearest first (by their int8
        codes: the caller scores them exactly); of the keys `selector` admits only, where
        given (the others' distances are not computed)."""
        if want <= 0 or not len(self):
            return []
        share = max(share, PROBE_MIN_VECTORS / len(self))
        probes = max(1, min(self.lists, math.ceil(share * self.lists)))
        params = faiss.SearchParametersIVF()
        params.nprobe = probes
        if selector is not None:
            params.sel = selector
        faiss.omp_set_num_threads(SEARCH_THREADS)
        _, found = self.index.search(units(vector), want, params=params)
        return [int(key) for key in found[0] if key >= 0]

    @property
    def memory_bytes(self) -> int:
        """The codes, their keys, the centroids and the lookup by key (the hash table's and this
        object's own, about 100 bytes a key together)."""
        codes = len(self) * (int(self.index.code_size) + 8)
        return codes + self.lists * self.dimension * 4 + len(self) * 100


def _held(index: faiss.IndexIVF) -> Iterable[int]:
    """Every key the lists hold."""
    lists = index.invlists
    if lists is None:
        return
    for number in range(index.nlist):
        size = lists.list_size(number)
        if size:
            yield from faiss.rev_swig_ptr(lists.get_ids(number), size).tolist()
