"""Many chunks of real text, and their vectors, made fast: the corpus of `kops bench search`.

A million chunks cannot be cut from one FAQ without repeating: windows of one text shifted by
a word are near-duplicates, and near-duplicates make recall meaningless. So each chunk is made
of `PIECES` pieces of `PIECE_WORDS` words, each from a random place of a random page of the
Debian FAQ in all its languages (the pages in eval/, in the repository): real words in real
order, every chunk different.

The vectors are the `HashingEmbedder`'s (lab/embedders.py), computed for whole batches at once:
its vector of a text is the normalised sum of one signed unit per word, so the sum over a
piece is a difference of running sums over the page's words, and a chunk's is the sum over its
pieces. `tests/unit/lab/test_passages.py` holds this equal to `HashingEmbedder.vector`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from knowledgeops.lab.eval import baselines
from knowledgeops.lab.eval.collections import load

PIECES = 5
PIECE_WORDS = 30
_WORD = re.compile(r"\w+", re.UNICODE)  # as HashingEmbedder tokenises


@dataclass
class Batch:
    texts: list[str]
    vectors: npt.NDArray[np.float32]  # unit rows


class Passages:
    """Pages as word lists with running sums of the embedder's signed units per word."""

    def __init__(self, pages: list[str], dimension: int, salt: str = "") -> None:
        self.dimension = dimension
        self.salt = salt
        self._units: dict[str, npt.NDArray[np.int32]] = {}
        self.words: list[list[str]] = []
        self.sums: list[npt.NDArray[np.int32]] = []  # (words + 1) × dimension per page
        for page in pages:
            words = page.split()
            if len(words) < PIECE_WORDS:
                continue
            rows = np.zeros((len(words) + 1, dimension), dtype=np.int32)
            for n, word in enumerate(words):
                rows[n + 1] = self._unit(word)
            np.cumsum(rows, axis=0, out=rows)
            self.words.append(words)
            self.sums.append(rows)
        if not self.words:
            raise ValueError("no page has enough words to cut passages from")

    def _unit(self, word: str) -> npt.NDArray[np.int32]:
        found = self._units.get(word)
        if found is None:
            found = np.zeros(self.dimension, dtype=np.int32)
            for token in _WORD.findall(word.lower()):
                digest = hashlib.blake2b((self.salt + token).encode(), digest_size=8).digest()
                found[int.from_bytes(digest[:4], "little") % self.dimension] += (
                    1 if digest[4] & 1 else -1
                )
            self._units[word] = found
        return found

    def batches(self, count: int, seed: int, size: int = 10_000) -> Iterator[Batch]:
        """`count` chunks, `size` at a time; the same seed gives the same chunks."""
        rng = np.random.default_rng(seed)
        lengths = np.array([len(words) for words in self.words])
        made = 0
        while made < count:
            n = min(size, count - made)
            pages = rng.integers(0, len(self.words), size=(n, PIECES))
            starts = (rng.random((n, PIECES)) * (lengths[pages] - PIECE_WORDS + 1)).astype(int)
            sums = np.zeros((n, self.dimension), dtype=np.float32)
            texts = []
            for row in range(n):
                pieces = []
                for page, start in zip(pages[row], starts[row], strict=True):
                    running = self.sums[page]
                    sums[row] += running[start + PIECE_WORDS] - running[start]
                    pieces.append(" ".join(self.words[page][start : start + PIECE_WORDS]))
                texts.append(" ".join(pieces))
            norms = np.linalg.norm(sums, axis=1, keepdims=True)
            empty = norms[:, 0] == 0.0
            sums[empty, 0] = 1.0
            norms[empty] = 1.0
            yield Batch(texts, sums / norms)
            made += n


def faq_pages(root: Path) -> list[str]:
    """The text of every page of every Debian FAQ collection under `root` (eval/)."""
    pages = []
    seen: set[Path] = set()
    for collection in load(root):
        for path in collection.documents:
            if path not in seen:
                seen.add(path)
                pages.append(baselines.body_text(path))
    return pages
