"""Split jobs: what a job waiting on its parts shows, summed from the parts (both stores).

A running job may hand its work to part jobs (`JobStore.split`); it then stays running, held by
no worker, and shows its parts' progress added up: processed chunks summed, the total once every
part knows its own, and a stage that says where the work is: embedding as soon as any part's
chunks are being embedded (or a part is done), indexing once every part still at work is past
embedding, before that the furthest of parsing or chunking a part has reached (from parsing on:
the job itself got that far before it split). Its last part to complete completes it; a part that
fails for good fails it, with the part's error, and the other parts are cancelled; cancelling
the job, or one of its parts, cancels them all.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from knowledgeops.jobs.model import Job, NewJob
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
    embedding, indexing = _ORDER.index(Stage.EMBEDDING), _ORDER.index(Stage.INDEXING)
    if not at_work or min(at_work) >= indexing:
        return Summed(Stage.INDEXING, total, processed)
    furthest = max(at_work)
    if len(at_work) < len(parts):  # a part is done: its chunks were embedded
        furthest = max(furthest, embedding)
    stage = _ORDER[max(min(furthest, embedding), _ORDER.index(Stage.PARSING))]
    return Summed(stage, total, processed)


def part_budget(max_attempts: int, attempt: int) -> int:
    """Attempts each part of a job may use: what the job had left when it split (its own
    current attempt included)."""
    return max(max_attempts - attempt + 1, 1)


def progress(parts: Sequence[Job]) -> Summed:
    """What a job waiting on `parts` shows."""
    return summed(PartState(p.status, p.stage, p.total_chunks, p.processed_chunks) for p in parts)


def new_part(job: Job, part_id: str, budget: int, now: datetime) -> Job:
    """A new pending part of `job` (which has just split), with `budget` attempts."""
    new = NewJob(part_id, job.document_id, job.dataset_id, job.generation, budget, kind=PART_KIND)
    return replace(new.pending(now), parent_id=job.id)
