"""`kops bench memory`: the worker's memory over many documents and on one very large file.

Both run the embedded service with the null embedder: the model's memory is allocated once at
load, so what can grow with documents is the pipeline's (parsers, chunker, cache, index, job
state). Memory is read from /proc: the service process's resident set (VmRSS) and, separately,
its parser child processes'.

1. `documents` distinct small text files, uploaded at once; the service's RSS is read each time
   another tenth of them has completed. Flat means the last reading is within a few MB of the
   first after warm-up.
2. One PDF that is both a 500 MB upload and a 2,000-page document: the Rust book's pages
   imported `copies` times (2,320 pages) plus an attachment of random bytes up to the size (a
   PDF carrying a large file, as engineering documents do). The peak RSS of the service and of
   its parser child while it is processed are compared with the size of the document's text.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pypdfium2 as pdfium

from knowledgeops.jobs.states import TERMINAL
from knowledgeops.lab.bench.endtoend import EmbeddedServer, connect, dataset_jobs, ended_jobs


@dataclass
class MemoryFigures:
    documents: int
    rss_mb_by_completed: dict[int, float] = field(default_factory=dict)
    rss_growth_mb_after_warmup: float = 0.0
    parser_rss_mb_max: float = 0.0
    big_file: dict[str, Any] = field(default_factory=dict)


def rss_mb(pid: int) -> float:
    """Resident set of a process in MB (0 when it has gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


class Sampler:
    """Peak RSS of a process and of its children, sampled every `every_s` in a thread."""

    def __init__(self, pid: int, every_s: float = 0.1) -> None:
        self.pid = pid
        self.every_s = every_s
        self.peak = 0.0
        self.children_peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mb(self.pid))
            for child in children(self.pid):
                self.children_peak = max(self.children_peak, rss_mb(child))
            self._stop.wait(self.every_s)


def run_memory(
    corpus_text: str,
    book_pdf: Path | None,
    *,
    documents: int = 1000,
    copies: int = 4,
    upload_mb: int = 500,
    workers: int = 2,
) -> MemoryFigures:
    figures = MemoryFigures(documents=documents)
    with (
        EmbeddedServer(
            workers=workers,
            null_embedder=True,
            env={"KOPS_MAX_UPLOAD_MB": str(upload_mb + 100), "KOPS_PARSE_TIMEOUT_S": "3600"},
        ) as server,
        connect(server.url, server.started, server.log) as (client, _),
    ):
        assert server.process is not None
        pid = server.process.pid
        _many_documents(client, server, pid, corpus_text, figures)
        if book_pdf is not None:
            figures.big_file = _big_file(client, server, pid, book_pdf, copies, upload_mb)
    return figures


def _many_documents(
    client: httpx.Client, server: EmbeddedServer, pid: int, text: str, figures: MemoryFigures
) -> None:
    dataset = client.post("/datasets", json={"name": f"bench-memory-{time.time_ns()}"})
    dataset.raise_for_status()
    dataset_id = dataset.json()["id"]
    words = text.split()
    step = max(1, len(words) // figures.documents)
    for n in range(figures.documents):
        start = (n * step) % max(1, len(words) - 800)
        body = f"Document {n} of the memory bench.\n\n" + " ".join(words[start : start + 800])
        response = client.post(
            "/docs/upload",
            params={"datasetId": dataset_id},
            files={"file": (f"memory-{n:04d}.txt", body.encode(), "text/plain")},
        )
        response.raise_for_status()
    tenth = max(1, figures.documents // 10)
    next_mark = tenth
    deadline = time.monotonic() + 3600
    while next_mark <= figures.documents and time.monotonic() < deadline:
        done = ended_jobs(client, dataset_id)
        while done >= next_mark:
            figures.rss_mb_by_completed[next_mark] = round(rss_mb(pid), 1)
            next_mark += tenth
        for child in children(pid):
            figures.parser_rss_mb_max = max(figures.parser_rss_mb_max, round(rss_mb(child), 1))
        time.sleep(0.2)
    readings = list(figures.rss_mb_by_completed.values())
    if len(readings) >= 2:
        figures.rss_growth_mb_after_warmup = round(readings[-1] - readings[0], 1)
    failed = [j for j in dataset_jobs(client, dataset_id) if j["status"] != "completed"]
    if failed:
        raise SystemExit(f"memory bench: {len(failed)} documents did not complete")


def build_big_pdf(book_pdf: Path, out: Path, *, copies: int, size_mb: int) -> dict[str, Any]:
    """The book's pages `copies` times, padded to `size_mb` MB with an attachment."""

    source = pdfium.PdfDocument(str(book_pdf))
    chars = 0
    for page in source:
        textpage = page.get_textpage()
        chars += textpage.count_chars()
        textpage.close()
        page.close()
    target = pdfium.PdfDocument.new()
    for _ in range(copies):
        target.import_pages(source)
    pages = len(target)
    padding = size_mb * 1024 * 1024 - book_pdf.stat().st_size * copies
    if padding > 0:
        target.new_attachment("measurements.bin").set_data(os.urandom(padding))
    target.save(str(out))
    target.close()
    source.close()
    return {
        "pages": pages,
        "size_mb": round(out.stat().st_size / 2**20, 1),
        "text_chars": chars * copies,  # the whole document's text: ~1 byte a char in memory
    }


def _big_file(
    client: httpx.Client,
    server: EmbeddedServer,
    pid: int,
    book_pdf: Path,
    copies: int,
    upload_mb: int,
) -> dict[str, Any]:
    path = server.data_dir / "big.pdf"
    result = build_big_pdf(book_pdf, path, copies=copies, size_mb=upload_mb)
    before = rss_mb(pid)
    with Sampler(pid) as sampler:
        began = time.perf_counter()
        with path.open("rb") as handle:
            response = client.post("/docs/upload", files={"file": ("big.pdf", handle)}, timeout=600)
        response.raise_for_status()
        accepted = time.perf_counter() - began
        job_id = response.json()["jobId"]
        deadline = time.monotonic() + 3600
        while time.monotonic() < deadline:
            job = client.get(f"/docs/jobs/{job_id}").json()
            if job["status"] in TERMINAL:
                break
            time.sleep(0.5)
        wall = time.perf_counter() - began
    path.unlink()
    if job["status"] != "completed":
        raise SystemExit(f"memory bench: the big PDF ended {job['status']}: {job['error']}")
    result.update(
        {
            "accept_s": round(accepted, 1),
            "wall_s": round(wall, 1),
            "chunks": job["totalChunks"],
            "service_rss_mb_before": round(before, 1),
            "service_rss_mb_peak": round(sampler.peak, 1),
            "parser_rss_mb_peak": round(sampler.children_peak, 1),
        }
    )
    return result
