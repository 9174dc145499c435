"""Whether a retrieved passage answers a question, fair to passages of any size.

The answer is the text of the section that answers the question. A passage counts when most of
it lies inside that section, or when it holds most of that section (a big chunk that contains a
small section whole is a right answer, though most of it is other text). Both are measured on
shingles: overlapping runs of `SHINGLE` letters and digits after Unicode NFKC and case folding,
with spaces and punctuation dropped, so the judge reads Chinese, Japanese and Korean like any
other language and does not care how a parser put spaces or line breaks into the text.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

SHINGLE = 8  # characters per shingle: long enough that two sections rarely share one by chance
MOSTLY = 0.5  # "most of": more than half of the passage's, or of the answer's, shingles


def normalise(text: str) -> str:
    folded = unicodedata.normalize("NFKC", text).casefold()
    return "".join(ch for ch in folded if ch.isalnum())


def shingles(text: str) -> frozenset[str]:
    letters = normalise(text)
    if len(letters) <= SHINGLE:
        return frozenset({letters}) if letters else frozenset()
    return frozenset(letters[i : i + SHINGLE] for i in range(len(letters) - SHINGLE + 1))


@dataclass(frozen=True)
class Answer:
    """The judged answer of one question: its section's shingles."""

    shingles: frozenset[str]

    @classmethod
    def of(cls, text: str) -> Answer:
        return cls(shingles(text))

    def answered_by(self, passage: str) -> bool:
        found = shingles(passage)
        if not found or not self.shingles:
            return False
        shared = len(found & self.shingles)
        return shared > MOSTLY * len(found) or shared > MOSTLY * len(self.shingles)


def first_relevant(answer: Answer, passages: Sequence[str]) -> int | None:
    """The 1-based rank of the first passage that answers, or None."""
    for rank, passage in enumerate(passages, start=1):
        if answer.answered_by(passage):
            return rank
    return None


@dataclass(frozen=True)
class Scores:
    questions: int
    r1: float
    r5: float
    mrr10: float

    @classmethod
    def of(cls, ranks: Sequence[int | None]) -> Scores:
        n = max(1, len(ranks))
        return cls(
            questions=len(ranks),
            r1=round(sum(1 for r in ranks if r == 1) / n, 4),
            r5=round(sum(1 for r in ranks if r is not None and r <= 5) / n, 4),
            mrr10=round(sum(1 / r for r in ranks if r is not None and r <= 10) / n, 4),
        )
