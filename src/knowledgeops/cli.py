"""`kops`: the command line. Each command is thin; the work is in the library."""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.table import Column, Table

from knowledgeops.client import Client, ClientError
from knowledgeops.settings import SettingsError, load_settings

app = typer.Typer(
    help="KnowledgeOps: reliable document ingestion for retrieval-augmented generation.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
err = Console(stderr=True)

SUFFIXES = {".pdf", ".docx", ".html", ".htm", ".xhtml", ".md", ".markdown", ".txt", ".text"}
TERMINAL = {"completed", "failed", "cancelled"}
DEFAULT_URL = os.environ.get("KOPS_URL", "http://127.0.0.1:8000")
WIDE_TABLE = 140  # columns from which `kops jobs` shows errors in the table

UrlOpt = Annotated[str, typer.Option("--url", help="Where KnowledgeOps runs.", envvar="KOPS_URL")]
DatasetOpt = Annotated[
    str | None, typer.Option("--dataset", "-d", help="Dataset id or name (default: the default).")
]


def _fail(message: str, code: int = 1) -> typer.Exit:
    # escaped: messages carry file names and server text, which are not rich markup; soft_wrap:
    # no line breaks inserted at 80 columns when stderr is a file or a pipe
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


def _settings(**overrides: Any) -> Any:
    try:
        return load_settings(**{k: v for k, v in overrides.items() if v is not None})
    except SettingsError as exc:
        raise _fail(str(exc)) from None


def _logging(level: str) -> None:
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s", stream=sys.stderr
    )


@app.command()
def serve(
    port: Annotated[int | None, typer.Option(help="HTTP port (KOPS_PORT, default 8000).")] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind (KOPS_HOST).")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Data folder (KOPS_DATA_DIR).")] = None,
    workers: Annotated[int | None, typer.Option(help="Worker threads (KOPS_WORKERS).")] = None,
) -> None:
    """Run the embedded default: API, workers and relay in one process, data in SQLite."""
    settings = _settings(port=port, host=host, data_dir=data_dir, workers=workers)
    run_embedded_server(settings)


def run_embedded_server(settings: Any, embedder: Any = None) -> None:
    """`kops serve` with these settings (and, for `kops bench` only, another embedder)."""
    import uvicorn

    from knowledgeops.api.app import create_app
    from knowledgeops.lockfile import DataDirLocked
    from knowledgeops.runtime import Embedded

    _logging(settings.log_level)
    logging.getLogger(__name__).info("settings: %s", settings.describe())
    runtime = Embedded(settings, embedder=embedder)
    try:
        runtime.acquire()
    except DataDirLocked as exc:
        raise _fail(str(exc)) from None
    uvicorn.run(
        create_app(runtime),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=20,
    )


@app.command()
def migrate(
    data_dir: Annotated[Path | None, typer.Option(help="Data folder (KOPS_DATA_DIR).")] = None,
) -> None:
    """Bring the database schema up to date."""
    from knowledgeops.db.engine import Database
    from knowledgeops.db.migrate import current_revision, upgrade
    from knowledgeops.lockfile import DataDirLock, DataDirLocked
    from knowledgeops.preflight import StartupError, check_database, check_index
    from knowledgeops.runtime import make_index, model_dimension

    settings = _settings(data_dir=data_dir)
    lock = DataDirLock(settings.data_dir)
    if settings.is_sqlite:
        try:
            lock.acquire()
        except DataDirLocked as exc:
            raise _fail(str(exc)) from None
    db = Database(settings.resolved_database_url)
    try:
        check_database(db)
        before = current_revision(db.engine)
        upgrade(db.engine)
        after = current_revision(db.engine)
        # on PostgreSQL: the pgvector extension, the index table and its indexes
        check_index(make_index(db, model_dimension(settings)), db, create=True)
    except StartupError as exc:
        raise _fail(str(exc), 2) from None
    finally:
        db.dispose()
        lock.release()
    if before == after:
        console.print(f"database is up to date (revision {after})")
    else:
        console.print(f"migrated database from {before or 'empty'} to {after}")


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
            raise _fail(f"{path}: no such file or folder")
    return files


def _progress_line(job: dict[str, Any]) -> tuple[str, int | None, int]:
    stage = job["status"] if job["status"] in TERMINAL else f"{job['stage']}"
    return stage, job["totalChunks"], job["processedChunks"]


@app.command()
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
        raise _fail("no documents found (looked for " + ", ".join(sorted(SUFFIXES)) + ")")
    failures: list[str] = []
    with Client(url) as client:
        try:
            dataset_id = client.resolve_dataset(dataset)
        except ClientError as exc:
            raise _fail(str(exc)) from None
        columns = (
            TextColumn("{task.description}", justify="left"),
            TextColumn("[cyan]{task.fields[stage]:>10}"),
            BarColumn(),
            MofNCompleteColumn(),
        )
        with Progress(*columns, console=console, transient=False) as progress:
            open_jobs: dict[str, TaskID] = {}
            for path in files:
                label = escape(path.name if len(path.name) <= 40 else path.name[:37] + "…")
                try:
                    accepted = client.upload(path, dataset_id=dataset_id)
                except ClientError as exc:
                    if exc.status is None:
                        raise _fail(str(exc)) from None
                    failures.append(f"{path}: rejected ({exc.status}): {exc}")
                    progress.add_task(label, total=1, stage="rejected")
                    continue
                open_jobs[accepted["jobId"]] = progress.add_task(label, total=None, stage="pending")
            if wait:
                try:
                    _follow(client, progress, open_jobs, failures, timeout)
                except ClientError as exc:
                    raise _fail(
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
    client: Client,
    progress: Progress,
    open_jobs: dict[str, TaskID],
    failures: list[str],
    timeout: float,
) -> None:
    deadline = time.monotonic() + timeout
    while open_jobs:
        for job_id, task in list(open_jobs.items()):
            job = client.job(job_id)
            stage, total, done = _progress_line(job)
            progress.update(task, total=total, completed=done, stage=stage)
            if job["status"] in TERMINAL:
                del open_jobs[job_id]
                if job["status"] != "completed":
                    failures.append(
                        f"{job['fileName']}: {job['status']}: {job['error']} "
                        f"[{job['errorCategory'] or job['errorCode']}] (job {job_id})"
                    )
        if open_jobs and time.monotonic() > deadline:
            for job_id in open_jobs:
                failures.append(f"job {job_id}: still running after {timeout:g} s")
            return
        time.sleep(0.5)


JobIdArg = Annotated[str, typer.Argument(help="The job's id (as `kops jobs` shows it).")]


@app.command()
def retry(job_id: JobIdArg, url: UrlOpt = DEFAULT_URL) -> None:
    """Run a failed or cancelled job again (the newest job of its document)."""
    with Client(url) as client:
        try:
            job = client.retry(job_id)
        except ClientError as exc:
            raise _fail(str(exc)) from None
    console.print(f"job {job['id']}: {job['status']} (attempts allowed: {job['maxAttempts']})")


@app.command()
def cancel(job_id: JobIdArg, url: UrlOpt = DEFAULT_URL) -> None:
    """Cancel a job: a running one stops at its next batch, its partial chunks are removed and
    the document's previous version stays searchable."""
    with Client(url) as client:
        try:
            job = client.cancel(job_id)
        except ClientError as exc:
            raise _fail(str(exc)) from None
    console.print(f"job {job['id']}: {job['status']}")


@app.command()
def search(
    query: Annotated[str, typer.Argument(help="What to look for.")],
    dataset: DatasetOpt = None,
    top_k: Annotated[int, typer.Option("--top-k", "-k", min=1, max=100)] = 5,
    mode: Annotated[str, typer.Option(help="hybrid, vector or keyword.")] = "hybrid",
    url: UrlOpt = DEFAULT_URL,
) -> None:
    """Search a dataset and print the best chunks."""
    with Client(url) as client:
        try:
            found = client.search(
                query, dataset_id=client.resolve_dataset(dataset), top_k=top_k, mode=mode
            )
        except ClientError as exc:
            raise _fail(str(exc)) from None
    if not found["results"]:
        console.print("no results")
        return
    for n, hit in enumerate(found["results"], start=1):
        where = f"p. {hit['page']}" if hit["page"] else (hit["section"] or "")
        console.print(
            f"[bold]{n}. {escape(hit['fileName'])}[/bold] #{hit['ordinal']} {escape(where)} "
            f"[dim](score {hit['score']:.4f})[/dim]",
            soft_wrap=True,
        )
        text = " ".join(hit["text"].split())
        console.print(
            f"   {text[:300]}{'…' if len(text) > 300 else ''}", markup=False, highlight=False
        )


@app.command()
def jobs(
    status: Annotated[str | None, typer.Option(help="Only jobs in this status.")] = None,
    dataset: DatasetOpt = None,
    limit: Annotated[int, typer.Option(min=1, max=200)] = 20,
    url: UrlOpt = DEFAULT_URL,
) -> None:
    """List recent jobs with their stage and counts."""
    with Client(url) as client:
        try:
            dataset_id = client.resolve_dataset(dataset) if dataset else None
            found = client.jobs(status=status, dataset_id=dataset_id, limit=limit)
        except ClientError as exc:
            raise _fail(str(exc)) from None
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
    for job in found["items"]:
        total = job["totalChunks"] if job["totalChunks"] is not None else "?"
        state = job["status"] if job["status"] in TERMINAL else f"{job['status']} ({job['stage']})"
        error = _shorten(job["error"] or "", 120)
        cells = [
            job["id"],
            escape(job["fileName"]),
            state,
            f"{job['processedChunks']}/{total}",
            f"{job['attempt']}/{job['maxAttempts']}",
        ]
        if wide:
            cells.append(escape(error))
        elif error:
            errors.append(f"{job['id']}: {error}")
        table.add_row(*cells)
    console.print(table)
    for line in errors:
        console.print(line, markup=False, highlight=False)
    console.print(f"{len(found['items'])} of {found['total']} jobs")


def _shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


bench_app = typer.Typer(
    help="Benchmarks that print figures (and write JSON with --out). Without a subcommand: "
    "the whole bench (ceiling, end-to-end, raw model, accept latency, peer, scale-out)."
)
app.add_typer(bench_app, name="bench")

CorpusOption = Annotated[
    Path | None,
    typer.Option(
        help="Folder of documents to ingest (default: the bench's corpus, built from --source).",
        exists=True,
        file_okay=False,
    ),
]
SourceOption = Annotated[
    Path | None,
    typer.Option(
        help="Folder of the project's reference documents (rustbook.pdf, reference.html, "
        "licenses.txt) the default corpus is built from (default: shared/corpus found above "
        "the current folder).",
        exists=True,
        file_okay=False,
    ),
]
OutOption = Annotated[Path | None, typer.Option(help="Write the figures as JSON here.")]


def _corpus(corpus: Path | None, source: Path | None) -> Path:
    """`corpus`, or the bench's corpus built (once) from `source` into the user's cache."""
    if corpus is not None:
        return corpus
    from knowledgeops.bench import corpus as bench_corpus

    found = source or bench_corpus.find_source()
    if found is None:
        raise _fail(
            "no corpus: give --corpus DIR (your documents) or --source DIR (the folder holding "
            "rustbook.pdf, reference.html and licenses.txt that the bench's corpus is built from)"
        )
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kops-bench"
    return bench_corpus.build(found, cache / f"corpus-v{bench_corpus.CORPUS_VERSION}")


def _counts(value: str, option: str) -> list[int]:
    try:
        counts = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise _fail(f"{option}: expected numbers like 1,2 (got {value!r})") from None
    if not counts or min(counts) < 1:
        raise _fail(f"{option}: give at least one count of 1 or more")
    return counts


def _bench_report(report: Any, out: Path | None) -> None:
    """Print the bench's table, write its JSON, and fail when a document did not complete."""
    from knowledgeops.bench import run as bench_run

    console.print(escape(bench_run.render(report)), highlight=False, soft_wrap=True)
    if out is not None:
        bench_run.write_json(report, out)
    if any(run.failed for run in report.runs):
        raise typer.Exit(1)


@bench_app.callback(invoke_without_command=True)
def bench_all(
    ctx: typer.Context,
    corpus: CorpusOption = None,
    source: SourceOption = None,
    workers: Annotated[int, typer.Option(min=1, help="Worker threads of kops serve.")] = 2,
    scaleout_workers: Annotated[
        str, typer.Option(help="Scale-out worker process counts, comma-separated.")
    ] = "1,2",
    skip: Annotated[
        str,
        typer.Option(
            help="Phases to leave out, comma-separated: ceiling, embedded, raw, accept, peer, "
            "scaleout."
        ),
    ] = "",
    accept_seconds: Annotated[
        float, typer.Option(min=1, help="Seconds of steady uploads per accept-latency phase.")
    ] = 10.0,
    out: OutOption = None,
) -> None:
    """Run every phase and print one table (see docs/performance.md)."""
    if ctx.invoked_subcommand is not None:
        return
    from knowledgeops.bench import run as bench_run

    skipped = {part.strip() for part in skip.split(",") if part.strip()}
    unknown = skipped - set(bench_run.PHASES)
    if unknown:
        raise _fail(
            f"--skip: unknown phase {', '.join(sorted(unknown))}; the phases are "
            + ", ".join(bench_run.PHASES)
        )
    folder = _corpus(corpus, source)
    report = bench_run.run_bench(
        folder,
        workers=workers,
        scaleout_workers=tuple(_counts(scaleout_workers, "--scaleout-workers")),
        skip=frozenset(skipped),
        accept_seconds=accept_seconds,
    )
    _bench_report(report, out)


@bench_app.command("corpus")
def bench_corpus_command(
    out: Annotated[Path, typer.Option(help="Folder to write the corpus into.")],
    source: SourceOption = None,
) -> None:
    """Build the bench's corpus (at least 50 files of every format, one over 300 pages)."""
    from knowledgeops.bench import corpus as bench_corpus

    found = source or bench_corpus.find_source()
    if found is None:
        raise _fail(
            "give --source DIR: the folder holding rustbook.pdf, reference.html, licenses.txt"
        )
    folder = bench_corpus.build(found, out)
    files = sorted(p.name for p in folder.iterdir() if p.name != "manifest.json")
    console.print(f"{len(files)} documents in {folder}", highlight=False)


@bench_app.command("memory")
def bench_memory(
    corpus: CorpusOption = None,
    source: SourceOption = None,
    documents: Annotated[int, typer.Option(min=10, help="Small documents to ingest.")] = 1000,
    copies: Annotated[
        int, typer.Option(min=1, help="Times the corpus's largest PDF is repeated in the big one.")
    ] = 4,
    upload_mb: Annotated[int, typer.Option(min=1, help="Size of the big PDF, in MB.")] = 500,
    out: OutOption = None,
) -> None:
    """The service's memory over many documents, and on one very large PDF."""
    import json
    from dataclasses import asdict

    from knowledgeops.bench import run as bench_run
    from knowledgeops.bench.endtoend import corpus_files
    from knowledgeops.bench.memory import run_memory

    files = corpus_files(_corpus(corpus, source))
    figures = run_memory(
        bench_run.corpus_text(files),
        bench_run.largest_pdf(files),
        documents=documents,
        copies=copies,
        upload_mb=upload_mb,
    )
    console.print_json(json.dumps(asdict(figures)))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(asdict(figures), indent=2))


@bench_app.command("embedded")
def bench_embedded(
    corpus: CorpusOption = None,
    source: SourceOption = None,
    workers: Annotated[int, typer.Option(min=1, help="Worker threads of kops serve.")] = 2,
    out: OutOption = None,
) -> None:
    """Start `kops serve` in a fresh folder, upload the corpus over HTTP, follow it to the end."""
    from knowledgeops.bench import run as bench_run

    report = bench_run.run_bench(
        _corpus(corpus, source),
        workers=workers,
        skip=frozenset(bench_run.PHASES) - {"embedded"},
    )
    _bench_report(report, out)


@bench_app.command("scaleout")
def bench_scaleout(
    corpus: CorpusOption = None,
    source: SourceOption = None,
    workers: Annotated[
        str, typer.Option(help="Worker process counts to compare, comma-separated.")
    ] = "1,2",
    split_pdf_pages: Annotated[
        int,
        typer.Option(
            min=0,
            help="Pages of the one large PDF then ingested alone, each worker held to one "
            "model thread (its page-range parts spread over the workers); 0 = skip it.",
        ),
    ] = 600,
    whole_corpus: Annotated[
        bool, typer.Option(help="Ingest the whole corpus per worker count first.")
    ] = True,
    out: OutOption = None,
) -> None:
    """Start the scale-out topology (own PostgreSQL + Redis) per worker count, upload the
    corpus over HTTP, follow it to the end; then one large PDF alone; and compare."""
    import json
    from dataclasses import asdict

    from knowledgeops.bench import scaleout

    counts = _counts(workers, "--workers")
    results = scaleout.run_scaleout(
        _corpus(corpus, source),
        worker_counts=counts,
        split_pdf_pages=split_pdf_pages,
        whole_corpus=whole_corpus,
    )
    console.print(escape(scaleout.render(results)), highlight=False, soft_wrap=True)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps([asdict(r) for r in results], indent=2))
    if any(r.failed for r in results):
        raise typer.Exit(1)


from knowledgeops import cli_scaleout  # noqa: E402  (registers after the embedded commands)

cli_scaleout.register(app)

from knowledgeops import cli_keys  # noqa: E402

cli_keys.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
