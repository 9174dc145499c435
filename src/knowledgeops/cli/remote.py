"""The commands that talk to a running KnowledgeOps over HTTP (`--url`, the key in KOPS_API_KEY):
`ingest`, `search`, `jobs`, `retry` and `cancel`. Each is thin: the SDK (`knowledgeops.client`)
does the talking."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.table import Column, Table

from knowledgeops.cli.common import DEFAULT_URL, DatasetOpt, UrlOpt, console, err, fail
from knowledgeops.client import KnowledgeOps
from knowledgeops.errors import ClientError
from knowledgeops.jobs.states import TERMINAL
from knowledgeops.schemas import JobChangePublic, JobPublic

SUFFIXES = {
    *(".pdf", ".docx", ".html", ".htm", ".xhtml", ".md", ".markdown", ".txt", ".text"),
    *(".pptx", ".xlsx", ".csv", ".tsv", ".epub", ".eml", ".mbox"),
    *(".png", ".jpg", ".jpeg", ".tif", ".tiff", ".webp", ".bmp"),
}
WIDE_TABLE = 140  # columns from which `kops jobs` shows errors in the table
RECHECK_S = 30.0  # s: while following the event stream, each open job is also read this often


def _walk(paths: list[Path]) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(
                p
                for p in sorted(path.rglob("*"))
                if p.is_file() and p.suffix.lower() in SUFFIXES and not p.name.startswith(".")
            )
        elif path.is_file():
            files.append(path)
        else:
            raise fail(f"{path}: no such file or folder")
    return files


class DatasetEvents:
    """The dataset's event stream, read in a thread from before the first upload, so every
    change of the jobs this command starts arrives without polling; `latest` holds each job's
    newest state. `failed` says why the stream could not be followed (then `_follow` polls)."""

    def __init__(self, client: KnowledgeOps, dataset_id: str) -> None:
        self.client = client
        self.dataset_id = dataset_id
        self.latest: dict[str, JobChangePublic] = {}
        self.changed = threading.Event()
        self.opened = threading.Event()
        self.failed: str | None = None
        self._lock = threading.Lock()
        threading.Thread(target=self._read, name="kops-ingest-events", daemon=True).start()
        self.opened.wait(10)

    def _read(self) -> None:
        try:
            for event in self.client.follow(f"/datasets/{self.dataset_id}/events"):
                self.opened.set()
                if event.event == "job" and isinstance(event.data, dict):
                    change = JobChangePublic.model_validate(event.data)
                    with self._lock:
                        self.latest[change.job_id] = change
                    self.changed.set()
        except ClientError as exc:
            self.failed = str(exc)
        finally:
            self.opened.set()
            self.changed.set()

    def take(self, job_ids: set[str], wait_s: float) -> dict[str, JobChangePublic | JobPublic]:
        """The newest state of those of `job_ids` that changed, waiting up to `wait_s`."""
        self.changed.wait(wait_s)
        self.changed.clear()
        with self._lock:
            return {job_id: self.latest.pop(job_id) for job_id in job_ids if job_id in self.latest}


def _progress_line(job: JobChangePublic | JobPublic) -> tuple[str, int | None, int]:
    """What a progress bar shows: the stage, and its counts (pages while OCR reads a scan,
    "ocr 12/200 pages"; chunks otherwise)."""
    if job.status not in TERMINAL and job.stage == "ocr":
        return "ocr pages", job.ocr_pages_total, job.ocr_pages_done or 0
    stage = job.status if job.status in TERMINAL else job.stage
    return stage, job.total_chunks, job.processed_chunks


def ingest(
    paths: Annotated[list[Path], typer.Argument(help="Files or folders (walked for documents).")],
    dataset: DatasetOpt = None,
    url: UrlOpt = DEFAULT_URL,
    wait: Annotated[bool, typer.Option(help="Wait for every job to finish.")] = True,
    timeout: Annotated[float, typer.Option(help="Seconds to wait in all.")] = 3600.0,
) -> None:
    """Upload documents to a running KnowledgeOps and follow each job to the end."""
    files = _walk(paths)
    if not files:
        raise fail("no documents found (looked for " + ", ".join(sorted(SUFFIXES)) + ")")
    failures: list[str] = []
    with KnowledgeOps(url) as client:
        try:
            dataset_id = client.find_dataset(dataset).id
        except ClientError as exc:
            raise fail(str(exc)) from None
        columns = (
            TextColumn("{task.description}", justify="left"),
            TextColumn("[cyan]{task.fields[stage]:>10}"),
            BarColumn(),
            MofNCompleteColumn(),
        )
        events = DatasetEvents(KnowledgeOps(url), dataset_id) if wait else None
        with Progress(*columns, console=console, transient=False) as progress:
            open_jobs: dict[str, TaskID] = {}
            for path in files:
                label = escape(path.name if len(path.name) <= 40 else path.name[:37] + "…")
                try:
                    accepted = client.upload(path, dataset_id=dataset_id)
                except ClientError as exc:
                    if exc.status is None:
                        raise fail(str(exc)) from None
                    failures.append(f"{path}: rejected ({exc.status}): {exc}")
                    progress.add_task(label, total=1, stage="rejected")
                    continue
                open_jobs[accepted.job_id] = progress.add_task(label, total=None, stage="pending")
            if events is not None:
                try:
                    _follow(client, events, progress, open_jobs, failures, timeout)
                except ClientError as exc:
                    raise fail(
                        f"{exc}\nThe {len(open_jobs)} unfinished uploads were accepted and are "
                        "kept; they finish when KnowledgeOps runs again (see `kops jobs`)."
                    ) from None
    if failures:
        err.print(f"[red]{len(failures)} of {len(files)} documents failed:[/red]")
        for line in failures:
            err.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    console.print(f"{len(files)} documents {'ingested' if wait else 'accepted'}")


def _follow(
    client: KnowledgeOps,
    events: DatasetEvents,
    progress: Progress,
    open_jobs: dict[str, TaskID],
    failures: list[str],
    timeout: float,
) -> None:
    """Show each job's progress until it ends: from the dataset's event stream, and from a
    read of every open job now and then (a duplicate upload's job may have ended before the
    stream opened; a server without streams is polled)."""
    deadline = time.monotonic() + timeout
    read_at = 0.0
    while open_jobs:
        if events.failed is None and time.monotonic() - read_at < RECHECK_S:
            changed = events.take(set(open_jobs), wait_s=1.0)
        else:
            changed = {job_id: client.get_job(job_id) for job_id in open_jobs}
            read_at = time.monotonic()
            if events.failed is not None:
                time.sleep(0.5)
        for job_id, job in changed.items():
            task = open_jobs[job_id]
            stage, total, done = _progress_line(job)
            progress.update(task, total=total, completed=done, stage=stage)
            if job.status in TERMINAL:
                del open_jobs[job_id]
                if job.status != "completed":
                    # an event does not name the file: the job's own read does
                    ended = job if isinstance(job, JobPublic) else client.get_job(job_id)
                    failures.append(
                        f"{ended.file_name or ended.kind}: {ended.status}: "
                        f"{ended.error} [{ended.error_category or ended.error_code}] "
                        f"(job {job_id})"
                    )
        if open_jobs and time.monotonic() > deadline:
            for job_id in open_jobs:
                failures.append(f"job {job_id}: still running after {timeout:g} s")
            return


JobIdArg = Annotated[str, typer.Argument(help="The job's id (as `kops jobs` shows it).")]


def retry(job_id: JobIdArg, url: UrlOpt = DEFAULT_URL) -> None:
    """Run a failed or cancelled job again (the newest job of its document)."""
    with KnowledgeOps(url) as client:
        try:
            job = client.retry_job(job_id)
        except ClientError as exc:
            raise fail(str(exc)) from None
    console.print(f"job {job.id}: {job.status} (attempts allowed: {job.max_attempts})")


def cancel(job_id: JobIdArg, url: UrlOpt = DEFAULT_URL) -> None:
    """Cancel a job: a running one stops at its next batch, its partial chunks are removed and
    the document's previous version stays searchable."""
    with KnowledgeOps(url) as client:
        try:
            job = client.cancel_job(job_id)
        except ClientError as exc:
            raise fail(str(exc)) from None
    console.print(f"job {job.id}: {job.status}")


def search(
    query: Annotated[str, typer.Argument(help="What to look for.")],
    dataset: DatasetOpt = None,
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1, max=100)] = 5,
    mode: Annotated[str, typer.Option(help="hybrid, vector or keyword.")] = "hybrid",
    url: UrlOpt = DEFAULT_URL,
) -> None:
    """Search a dataset and print the best chunks."""
    with KnowledgeOps(url) as client:
        try:
            found = client.search(client.find_dataset(dataset).id, query, top_k=top_k, mode=mode)
        except ClientError as exc:
            raise fail(str(exc)) from None
    if not found.results:
        console.print("no results")
        return
    for n, hit in enumerate(found.results, start=1):
        where = f"p. {hit.page}" if hit.page else (hit.section or "")
        console.print(
            f"[bold]{n}. {escape(hit.file_name)}[/bold] #{hit.ordinal} {escape(where)} "
            f"[dim](score {hit.score:.4f})[/dim]",
            soft_wrap=True,
        )
        text = " ".join(hit.text.split())
        console.print(
            f"   {text[:300]}{'…' if len(text) > 300 else ''}", markup=False, highlight=False
        )


def jobs(
    status: Annotated[str | None, typer.Option(help="Only jobs in this status.")] = None,
    dataset: DatasetOpt = None,
    limit: Annotated[int, typer.Option(min=1, max=200)] = 20,
    url: UrlOpt = DEFAULT_URL,
) -> None:
    """List recent jobs with their stage and counts."""
    with KnowledgeOps(url) as client:
        try:
            dataset_id = client.find_dataset(dataset).id if dataset else None
            found = client.list_jobs(status=status, dataset_id=dataset_id, limit=limit)
        except ClientError as exc:
            raise fail(str(exc)) from None
    # The job id is never cut (it is what `retry` and the API take); the error gets a column
    # when the terminal is wide, else it is listed under the table.
    wide = console.width >= WIDE_TABLE
    columns = [
        Column("job", no_wrap=True, min_width=36),
        Column("file", overflow="fold", min_width=8),
        Column("status", no_wrap=True),
        Column("chunks", no_wrap=True),
        Column("attempt", no_wrap=True),
    ]
    if wide:
        columns.append(Column("error", min_width=20))
    table = Table(*columns, box=box.SIMPLE_HEAD)
    errors: list[str] = []
    for job in found.items:
        total = job.total_chunks if job.total_chunks is not None else "?"
        state = job.status if job.status in TERMINAL else f"{job.status} ({job.stage})"
        error = _shorten(job.error or "", 120)
        name = job.file_name if job.file_name is not None else f"(dataset: {job.kind})"
        unit = " docs" if job.unit == "documents" else ""
        counts = f"{job.processed_chunks}/{total}{unit}"
        if job.status not in TERMINAL and job.stage == "ocr":
            counts = f"{job.ocr_pages_done or 0}/{job.ocr_pages_total or '?'} pages"
        cells = [job.id, escape(name), state, counts, f"{job.attempt}/{job.max_attempts}"]
        if wide:
            cells.append(escape(error))
        elif error:
            errors.append(f"{job.id}: {error}")
        table.add_row(*cells)
    console.print(table)
    for line in errors:
        console.print(line, markup=False, highlight=False)
    console.print(f"{len(found.items)} of {found.total} jobs")


def _shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def register(app: typer.Typer) -> None:
    for command in (ingest, retry, cancel, search, jobs):
        app.command()(command)
