"""The templates (autoescaped: every file name and chunk text is text, never markup) and what
they need to say things in words: a job's stage and counts, how long it took, what to do about
its error, a search hit with the query's words marked."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi.templating import Jinja2Templates
from markupsafe import Markup, escape

from knowledgeops.service.views import JobView

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")
templates.env.autoescape = True
OPEN = {"pending", "retrying", "running"}
_WORD = re.compile(r"\w+", re.UNICODE)

WHAT_TO_DO = {
    "transient": "A passing failure (a timeout, a busy service): it is retried by itself while "
    "attempts remain; once they are spent, retry it.",
    "permanent": "The file itself cannot be processed as it is: fix or replace it and upload "
    "it again.",
    "user_action": "Do what the message says, then retry.",
}


def progress(job: JobView | None) -> str:
    """'embedding 12/40 chunks', 'ocr 3/10 pages', 'completed'."""
    if job is None:
        return "–"
    if job.status == "completed":
        return "done"
    if job.status not in OPEN:
        return f"stopped at {job.stage}"
    if job.stage == "ocr" and job.ocr_pages_total:
        return f"ocr {job.ocr_pages_done or 0}/{job.ocr_pages_total} pages"
    if job.total_chunks is not None:
        return f"{job.stage} {job.processed_chunks}/{job.total_chunks} {job.unit}"
    return job.stage


def took(job: JobView | None, now: datetime | None = None) -> str:
    if job is None or job.started_at is None:
        return "–"
    end = job.finished_at or now or datetime.now(UTC)
    seconds = max(0.0, (end - job.started_at).total_seconds())
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes} min {rest:02d} s"


def what_to_do(job: JobView | None) -> str:
    if job is None or job.error is None:
        return ""
    if job.status == "cancelled":
        return "Cancelled on request: retry it to run it again."
    return WHAT_TO_DO.get(job.error_category or "", "Retry it; if it fails again, see its error.")


def highlight(text: str, query: str) -> Markup:
    """`text` escaped, with the query's words (case-insensitive) in <mark>."""
    words = sorted({w.lower() for w in _WORD.findall(query) if len(w) > 1}, key=len, reverse=True)
    if not words:
        return escape(text)
    pattern = re.compile("|".join(re.escape(w) for w in words), re.IGNORECASE)
    out: list[str] = []
    last = 0
    for found in pattern.finditer(text):
        out.append(str(escape(text[last : found.start()])))
        out.append(f"<mark>{escape(found.group(0))}</mark>")
        last = found.end()
    out.append(str(escape(text[last:])))
    return Markup("".join(out))


def pages(start: int | None, end: int | None) -> str:
    if start is None:
        return "–"
    return str(start) if end in (None, start) else f"{start}–{end}"


templates.env.globals.update(
    progress=progress, took=took, what_to_do=what_to_do, highlight=highlight, pages=pages
)


def render(request: Any, template: str, code: int = 200, **context: Any) -> Any:
    return templates.TemplateResponse(request, template, context, status_code=code)


def render_text(request: Any, template: str, **context: Any) -> str:
    """A template rendered to a string (an event's data, a fragment)."""
    return templates.get_template(template).render({"request": request, **context})
