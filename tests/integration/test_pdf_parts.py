"""A large PDF is split into page-range parts that the workers ingest in parallel; the parts'
chunks become one generation of one document, and one job shows the summed progress. On the real
embedded runtime (SQLite, and PostgreSQL with pgvector), with parsers in their own processes;
the deterministic embedder stands in for the model, wrapped to slow it down or make it fail."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from knowledgeops.db.schema import chunks, ingest_jobs, job_parts
from knowledgeops.errors import NotFound, PermanentError
from knowledgeops.ingest.embedders.base import Vectors
from knowledgeops.ingest.index.base import IndexedChunk, chunk_id
from knowledgeops.ingest.pdf_parts import page_ranges
from knowledgeops.jobs.runner import Outcome
from knowledgeops.lab.embedders import HashingEmbedder
from knowledgeops.roles.embedded import EmbeddedRole
from knowledgeops.service.search import SearchMode
from knowledgeops.service.views import JobView
from tests.fixtures.documents import make_pdf, make_scanned_pdf
from tests.integration.test_exactly_once import FlakyEmbedder, done, index_rows, make_runtime

from ..conftest import wait_for

__all__ = ["make_runtime"]  # SQLite and PostgreSQL runtimes, shared with the exactly-once suite

PAGES = 12
PER_PART = 4  # → 3 parts


def page_text(n: int) -> str:
    words = ("ownership", "borrowing", "lifetimes", "traits", "closures", "iterators")
    lines = [f"Page {n} marker pageword{n} begins the notes on {words[n % len(words)]}."]
    lines += [
        f"Line {i} of page {n} explains {words[(n + i) % len(words)]} with example {i}."
        for i in range(12)
    ]
    return "\n".join(lines)


def big_pdf(tmp_path: Path, pages: int = PAGES) -> Path:
    return make_pdf(tmp_path / "book.pdf", [page_text(n) for n in range(1, pages + 1)])


def upload_file(runtime: EmbeddedRole, path: Path) -> JobView:
    staged = runtime.blobs.stage(100_000_000)
    staged.write(path.read_bytes())
    accepted = runtime.service.uploads.accept(
        "default",
        staged,
        file_name=path.name,
        declared_type=None,
        dataset_id=None,
        idempotency_key=None,
    )
    return accepted.job


def parts_of(runtime: EmbeddedRole, job_id: str) -> list[Any]:
    with runtime.db.read() as conn:
        return list(
            conn.execute(
                select(
                    ingest_jobs.c.id,
                    ingest_jobs.c.status,
                    job_parts.c.part_index,
                    job_parts.c.first_page,
                    job_parts.c.last_page,
                    job_parts.c.ordinal_base,
                )
                .join(job_parts, job_parts.c.job_id == ingest_jobs.c.id)
                .where(ingest_jobs.c.parent_id == job_id)
                .order_by(job_parts.c.part_index)
            )
        )


def chunk_pages(runtime: EmbeddedRole, document_id: str) -> list[Any]:
    with runtime.db.read() as conn:
        return list(
            conn.execute(
                select(
                    chunks.c.generation,
                    chunks.c.ordinal,
                    chunks.c.page_start,
                    chunks.c.page_end,
                    chunks.c.text,
                )
                .where(chunks.c.document_id == document_id)
                .order_by(chunks.c.ordinal)
            )
        )


class ThreadsSeen(FlakyEmbedder):
    """Records which worker threads embed, and fails for good on a marker word when asked."""

    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__(delay_s=delay_s)
        self.threads: set[str] = set()
        self.refuse: str | None = None

    def embed(self, texts: Sequence[str]) -> Vectors:
        with self._lock:
            self.threads.add(threading.current_thread().name)
        if self.refuse is not None and any(self.refuse in text for text in texts):
            raise PermanentError("the model refused this text", code="model_refused")
        return super().embed(texts)


def test_page_ranges_cover_every_page_once() -> None:
    assert page_ranges(12, 4) == [(1, 4), (5, 8), (9, 12)]
    assert page_ranges(10, 4) == [(1, 4), (5, 8), (9, 10)]
    assert page_ranges(5, 50) == [(1, 5)]
    # many parts: the last part's pages in quarters, so the workers finish together
    assert page_ranges(24, 3) == [
        *[(n, n + 2) for n in range(1, 22, 3)],
        (22, 22),
        (23, 23),
        (24, 24),
    ]
    ranges = page_ranges(600, 25)
    assert ranges[:23] == [(n, n + 24) for n in range(1, 576, 25)]
    assert ranges[23:] == [(576, 582), (583, 588), (589, 594), (595, 600)]
    for pages in range(1, 400, 7):
        for per_part in (1, 2, 3, 25, 50):
            found = page_ranges(pages, per_part)
            assert [p for first, last in found for p in range(first, last + 1)] == list(
                range(1, pages + 1)
            )
            assert all(last - first + 1 <= per_part for first, last in found)


def test_a_split_pdf_becomes_one_generation_of_one_document(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    embedder = ThreadsSeen(delay_s=0.02)
    runtime = make_runtime(embedder=embedder, pdf_part_pages=PER_PART)
    job = upload_file(runtime, big_pdf(tmp_path))
    finished = done(runtime, job.id)

    parts = parts_of(runtime, job.id)
    assert [(p.first_page, p.last_page) for p in parts] == [(1, 4), (5, 8), (9, 12)]
    assert {p.status for p in parts} == {"completed"}
    rows = chunk_pages(runtime, job.document_id)
    assert finished.total_chunks == finished.processed_chunks == len(rows) > 3
    assert {r.generation for r in rows} == {1}
    assert len({r.ordinal for r in rows}) == len(rows)
    stride = runtime.pipeline.limits.max_chunks
    for part in parts:  # each part's chunks: its own ordinals, its own pages, none across parts
        assert part.ordinal_base == part.part_index * stride
        mine = [r for r in rows if part.ordinal_base <= r.ordinal < part.ordinal_base + stride]
        assert mine
        assert [r.ordinal - part.ordinal_base for r in mine] == list(range(len(mine)))
        assert all(part.first_page <= r.page_start <= r.page_end <= part.last_page for r in mine)
    text = " ".join(r.text for r in rows)
    for n in range(1, PAGES + 1):
        assert f"pageword{n} " in text + " "
    hits = runtime.service.search.search(
        "default", finished.dataset_id, "pageword11", top_k=5, mode=SearchMode.KEYWORD
    )
    assert hits
    assert hits[0].page_start <= 11 <= hits[0].page_end

    document = runtime.service.documents.get("default", job.document_id)
    assert (document.status, document.page_count, document.chunk_count) == ("ready", 12, len(rows))
    assert document.latest_job_id == job.id
    listed = runtime.service.jobs.list("default", status=None, dataset_id=None, page=1, limit=50)
    assert [j.id for j in listed.items] == [job.id]  # the parts are not users' jobs
    with pytest.raises(NotFound):
        runtime.service.jobs.get("default", parts[0].id)
    # a redelivered message, for the job or a part, changes nothing
    assert runtime.runner.run_job(job.id) is Outcome.SKIPPED
    assert runtime.runner.run_job(parts[1].id) is Outcome.SKIPPED
    assert len(chunk_pages(runtime, job.document_id)) == len(rows)


def test_parts_run_in_parallel_and_the_job_shows_their_summed_progress(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    embedder = ThreadsSeen(delay_s=0.05)
    runtime = make_runtime(embedder=embedder, workers=2, pdf_part_pages=PER_PART)
    job = upload_file(runtime, big_pdf(tmp_path))
    seen: list[tuple[str, str, int | None, int]] = []

    def two_parts_running() -> bool:
        view = runtime.service.jobs.get("default", job.id)
        seen.append((view.status, view.stage, view.total_chunks, view.processed_chunks))
        running = [p for p in parts_of(runtime, job.id) if p.status == "running"]
        return len(running) >= 2

    wait_for(two_parts_running, what="two parts at work at once", interval=0.01)
    finished = done(runtime, job.id)
    seen.append(("completed", "done", finished.total_chunks, finished.processed_chunks))
    assert len(embedder.threads) >= 2  # different workers embedded its pages
    final = finished.total_chunks
    assert final is not None
    running = [s for s in seen if s[0] == "running"]
    assert running
    assert all(total is None or total == final for _, _, total, _ in seen)
    processed = [p for *_, p in seen]
    assert processed == sorted(processed)  # no part failed: progress only grows
    assert processed[-1] == final


def test_a_part_failing_for_good_fails_the_job_and_keeps_the_previous_generation(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    embedder = ThreadsSeen()
    runtime = make_runtime(embedder=embedder, pdf_part_pages=PER_PART)
    first = done(runtime, upload_file(runtime, big_pdf(tmp_path)).id)
    before = len(chunk_pages(runtime, first.document_id))

    embedder.refuse = "pageword10 "  # a page of the last part
    reindexed = runtime.service.documents.reindex("default", first.document_id)
    failed = done(runtime, reindexed, ("failed",))
    assert (failed.error_code, failed.error) == ("model_refused", "the model refused this text")
    assert failed.retryable is False
    parts = parts_of(runtime, reindexed)
    assert sorted(p.status for p in parts).count("failed") == 1
    assert all(p.status in ("failed", "completed", "cancelled") for p in parts)
    rows = chunk_pages(runtime, first.document_id)
    assert {r.generation for r in rows} == {1}  # the new generation's chunks are gone
    assert len(rows) == before
    assert runtime.service.documents.get("default", first.document_id).status == "failed"

    embedder.refuse = None
    retried = done(runtime, runtime.service.jobs.retry("default", reindexed).id)
    assert retried.processed_chunks == before
    assert {r.generation for r in chunk_pages(runtime, first.document_id)} == {2}
    assert len(parts_of(runtime, reindexed)) == 3  # the earlier attempt's parts were replaced


def test_cancelling_a_split_job_stops_its_parts(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    embedder = ThreadsSeen(delay_s=0.05)
    runtime = make_runtime(embedder=embedder, pdf_part_pages=PER_PART)
    job = upload_file(runtime, big_pdf(tmp_path))
    wait_for(lambda: runtime.service.jobs.get("default", job.id).processed_chunks > 0)
    runtime.service.jobs.cancel("default", job.id)
    done(runtime, job.id, ("cancelled",))
    assert {p.status for p in parts_of(runtime, job.id)} == {"cancelled"}
    wait_for(lambda: runtime.runner.heartbeat._leases == set(), what="workers let go")
    assert index_rows(runtime) == (0, 0, 0)
    assert runtime.service.documents.get("default", job.document_id).status == "cancelled"


def test_a_transient_failure_retries_one_part_and_leaves_no_duplicates(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    embedder = FlakyEmbedder(fail_on=[3])
    runtime = make_runtime(embedder=embedder, pdf_part_pages=PER_PART)
    job = upload_file(runtime, big_pdf(tmp_path))
    finished = done(runtime, job.id)
    rows = chunk_pages(runtime, job.document_id)
    assert finished.total_chunks == finished.processed_chunks == len(rows)
    assert len({r.ordinal for r in rows}) == len(rows)
    parts = parts_of(runtime, job.id)
    with runtime.db.read() as conn:
        attempts = sorted(
            conn.scalars(
                select(ingest_jobs.c.attempt).where(ingest_jobs.c.parent_id == job.id)
            ).all()
        )
    assert attempts == [1, 1, 2]  # one part ran twice
    assert {p.status for p in parts} == {"completed"}
    assert finished.attempt == 1  # the job itself was not retried


def test_a_split_pdf_without_text_fails_like_a_scanned_pdf(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    runtime = make_runtime(pdf_part_pages=2)
    job = upload_file(runtime, make_scanned_pdf(tmp_path / "scan.pdf", pages=6))
    failed = done(runtime, job.id, ("failed",))
    assert failed.error_code == "no_text_layer"
    assert failed.error is not None
    assert "OCR" in failed.error
    assert index_rows(runtime) == (0, 0, 0)
    assert len(parts_of(runtime, job.id)) == 3


def test_a_pdf_within_the_part_size_is_not_split(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    runtime = make_runtime(pdf_part_pages=PAGES)
    job = upload_file(runtime, big_pdf(tmp_path))
    finished = done(runtime, job.id)
    assert parts_of(runtime, job.id) == []
    rows = chunk_pages(runtime, job.document_id)
    assert [r.ordinal for r in rows] == list(range(len(rows)))
    assert finished.total_chunks == len(rows)


def test_every_part_chunks_with_the_settings_the_job_split_with(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    """The dataset's chunk settings change while the parts wait: they still chunk alike, as the
    job was when it split (a part retried later overwrites exactly what it wrote)."""
    embedder = ThreadsSeen()
    embedder.gate.clear()  # the model waits until the settings have changed
    runtime = make_runtime(embedder=embedder, pdf_part_pages=PER_PART, chunk_size=64)
    job = upload_file(runtime, big_pdf(tmp_path))
    wait_for(lambda: len(parts_of(runtime, job.id)) == 3, what="the split")
    runtime.service.datasets.update(
        "default", job.dataset_id, {"chunk_size": 32, "chunk_overlap": 4}
    )
    embedder.gate.set()
    done(runtime, job.id)
    with runtime.db.read() as conn:
        tokens = conn.scalars(
            select(chunks.c.token_count).where(chunks.c.document_id == job.document_id)
        ).all()
    assert 32 < max(tokens) <= 64


def test_the_chunk_limit_counts_the_chunks_of_all_parts(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    """Each part stays under KOPS_MAX_CHUNKS_PER_DOCUMENT; together they pass it: the document
    fails as a whole document over the limit does, and nothing of it is left."""
    runtime = make_runtime(pdf_part_pages=2, max_chunks_per_document=10)
    job = upload_file(runtime, big_pdf(tmp_path))
    failed = done(runtime, job.id, ("failed",))
    assert (failed.error_code, failed.error_category) == ("too_many_chunks", "user_action_required")
    assert failed.error is not None
    assert "KOPS_MAX_CHUNKS_PER_DOCUMENT" in failed.error
    assert index_rows(runtime) == (0, 0, 0)
    assert len(parts_of(runtime, job.id)) == 6


def test_a_part_drops_what_an_earlier_attempt_of_it_wrote(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    """A row left in a part's ordinal range (an earlier attempt that chunked differently) is
    gone once the part has run: the generation holds exactly what the parts wrote."""
    embedder = ThreadsSeen()
    embedder.gate.clear()
    runtime = make_runtime(embedder=embedder, workers=1, pdf_part_pages=PER_PART)
    job = upload_file(runtime, big_pdf(tmp_path))
    wait_for(lambda: len(parts_of(runtime, job.id)) == 3, what="the split")
    last = parts_of(runtime, job.id)[2]
    stray = IndexedChunk(
        id=chunk_id(job.document_id, 1, last.ordinal_base + 7),
        document_id=job.document_id,
        dataset_id=job.dataset_id,
        generation=1,
        ordinal=last.ordinal_base + 7,
        text="a chunk an earlier attempt wrote",
        content_hash="0" * 64,
        token_count=6,
        page_start=9,
        page_end=9,
        section=None,
        vector=HashingEmbedder().embed(["a chunk an earlier attempt wrote"])[0],
    )
    with runtime.db.write() as conn:
        runtime.index.upsert(conn, [stray])
    embedder.gate.set()
    finished = done(runtime, job.id)
    rows = chunk_pages(runtime, job.document_id)
    assert "a chunk an earlier attempt wrote" not in [r.text for r in rows]
    assert finished.total_chunks == len(rows)
