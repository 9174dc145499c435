"""The lab's commands: `kops bench` (figures, docs/performance.md), `kops chaos` (faults on
purpose) and `kops postgres` (a local PostgreSQL with pgvector for trying scale-out).

The lab is not the product: it is imported only when one of these commands runs, and a package
its extra provides that is missing is named, with the command that installs it."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import signal
from dataclasses import asdict
from pathlib import Path
from types import FrameType, ModuleType
from typing import Annotated, Any

import typer
from rich.markup import escape

from knowledgeops.cli.common import EXIT_STARTUP, console, fail
from knowledgeops.errors import LabError
from knowledgeops.roles.logs import configure_logging


def lab(module: str, *, needs: tuple[str, ...] = (), extra: str = "bench") -> ModuleType:
    """`knowledgeops.lab.<module>`, once the packages it `needs` are there (else the command
    fails naming the extra that brings them)."""
    missing = [name for name in needs if importlib.util.find_spec(name) is None]
    if missing:
        raise fail(
            f"this command needs {', '.join(missing)}, from the {extra} extra: "
            f"pip install 'knowledgeops[{extra}]'"
        )
    return importlib.import_module(f"knowledgeops.lab.{module}")


def _corpus_builder() -> ModuleType:
    return lab("bench.corpus", needs=("reportlab",))


bench_app = typer.Typer(
    help="Benchmarks that print figures (and write JSON with --out). Without a subcommand: "
    "the whole bench (ceiling, end-to-end, raw model, accept latency, peer, scale-out)."
)

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
    bench_corpus = _corpus_builder()
    found = source or bench_corpus.find_source()
    if found is None:
        raise fail(
            "no corpus: give --corpus DIR (your documents) or --source DIR (the folder holding "
            "rustbook.pdf, reference.html and licenses.txt that the bench's corpus is built from)"
        )
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kops-bench"
    built: Path = bench_corpus.build(found, cache / f"corpus-v{bench_corpus.CORPUS_VERSION}")
    return built


def _counts(value: str, option: str) -> list[int]:
    try:
        counts = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise fail(f"{option}: expected numbers like 1,2 (got {value!r})") from None
    if not counts or min(counts) < 1:
        raise fail(f"{option}: give at least one count of 1 or more")
    return counts


def _bench_report(report: Any, out: Path | None) -> None:
    """Print the bench's table, write its JSON, and fail when a document did not complete."""
    bench_run = lab("bench.run")
    console.print(escape(bench_run.render(report)), highlight=False, soft_wrap=True)
    if out is not None:
        bench_run.write_json(report, out)
    if any(run.failed for run in report.runs):
        raise typer.Exit(1)


def _unwind_on_sigterm() -> None:
    """SIGTERM raises SystemExit, so the `finally` blocks run: the servers a bench or the chaos
    suite started stop and their folders go (the default action left them running)."""

    def stop(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


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
    _unwind_on_sigterm()  # every bench: its own PostgreSQL, Redis and folders are cleaned up
    if ctx.invoked_subcommand is not None:
        return
    bench_run = lab("bench.run")

    skipped = {part.strip() for part in skip.split(",") if part.strip()}
    unknown = skipped - set(bench_run.PHASES)
    if unknown:
        raise fail(
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
    bench_corpus = _corpus_builder()
    found = source or bench_corpus.find_source()
    if found is None:
        raise fail(
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
    bench_run = lab("bench.run")
    files = lab("bench.endtoend").corpus_files(_corpus(corpus, source))
    figures = lab("bench.memory").run_memory(
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


def _print_figures(figures: Any, out: Path | None) -> None:
    """A phase's figures as JSON on the terminal, and into `out` when given."""
    console.print_json(json.dumps(asdict(figures)))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(asdict(figures), indent=2))


@bench_app.command("formats")
def bench_formats(
    corpus: CorpusOption = None,
    source: SourceOption = None,
    workers: Annotated[int, typer.Option(min=1, help="Worker threads of the service.")] = 2,
    out: OutOption = None,
) -> None:
    """Slides, sheets, CSV, e-books, e-mail and a scanned book through `kops serve`: per format
    the documents completed and their chunks, and a phrase of each found by search."""
    figures = lab("bench.formats", needs=("reportlab",)).run_formats(
        _corpus(corpus, source), workers=workers
    )
    _print_figures(figures, out)


@bench_app.command("ocr")
def bench_ocr(
    source: SourceOption = None,
    accuracy_pages: Annotated[
        int, typer.Option(min=1, help="Pages per language whose error rate is measured.")
    ] = 5,
    scan_pages: Annotated[
        int, typer.Option(min=2, help="Pages of the scanned PDF read end to end.")
    ] = 24,
    out: OutOption = None,
) -> None:
    """OCR: error rates (clean and degraded scans, English and Chinese, per engine), pages/s of
    the engine alone and end to end with one and two workers, the parsers' peak memory."""
    found = source or _corpus_builder().find_source()
    if found is None:
        raise fail("no shared/corpus found above this folder: give --source DIR")
    seeds = found.parent / "seeds"
    figures = lab("bench.ocr", needs=("reportlab", "rapidfuzz")).run_ocr_bench(
        found / "rustbook.pdf",
        seeds if seeds.is_dir() else None,
        accuracy_pages=accuracy_pages,
        scan_pages=scan_pages,
    )
    _print_figures(figures, out)


@bench_app.command("live")
def bench_live(
    streams: Annotated[int, typer.Option(min=1, help="Event streams held open.")] = 200,
    documents: Annotated[
        int, typer.Option(min=1, help="Documents in the dataset whose pages are timed.")
    ] = 10_000,
    seconds: Annotated[
        float, typer.Option(min=1, help="Seconds of each upload-accept phase (20 uploads/s).")
    ] = 10.0,
    out: OutOption = None,
) -> None:
    """Live progress and the dashboard: the cost of STREAMS open event streams (memory, upload
    accept latency), a change's delay to a stream, and the dashboard's pages at DOCUMENTS."""
    figures = lab("bench.live").run_live_bench(
        streams=streams, documents=documents, seconds=seconds
    )
    _print_figures(figures, out)


@bench_app.command("search")
def bench_search(
    chunks: Annotated[
        int, typer.Option(min=100, help="Chunks written into the index (two datasets share it).")
    ] = 100_000,
    topology: Annotated[
        list[str] | None,
        typer.Option(help="embedded (SQLite) or scale-out (PostgreSQL); both if not given."),
    ] = None,
    questions: Annotated[int, typer.Option(min=1, help="Questions asked per mode.")] = 200,
    collections: Annotated[
        Path | None, typer.Option(help="The eval/ folder (its Debian FAQ gives text and queries).")
    ] = None,
    keep: Annotated[
        Path | None,
        typer.Option(
            help="Keep the database (SQLite, or the PostgreSQL server's data) in this folder, "
            "with one --topology; a later run of as many chunks measures it again without "
            "writing it."
        ),
    ] = None,
    rebuild: Annotated[
        bool,
        typer.Option(
            help="On a kept database, build the graphs (pgvector's HNSW) and the keyword index "
            "again (timed); --no-rebuild uses them as they were kept."
        ),
    ] = True,
    hnsw_sweep: Annotated[
        str | None,
        typer.Option(
            help="Scale-out: also build pgvector's graphs again with each M:EF_CONSTRUCTION of "
            "this comma-separated list (16:64,24:128) and sweep ef_search on each."
        ),
    ] = None,
    ingest_rounds: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Embedded: the ingestion runs timed in each mode, the index kept and not "
            "(3 if not given); more settle the share its upkeep costs.",
        ),
    ] = None,
    out: OutOption = None,
) -> None:
    """Search at CHUNKS chunks, per topology: p50/p95 of vector, keyword and hybrid search with
    and without a filter, recall@10 against exact, build time, disk and memory."""
    search = lab("bench.search")
    chosen = topology or list(search.TOPOLOGIES)
    unknown = sorted(set(chosen) - set(search.TOPOLOGIES))
    if unknown:
        raise fail(f"unknown topology {', '.join(unknown)}: choose embedded or scale-out")
    root = collections or lab("eval.collections").find_root()
    if root is None:
        raise fail("no eval/ folder found: run this in the checkout, or give --collections")
    builds = _hnsw_builds(hnsw_sweep)
    try:
        figures = search.run_search_bench(
            root,
            chunks=chunks,
            topologies=chosen,
            questions=questions,
            keep=keep,
            rebuild=rebuild,
            hnsw_builds=builds,
            ingest_rounds=ingest_rounds or 0,
        )
    except ValueError as exc:
        raise fail(str(exc)) from None
    console.print(search.render(figures))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps([asdict(f) for f in figures], indent=2))


def _hnsw_builds(spec: str | None) -> list[tuple[int, int]]:
    """`--hnsw-sweep`'s pairs, or a clear error."""
    if not spec:
        return []
    builds = []
    for part in spec.split(","):
        m, _, ef = part.strip().partition(":")
        ok = m.isdigit() and ef.isdigit() and 2 <= int(m) <= 100 and 2 * int(m) <= int(ef) <= 1000
        if not ok:
            raise fail(
                f"--hnsw-sweep: {part.strip()!r} is not M:EF_CONSTRUCTION (M from 2 to 100, "
                "EF_CONSTRUCTION from 2·M to 1000: pgvector's limits), e.g. 16:64,24:128"
            )
        builds.append((int(m), int(ef)))
    return builds


@bench_app.command("embedded")
def bench_embedded(
    corpus: CorpusOption = None,
    source: SourceOption = None,
    workers: Annotated[int, typer.Option(min=1, help="Worker threads of kops serve.")] = 2,
    out: OutOption = None,
) -> None:
    """Start `kops serve` in a fresh folder, upload the corpus over HTTP, follow it to the end."""
    bench_run = lab("bench.run")
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
    scaleout = lab("bench.scaleout", needs=("pgserver",), extra="pgserver")
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


def chaos(
    short: Annotated[bool, typer.Option(help="The short form CI runs.")] = False,
    only: Annotated[
        str | None, typer.Option(help="Comma-separated scenarios (default: all).")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Write the results as JSON here.")] = None,
    soak: Annotated[
        int | None,
        typer.Option(
            min=10,
            help="Instead of the scenarios: this many documents of every format through one "
            "topology while faults strike at random (10,000 for the full soak).",
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="The soak's random faults and documents.")] = 7,
) -> None:
    """Break the scale-out topology on purpose (own PostgreSQL, Redis and provider) and check
    that nothing was lost, doubled or left stuck; exits 1 if anything was."""
    suite = lab("chaos", needs=("pgserver", "reportlab"), extra="bench")
    configure_logging("WARNING")
    _unwind_on_sigterm()
    if soak is not None:
        if only:
            raise fail("--only chooses scenarios; --soak runs none of them")
        try:
            outcome = suite.run_soak_suite(soak, short=short, seed=seed)
        except LabError as exc:
            raise fail(str(exc), EXIT_STARTUP) from None
        for table in suite.render_soak(outcome):
            console.print(table)
        if out is not None:
            suite.write_soak_json(outcome, out)
        if not outcome.ok:
            raise typer.Exit(1)
        return
    try:
        results = suite.run_chaos(
            short=short, only=[n.strip() for n in only.split(",")] if only else None
        )
    except (ValueError, LabError) as exc:
        raise fail(str(exc), EXIT_STARTUP) from None
    console.print(suite.render(results))
    if out is not None:
        suite.write_json(results, out)
    if not all(result.ok for result in results):
        raise typer.Exit(1)


postgres_app = typer.Typer(
    help="A local PostgreSQL 16 with pgvector from the pgserver package (for trying scale-out)."
)
PgDir = Annotated[Path, typer.Option("--dir", help="Folder for the server's data.")]
PgPort = Annotated[int, typer.Option(help="TCP port on 127.0.0.1.")]


@postgres_app.command("start")
def postgres_start(dir: PgDir = Path("./kops-pg"), port: PgPort = 5433) -> None:
    """initdb (first time) and start the server; prints the KOPS_DATABASE_URL to use."""
    server = lab("devpg", extra="pgserver").LocalPostgres(dir.resolve(), port)
    try:
        server.start()
    except LabError as exc:
        raise fail(str(exc), EXIT_STARTUP) from None
    console.print(f"PostgreSQL with pgvector runs on {server.host}:{port} (data in {dir})")
    console.print(f"export KOPS_DATABASE_URL={server.url()}", highlight=False, soft_wrap=True)


@postgres_app.command("stop")
def postgres_stop(dir: PgDir = Path("./kops-pg"), port: PgPort = 5433) -> None:
    """Stop the server started by `kops postgres start`."""
    try:
        lab("devpg", extra="pgserver").LocalPostgres(dir.resolve(), port).stop()
    except LabError as exc:
        raise fail(str(exc), EXIT_STARTUP) from None
    console.print("stopped")


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
    app.command()(chaos)
    app.add_typer(postgres_app, name="postgres")
