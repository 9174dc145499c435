"""What a job waiting on its parts shows (jobs/parts.py): the parts' progress summed, and a stage
that says where the work is."""

from __future__ import annotations

import pytest

from knowledgeops.jobs.parts import PartState, part_budget, summed
from knowledgeops.jobs.states import JobStatus, Stage

S, G = JobStatus, Stage


def part(status: JobStatus, stage: Stage, total: int | None = None, done: int = 0) -> PartState:
    return PartState(status, stage, total, done)


QUEUED = part(S.PENDING, G.QUEUED)


@pytest.mark.parametrize(
    ("parts", "stage"),
    [
        ([QUEUED, QUEUED], G.PARSING),  # the job itself parsed (counted the pages) before
        ([part(S.RUNNING, G.PARSING), QUEUED], G.PARSING),
        ([part(S.RUNNING, G.CHUNKING), part(S.RUNNING, G.PARSING)], G.CHUNKING),
        ([part(S.RUNNING, G.EMBEDDING, 9, 3), QUEUED], G.EMBEDDING),
        ([part(S.COMPLETED, G.DONE, 5, 5), QUEUED], G.EMBEDDING),
        ([part(S.RETRYING, G.QUEUED), part(S.COMPLETED, G.DONE, 5, 5)], G.EMBEDDING),
        ([part(S.RUNNING, G.INDEXING, 4, 4), part(S.RUNNING, G.EMBEDDING, 6, 1)], G.EMBEDDING),
        ([part(S.RUNNING, G.INDEXING, 4, 4), part(S.COMPLETED, G.DONE, 6, 6)], G.INDEXING),
        ([part(S.COMPLETED, G.DONE, 4, 4), part(S.COMPLETED, G.DONE, 6, 6)], G.INDEXING),
    ],
)
def test_the_stage_says_where_the_work_is(parts: list[PartState], stage: Stage) -> None:
    assert summed(parts).stage is stage


def test_counts_are_summed_and_the_total_known_once_every_part_knows_its_own() -> None:
    running = part(S.RUNNING, G.EMBEDDING, 10, 4)
    one_unknown = summed([running, QUEUED])
    assert (one_unknown.total_chunks, one_unknown.processed_chunks) == (None, 4)
    both = summed([running, part(S.COMPLETED, G.DONE, 7, 7)])
    assert (both.total_chunks, both.processed_chunks) == (17, 11)
    empty = summed([part(S.COMPLETED, G.DONE, 0, 0), part(S.COMPLETED, G.DONE, 3, 3)])
    assert (empty.total_chunks, empty.processed_chunks) == (3, 3)


def test_parts_get_the_attempts_their_job_had_left() -> None:
    assert part_budget(3, 1) == 3
    assert part_budget(5, 4) == 2
    assert part_budget(3, 3) == 1
    assert part_budget(3, 7) == 1
