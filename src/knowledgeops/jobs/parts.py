"""Split jobs: what a job waiting on its parts shows, summed from the parts (both stores).

A running job may hand its work to part jobs (`JobStore.split`); it then stays running, held by
no worker, and shows its parts' progress added up: processed chunks summed, the total once every
part knows its own, and the stage of the least advanced part still at work (from parsing on: the
job itself got that far before it split). Its last part to complete completes it; a part that
fails for good fails it, with the part's error, and the other parts are cancelled; cancelling
the job, or one of its parts, cancels them all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from knowledgeops.jobs.states import JobStatus, Stage

PART_KIND = "part"
_ORDER = list(Stage)


@dataclass(frozen=True, slots=True)
class PartState:
    status: JobStatus
    stage: Stage
    total_chunks: int | None
    processed_chunks: int


@dataclass(frozen=True, slots=True)
class Summed:
    stage: Stage
    total_chunks: int | None
    processed_chunks: int


def summed(parts: Iterable[PartState]) -> Summed:
    parts = list(parts)
    processed = sum(part.processed_chunks for part in parts)
    totals = [part.total_chunks for part in parts]
    total = None if any(t is None for t in totals) else sum(t for t in totals if t is not None)
    at_work = [_ORDER.index(p.stage) for p in parts if p.status is not JobStatus.COMPLETED]
    least = min(at_work) if at_work else _ORDER.index(Stage.INDEXING)
    stage = _ORDER[max(least, _ORDER.index(Stage.PARSING))]
    return Summed(stage, total, processed)


def part_budget(max_attempts: int, attempt: int) -> int:
    """Attempts each part of a job may use: what the job had left when it split (its own
    current attempt included)."""
    return max(max_attempts - attempt + 1, 1)
