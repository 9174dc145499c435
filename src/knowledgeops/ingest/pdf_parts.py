"""A large PDF in page-range parts: the plan a job splits by, its record in `job_parts`, and the
document-wide chunk limit the parts share (the pipeline runs them: ingest/pipeline.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sqlalchemy import func, insert, select

from knowledgeops.db.engine import Database, Tx
from knowledgeops.db.schema import ingest_jobs, job_parts
from knowledgeops.errors import PermanentError, UserActionRequired

ORDINALS = 2**31  # chunk ordinals are 32-bit integers (PostgreSQL): parts' bases stay below
TAPER_FROM = 8  # parts: a document of this many ends in smaller parts
TAPER_PARTS = 4  # … its last `per_part` pages cut into this many


@dataclass(frozen=True, slots=True)
class PartPlan:
    """One part: its pages, its ordinals [ordinal_base, ordinal_base + max_chunks), and the
    chunk settings of the moment its job split (every part, and every attempt of one, chunks
    alike: a retry overwrites exactly what it wrote before)."""

    first_page: int
    last_page: int
    ordinal_base: int
    max_chunks: int
    chunk_size: int
    chunk_overlap: int


def page_ranges(pages: int, per_part: int) -> list[tuple[int, int]]:
    """Pages 1..`pages` in ranges of `per_part`. A document of many parts ends in smaller ones
    (its last `per_part` pages in quarters), so that the workers finish together instead of one
    of them working through a whole last part alone while the others wait."""
    full_until = pages
    if pages >= TAPER_FROM * per_part:
        full_until = pages - per_part
    ranges = [
        (first, min(first + per_part - 1, full_until))
        for first in range(1, full_until + 1, per_part)
    ]
    tail = pages - full_until
    if tail:
        count = min(TAPER_PARTS, tail)
        first = full_until + 1
        for n in range(count):
            size = tail // count + (1 if n < tail % count else 0)
            ranges.append((first, first + size - 1))
            first += size
    return ranges


def plan(
    pages: int, per_part: int, *, max_chunks: int, chunk_size: int, chunk_overlap: int
) -> list[PartPlan] | None:
    """The parts of a `pages`-page PDF, each allowed `max_chunks` chunks (the document's limit:
    the parts together are held to it too); None when their ordinals would not fit."""
    ranges = page_ranges(pages, per_part)
    if len(ranges) * max_chunks >= ORDINALS:
        return None
    return [
        PartPlan(first, last, n * max_chunks, max_chunks, chunk_size, chunk_overlap)
        for n, (first, last) in enumerate(ranges)
    ]


def record(tx: Tx, ids: list[str], plans: list[PartPlan]) -> None:
    """The plan of each part job, in the transaction that makes them (JobStore.split)."""
    tx.execute(
        insert(job_parts),
        [
            {"job_id": part_id, "part_index": n, **asdict(part)}
            for n, (part_id, part) in enumerate(zip(ids, plans, strict=True))
        ],
    )


def load(db: Database, job_id: str) -> PartPlan:
    with db.read() as conn:
        row = conn.execute(
            select(
                job_parts.c.first_page,
                job_parts.c.last_page,
                job_parts.c.ordinal_base,
                job_parts.c.max_chunks,
                job_parts.c.chunk_size,
                job_parts.c.chunk_overlap,
            ).where(job_parts.c.job_id == job_id)
        ).first()
    if row is None:
        raise PermanentError("this part of the job has no page range", code="part_missing")
    return PartPlan(*row)


def check_document_chunks(tx: Tx, parent_id: str, most: int) -> None:
    """Refuse a split document whose parts have written more than `most` chunks in all
    (KOPS_MAX_CHUNKS_PER_DOCUMENT). The parts' counts are exact here: a part's report takes its
    job's row lock before it writes its own count (JobStore.report), this one's included."""
    written = tx.scalar(
        select(func.sum(ingest_jobs.c.processed_chunks)).where(ingest_jobs.c.parent_id == parent_id)
    )
    if written is not None and written > most:
        raise UserActionRequired(
            f"The document makes more than {most:,} chunks (KOPS_MAX_CHUNKS_PER_DOCUMENT). "
            "Split it into smaller documents.",
            code="too_many_chunks",
        )
