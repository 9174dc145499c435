"""`kops bench`: every figure of the performance brief in one run, printed as a table and written
as JSON.

Phases, each on a fresh service so none warms another's cache:
1. pipeline ceiling: the embedded service with the null embedder over the corpus, then accept
   latency with no embedding load;
2. end-to-end: the embedded default (real model) over the corpus; its chunks are kept for 3;
3. the raw model on exactly those chunks; the ratio end-to-end ÷ raw;
4. accept latency while the model saturates the CPU (the largest document keeps it busy);
5. the LlamaIndex peer over the same corpus and model (when the `bench` extra is installed);
6. the scale-out topology with 1 and 2 workers (when pgserver and redis-server are there);
7. memory: the service's RSS over 1,000 documents, and on one 500 MB, 2,320-page PDF.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pypdfium2 as pdfium

from knowledgeops.cpu import usable_cores
from knowledgeops.lab.bench import endtoend, peer, raw
from knowledgeops.lab.bench.endtoend import (
    AcceptFigures,
    EmbeddedServer,
    RunFigures,
    accept_latency,
    connect,
    corpus_files,
    measure,
    wait_for_stage,
)
from knowledgeops.lab.bench.formats import FormatsFigures, files_of, run_formats
from knowledgeops.lab.bench.memory import MemoryFigures, run_memory
from knowledgeops.lab.bench.peer import PeerFigures
from knowledgeops.lab.bench.raw import Int8Figures, RawFigures
from knowledgeops.lab.bench.scaleout import run_scaleout, speedups
from knowledgeops.settings import load_settings

log = logging.getLogger(__name__)

PHASES = ("ceiling", "embedded", "raw", "accept", "peer", "scaleout", "memory", "formats")
# (the int8 model is measured with "raw", on the same chunks, when the int8 extra is installed)
TARGETS = {
    "ratio_end_to_end_to_raw": (">=", 0.90),
    "speedup_vs_peer": (">=", 1.2),
    "ceiling_chunks_per_s": (">=", 1000.0),
    "accept_ms_p99_under_load": ("<=", 50.0),
    "split_pdf_speedup_2_vs_1_workers": (">=", 1.8),
}


@dataclass
class BenchReport:
    corpus: str
    documents: int
    formats: dict[str, int]
    cores: int
    model_threads: int
    batch_size: int
    chunk_size: int
    chunk_overlap: int
    runs: list[RunFigures] = field(default_factory=list)
    raw: RawFigures | None = None
    int8: Int8Figures | None = None
    peer: PeerFigures | None = None
    accept: dict[str, AcceptFigures] = field(default_factory=dict)
    memory: MemoryFigures | None = None
    documents_of_other_formats: FormatsFigures | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def run_bench(
    corpus: Path,
    *,
    workers: int = 2,
    scaleout_workers: tuple[int, ...] = (1, 2),
    skip: frozenset[str] = frozenset(),
    accept_seconds: float = 10.0,
    accept_rate: float = 20.0,
) -> BenchReport:
    files = corpus_files(corpus)
    if not files:
        raise SystemExit(f"no documents in {corpus}")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the peer's imports log every request
    report = _report(corpus, files)
    filler = _filler(files)
    if "ceiling" not in skip:
        _ceiling_phase(report, files, workers, accept_rate, accept_seconds, filler)
    chunks = [] if "embedded" in skip else _embedded_phase(report, files, workers)
    if "raw" not in skip and chunks:
        _raw_phases(report, chunks)
    if "accept" not in skip:
        _phase("accept latency while the model saturates the CPU")
        report.accept["embedding load"] = _accept_under_load(
            files, workers, accept_rate, accept_seconds, filler
        )
    if "peer" not in skip:
        _peer_phase(report, files)
    if "scaleout" not in skip:
        missing = _scaleout_missing()
        if missing:
            report.skipped["scaleout"] = missing
        else:
            _phase(f"scale-out topology, {scaleout_workers} worker(s)")
            report.runs.extend(run_scaleout(corpus, worker_counts=list(scaleout_workers)))
    if "memory" not in skip:
        _phase("memory: 1,000 documents, then one 500 MB, 2,000-page PDF")
        report.memory = run_memory(corpus_text(files), largest_pdf(files), workers=workers)
    if "formats" not in skip:
        if files_of(corpus):
            _phase("slides, sheets, CSV, e-books, e-mail and a scanned book")
            report.documents_of_other_formats = run_formats(corpus, workers=workers)
        else:
            report.skipped["formats"] = "the corpus has no formats/ or scans/ folder"
    report.summary = summarise(report)
    return report


def _report(corpus: Path, files: list[Path]) -> BenchReport:
    """The report's heading: the corpus and what the service runs with by default."""
    settings = load_settings()
    cores = usable_cores()  # what the service's model uses by default
    return BenchReport(
        corpus=str(corpus),
        documents=len(files),
        formats=_formats(files),
        cores=cores,
        model_threads=settings.model_threads or cores,
        batch_size=settings.embed_batch_size,
        chunk_size=settings.chunk_size,
        chunk_overlap=settings.chunk_overlap,
    )


def _ceiling_phase(
    report: BenchReport,
    files: list[Path],
    workers: int,
    rate: float,
    seconds: float,
    filler: str,
) -> None:
    """The service with the null embedder over the corpus, then accept latency with no load."""
    _phase("pipeline ceiling (null embedder)")
    with (
        EmbeddedServer(workers=workers, null_embedder=True) as server,
        connect(server.url, server.started, server.log) as (client, ready_s),
    ):
        report.runs.append(
            measure("null embedder", client, files, ready_s=ready_s, workers=workers)
        )
        report.accept["no embedding load"] = accept_latency(
            client, server, rate=rate, seconds=seconds, filler=filler
        )


def _embedded_phase(report: BenchReport, files: list[Path], workers: int) -> list[tuple[str, int]]:
    """The embedded default, real model, over the corpus; its chunks, for the raw model."""
    _phase("end-to-end, embedded default")
    with EmbeddedServer(workers=workers) as server:
        with connect(server.url, server.started, server.log) as (client, ready_s):
            report.runs.append(measure("embedded", client, files, ready_s=ready_s, workers=workers))
        return server.chunk_texts()


def _peer_phase(report: BenchReport, files: list[Path]) -> None:
    missing = peer.available()
    if missing:
        report.skipped["peer"] = missing
        return
    _phase("peer: LlamaIndex IngestionPipeline")
    report.peer = peer.run_peer(
        files,
        chunk_size=report.chunk_size,
        chunk_overlap=report.chunk_overlap,
        threads=report.model_threads,
        batch_size=report.batch_size,
    )


def corpus_text(files: list[Path]) -> str:
    """The corpus's plain text and Markdown, joined (real text for generated documents)."""
    parts = [
        p.read_text(encoding="utf-8", errors="replace")
        for p in files
        if p.suffix.lower() in {".txt", ".md", ".markdown"}
    ]
    return "\n\n".join(parts) or "The quick brown fox jumps over the lazy dog. " * 2000


def largest_pdf(files: list[Path]) -> Path | None:
    """The corpus's PDF with the most pages (the big-file test repeats its pages)."""

    best: tuple[int, Path] | None = None
    for path in files:
        if path.suffix.lower() != ".pdf":
            continue
        try:
            pages = len(pdfium.PdfDocument(str(path)))
        except pdfium.PdfiumError:
            continue
        if best is None or pages > best[0]:
            best = (pages, path)
    return best[1] if best else None


def _raw_phases(report: BenchReport, chunks: list[tuple[str, int]]) -> None:
    """The fp32 model alone on the chunks, then (with the int8 extra) the int8 variant."""
    _phase(f"raw model on the {len(chunks)} chunks of the end-to-end run")
    report.raw = raw.run_raw(chunks, threads=report.model_threads, batch_size=report.batch_size)
    missing = _int8_missing()
    if missing:
        report.skipped["int8"] = missing
        return
    _phase("raw int8 model (ONNX Runtime) on the same chunks")
    report.int8 = raw.run_int8(
        chunks, report.raw, threads=report.model_threads, batch_size=report.batch_size
    )


def _accept_under_load(
    files: list[Path], workers: int, rate: float, seconds: float, filler: str
) -> AcceptFigures:
    """Upload the largest documents (enough to keep every worker on the model), wait until one
    is embedding, then send the steady stream of small uploads."""
    heavy = sorted(files, key=lambda p: p.stat().st_size, reverse=True)[: max(2, workers)]
    with (
        EmbeddedServer(workers=workers) as server,
        connect(server.url, server.started, server.log) as (client, _),
    ):
        job_ids = []
        for path in heavy:
            with path.open("rb") as handle:
                response = client.post("/docs/upload", files={"file": (path.name, handle)})
            response.raise_for_status()
            job_ids.append(response.json()["jobId"])
        wait_for_stage(client, job_ids[0], "embedding")
        time.sleep(1.0)
        before = _embedded_so_far(client, job_ids)
        figures = accept_latency(client, server, rate=rate, seconds=seconds, filler=filler)
        figures.extra["load"] = [p.name for p in heavy]
        # the proof that the model ran all along: chunks the load embedded meanwhile
        figures.extra["load_chunks_embedded_meanwhile"] = _embedded_so_far(client, job_ids) - before
        for job_id in job_ids:
            client.post(f"/docs/jobs/{job_id}/cancel")
        return figures


def _embedded_so_far(client: Any, job_ids: list[str]) -> int:
    return sum(
        client.get(f"/docs/jobs/{job_id}").json()["processedChunks"] or 0 for job_id in job_ids
    )


def summarise(report: BenchReport) -> dict[str, Any]:
    by_name = {r.name: r for r in report.runs}
    summary: dict[str, Any] = {}
    embedded = by_name.get("embedded")
    if embedded and report.raw and report.raw.chunks_per_s:
        summary["ratio_end_to_end_to_raw"] = round(
            embedded.chunks_per_s / report.raw.chunks_per_s, 3
        )
    if embedded and report.peer and embedded.wall_s:
        summary["speedup_vs_peer"] = round(report.peer.seconds / embedded.wall_s, 2)
    ceiling = by_name.get("null embedder")
    if ceiling:
        summary["ceiling_chunks_per_s"] = ceiling.chunks_per_s
    if "embedding load" in report.accept:
        summary["accept_ms_p99_under_load"] = report.accept["embedding load"].ms_p99
    if "no embedding load" in report.accept:
        summary["accept_ms_p99_no_load"] = report.accept["no embedding load"].ms_p99

    for label, (first, last) in speedups(report.runs).items():
        key = "split_pdf" if label.startswith("split") else "scaleout"
        summary[f"{key}_speedup_{last.workers}_vs_{first.workers}_workers"] = round(
            last.chunks_per_s / first.chunks_per_s, 2
        )
    for name, (op, target) in TARGETS.items():
        if name in summary:
            value = summary[name]
            met = value >= target if op == ">=" else value <= target
            summary.setdefault("targets", {})[name] = (
                f"{value} (target {op} {target}: {'met' if met else 'NOT met'})"
            )
    return summary


def render(report: BenchReport) -> str:
    lines = [
        f"corpus: {report.corpus}: {report.documents} documents "
        + ", ".join(f"{n} {ext}" for ext, n in sorted(report.formats.items())),
        f"machine: {report.cores} cores; model threads {report.model_threads}, batch "
        f"{report.batch_size}, chunks of {report.chunk_size} tokens "
        f"({report.chunk_overlap} shared)",
        "",
    ]
    columns = _columns(report)
    if columns:
        lines += _table(columns)
    lines += [_accept_line(label, figures) for label, figures in report.accept.items()]
    lines += _memory_lines(report.memory)
    if report.int8:
        i = report.int8
        lines.append(
            f"int8 model: {i.speedup_vs_fp32}× the fp32 model's speed; cosine to fp32 on these "
            f"{i.chunks} chunks mean {i.mean_cosine_to_fp32}, min {i.min_cosine_to_fp32}"
        )
    targets = report.summary.get("targets", {})
    lines += [f"{name}: {value}" for name, value in targets.items()]
    lines += [
        f"{name}: {value}"
        for name, value in report.summary.items()
        if name != "targets" and name not in targets
    ]
    lines += [f"skipped {name}: {why}" for name, why in report.skipped.items()]
    lines += [f"FAILED ({run.name}): {failure}" for run in report.runs for failure in run.failed]
    return "\n".join(lines)


def _columns(report: BenchReport) -> list[tuple[str, dict[str, Any]]]:
    """One column per run, then the raw model, the int8 model and the peer."""
    columns: list[tuple[str, dict[str, Any]]] = []
    for run in report.runs:
        row = {
            k: v
            for k, v in asdict(run).items()
            if k not in {"name", "extra", "stage_seconds", "failed"}
        }
        row["failed"] = len(run.failed)
        for stage, seconds in run.stage_seconds.items():
            row[f"{stage} s (all jobs)"] = seconds
        columns.append((run.name, row))
    for title, model in (("raw model", report.raw), ("raw int8", report.int8)):
        if model is not None:
            figures = {"chunks": model.chunks, "wall_s": model.seconds}
            columns.append((title, {**figures, "chunks_per_s": model.chunks_per_s}))
    if report.peer:
        p = report.peer
        columns.append(
            (
                "LlamaIndex",
                {
                    "documents": p.documents,
                    "chunks": p.chunks,
                    "wall_s": p.seconds,
                    "documents_per_s": p.documents_per_s,
                    "chunks_per_s": p.chunks_per_s,
                },
            )
        )
    return columns


def _table(columns: list[tuple[str, dict[str, Any]]]) -> list[str]:
    names: list[str] = []
    for _, row in columns:
        names.extend(n for n in row if n not in names)
    width = max(len(n) for n in names)
    widths = [max(12, len(title)) for title, _ in columns]
    lines = [
        " " * width
        + "  "
        + "  ".join(f"{t:>{w}}" for (t, _), w in zip(columns, widths, strict=True))
    ]
    for name in names:
        cells = [f"{row.get(name, ''):>{w}}" for (_, row), w in zip(columns, widths, strict=True)]
        lines.append(f"{name:<{width}}  " + "  ".join(cells))
    return [*lines, ""]


def _accept_line(label: str, figures: AcceptFigures) -> str:
    meanwhile = figures.extra.get("load_chunks_embedded_meanwhile")
    return (
        f"accept ({label}): {figures.accepted}/{figures.sent} uploads of "
        f"{figures.size_kb} KB at {figures.rate_per_s:g}/s: p50 {figures.ms_p50} ms, "
        f"p99 {figures.ms_p99} ms, max {figures.ms_max} ms; "
        f"server busy {figures.server_cores_busy} cores"
        + (f"; the load embedded {meanwhile} chunks meanwhile" if meanwhile is not None else "")
    )


def _memory_lines(m: MemoryFigures | None) -> list[str]:
    if m is None:
        return []
    lines = [
        f"memory: service RSS (MB) by documents completed {m.rss_mb_by_completed}; growth "
        f"after the first tenth {m.rss_growth_mb_after_warmup} MB; parser child at most "
        f"{m.parser_rss_mb_max} MB"
    ]
    if m.big_file:
        b = m.big_file
        lines.append(
            f"big file: {b['size_mb']} MB PDF of {b['pages']} pages "
            f"({b['text_chars'] / 2**20:.1f} M characters of text, {b['chunks']} chunks): "
            f"accepted in {b['accept_s']} s, done in {b['wall_s']} s; service RSS "
            f"{b['service_rss_mb_before']} → peak {b['service_rss_mb_peak']} MB, parser "
            f"child peak {b['parser_rss_mb_peak']} MB"
        )
    return lines


def write_json(report: BenchReport, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    data = asdict(report)
    if data.get("raw"):
        data["raw"].pop("vectors", None)  # kept in memory for the int8 comparison only
    out.write_text(json.dumps(data, indent=2, ensure_ascii=False))


def _formats(files: list[Path]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in files:
        counts[path.suffix.lower().lstrip(".")] = counts.get(path.suffix.lower().lstrip("."), 0) + 1
    return counts


def _filler(files: list[Path]) -> str:
    """Real text for the accept-latency uploads: the corpus's first text file, else a sentence."""
    for path in files:
        if path.suffix.lower() in {".txt", ".md"}:
            return path.read_text(encoding="utf-8", errors="replace")
    return "The quick brown fox jumps over the lazy dog. " * 50


def _int8_missing() -> str | None:

    if find_spec("onnxruntime") is None or find_spec("onnx") is None:
        return "onnxruntime or onnx is missing: pip install -e '.[int8]'"
    return None


def _scaleout_missing() -> str | None:
    if find_spec("pgserver") is None:
        return "pgserver is not installed (pip install -e '.[pgserver]')"
    if shutil.which("redis-server") is None:
        return "redis-server is not on PATH"
    return None


def _phase(title: str) -> None:
    print(f"[kops bench] {time.strftime('%H:%M:%S')} {title}", flush=True)


__all__ = ["PHASES", "BenchReport", "endtoend", "render", "run_bench", "write_json"]
