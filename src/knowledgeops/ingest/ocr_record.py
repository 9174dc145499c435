"""A job's OCR, as the job shows it: the stage `ocr` with pages read of pages to read, the
pages OCR read too unsurely to index, and each page's confidence (`job_ocr`, written in the
transaction of each progress report, so the counts are as honest as the chunk counts).

While OCR is under way the job's stage stays `ocr`, even when the first chunks are already
being embedded (the parser reads ahead); once the last page is read, the stage moves on to
where the chunks are. A job split into page-range parts shows its parts' pages added up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import delete, insert, select, update

from knowledgeops.db.engine import Tx
from knowledgeops.db.schema import ingest_jobs, job_ocr
from knowledgeops.ingest.parsers.progress import OcrProgress
from knowledgeops.jobs.runner import JobContext
from knowledgeops.jobs.states import Stage


@dataclass(frozen=True, slots=True)
class OcrSummary:
    pages_done: int
    pages_total: int
    low_confidence_pages: list[int]
    confidences: list[float]  # of the pages read that held text

    @property
    def mean_confidence(self) -> float | None:
        return round(sum(self.confidences) / len(self.confidences), 3) if self.confidences else None


@dataclass(eq=False)
class OcrTracker:
    """Follows one attempt's OCR progress and records it; `stage(s)` says which stage a report
    of the pipeline may set while OCR runs."""

    ctx: JobContext
    low: list[int] = field(default_factory=list)
    confidences: list[list[float | None]] = field(default_factory=list)  # [page, confidence]
    running: bool = False
    later: Stage | None = None  # the stage the pipeline reached while OCR ran

    def stage(self, wanted: Stage) -> Stage | None:
        """`wanted`, or None (leave the stage at ocr) while OCR is still reading pages."""
        if self.running:
            self.later = wanted
            return None
        return wanted

    def __call__(self, event: OcrProgress) -> None:
        if event.page is not None:
            confidence = None if event.confidence is None else round(event.confidence, 4)
            self.confidences.append([event.page, confidence])
            if event.low:
                self.low.append(event.page)
        finished = event.done >= event.total
        stage: Stage | None = Stage.OCR
        if finished:
            stage = self.later
        self.running = not finished
        values = {
            "pages_done": event.done,
            "pages_total": event.total,
            "low_confidence_pages": sorted(self.low),
            "page_confidences": list(self.confidences),
        }
        job_id = self.ctx.job.id

        def write(tx: Tx) -> None:
            if event.done == 0:  # this attempt starts its record again
                tx.execute(delete(job_ocr).where(job_ocr.c.job_id == job_id))
                tx.execute(insert(job_ocr).values(job_id=job_id, **values))
            else:
                tx.execute(update(job_ocr).where(job_ocr.c.job_id == job_id).values(**values))

        self.ctx.report(stage=stage, work=write)


def summaries(tx: Tx, job_ids: Sequence[str]) -> dict[str, OcrSummary]:
    """The OCR of each job in `job_ids` that ran any, its parts' added up."""
    if not job_ids:
        return {}
    own = select(job_ocr.c.job_id.label("job"), job_ocr)
    parts = (
        select(ingest_jobs.c.parent_id.label("job"), job_ocr)
        .join(ingest_jobs, ingest_jobs.c.id == job_ocr.c.job_id)
        .where(ingest_jobs.c.parent_id.in_(job_ids))
    )
    found: dict[str, OcrSummary] = {}
    for query in (own.where(job_ocr.c.job_id.in_(job_ids)), parts):
        for row in tx.execute(query):
            m = row._mapping
            before = found.get(m["job"], OcrSummary(0, 0, [], []))
            read = [float(c) for _, c in m["page_confidences"] if c is not None]
            found[m["job"]] = OcrSummary(
                before.pages_done + m["pages_done"],
                before.pages_total + m["pages_total"],
                sorted({*before.low_confidence_pages, *m["low_confidence_pages"]}),
                before.confidences + read,
            )
    return found
