"""Exactly-once effects on at-least-once delivery, on the real embedded runtime (SQLite + threads).

The subject is the jobs core and the index working together, so the deterministic embedder stands
in for the model; wrappers around it inject the failures.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text

from knowledgeops.db.blobs import LocalBlobStore
from knowledgeops.db.migrate import upgrade
from knowledgeops.db.schema import chunks, documents, ingest_jobs
from knowledgeops.errors import Conflict, TransientError
from knowledgeops.ingest.embedders.base import Vectors
from knowledgeops.ingest.index.sqlite import SqliteIndex
from knowledgeops.jobs.runner import Outcome
from knowledgeops.jobs.states import JobStatus
from knowledgeops.lab.embedders import HashingEmbedder
from knowledgeops.roles.embedded import EmbeddedRole
from knowledgeops.service.search import SearchMode
from knowledgeops.service.views import JobView

from ..conftest import wait_for

TOPICS = ["ownership", "borrowing", "lifetimes", "traits", "closures", "iterators"]


def long_text(topic: str, sentences: int = 200) -> str:
    return " ".join(
        f"Sentence {n} explains {topic} with example number {n} in detail."
        for n in range(sentences)
    )


class FlakyEmbedder(HashingEmbedder):
    """Raises a transient error on chosen calls (1-based), like a provider timing out."""

    def __init__(self, fail_on: Sequence[int] = (), delay_s: float = 0.0) -> None:
        super().__init__()
        self.fail_on = set(fail_on)
        self.delay_s = delay_s
        self.gate = threading.Event()
        self.gate.set()

    def embed(self, texts: Sequence[str]) -> Vectors:
        self.gate.wait(30)
        if self.delay_s:
            threading.Event().wait(self.delay_s)
        with self._lock:
            call = self.calls + 1
        if call in self.fail_on:
            with self._lock:
                self.calls += 1
            raise TransientError("the embedding provider timed out", code="embedder_timeout")
        return super().embed(texts)


def upload(runtime: EmbeddedRole, tmp: Path, name: str, body: str) -> JobView:
    staged = runtime.blobs.stage(10_000_000)
    staged.write(body.encode())
    accepted = runtime.service.uploads.accept(
        "default", staged, file_name=name, declared_type=None, dataset_id=None, idempotency_key=None
    )
    return accepted.job


def done(runtime: EmbeddedRole, job_id: str, statuses: tuple[str, ...] = ("completed",)) -> JobView:
    return wait_for(  # type: ignore[no-any-return]
        lambda: (job := runtime.service.jobs.get("default", job_id)).status in statuses and job
    )


def chunk_rows(runtime: EmbeddedRole, document_id: str) -> list[tuple[int, int]]:
    with runtime.db.read() as conn:
        return [
            (row.generation, row.ordinal)
            for row in conn.execute(
                select(chunks.c.generation, chunks.c.ordinal).where(
                    chunks.c.document_id == document_id
                )
            )
        ]


def index_rows(runtime: EmbeddedRole) -> tuple[int, int, int]:
    """Rows in `chunks`, vector rows and keyword rows."""
    index = runtime.index
    with runtime.db.read() as conn:
        n_chunks = conn.scalar(select(func.count()).select_from(chunks))
        if isinstance(index, SqliteIndex):
            n_vec = conn.execute(text(f"SELECT count(*) FROM {index.vec}")).scalar_one()
            n_words = conn.execute(text(f"SELECT count(*) FROM {index.fts}")).scalar_one()
        else:
            n_vec, n_words = conn.execute(
                text(f"SELECT count(*), count({index.words}) FROM {index.table}")
            ).one()
    return int(n_chunks or 0), int(n_vec), int(n_words)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def make_runtime(
    make_runtime: Callable[..., EmbeddedRole], request: pytest.FixtureRequest
) -> Iterator[Callable[..., EmbeddedRole]]:
    """Each test on the SQLite file and on PostgreSQL with pgvector (one database per test)."""
    if request.param == "sqlite":
        yield make_runtime
        return
    url = request.getfixturevalue("pgvector_db").url
    made: list[EmbeddedRole] = []

    def make(**overrides: Any) -> EmbeddedRole:
        overrides.setdefault("database_url", url)
        runtime = make_runtime(**overrides)
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:  # stopped before the database is dropped
        if runtime.started_at is not None:
            runtime.stop()
            runtime.started_at = None


def test_a_retry_after_partial_writes_leaves_no_duplicates(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    embedder = FlakyEmbedder(fail_on=[3])  # two batches are written, then the third fails
    runtime = make_runtime(embedder=embedder, workers=1)
    job = upload(runtime, tmp_path, "ownership.txt", long_text("ownership"))
    finished = done(runtime, job.id)
    assert finished.attempt == 2
    assert finished.retries == 1
    assert finished.total_chunks == finished.processed_chunks
    rows = chunk_rows(runtime, finished.document_id)
    assert len(rows) == len(set(rows)) == finished.total_chunks
    assert {generation for generation, _ in rows} == {1}
    assert index_rows(runtime) == (len(rows),) * 3
    hits = runtime.service.search.search(
        "default", finished.dataset_id, "ownership example", top_k=100, mode=SearchMode.KEYWORD
    )
    assert len(hits) == finished.total_chunks


def test_a_second_delivery_of_a_running_or_finished_job_is_skipped(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    embedder = FlakyEmbedder()
    embedder.gate.clear()  # hold the first batch until we have redelivered
    runtime = make_runtime(embedder=embedder, workers=2)
    job = upload(runtime, tmp_path, "traits.txt", long_text("traits"))
    wait_for(lambda: runtime.service.jobs.get("default", job.id).status == "running")
    assert runtime.runner.run_job(job.id) is Outcome.SKIPPED
    runtime.queue.publish(job.id)  # a duplicate publish reaches the other worker
    embedder.gate.set()
    finished = done(runtime, job.id)
    assert finished.attempt == 1
    assert runtime.runner.run_job(job.id) is Outcome.SKIPPED
    assert len(chunk_rows(runtime, finished.document_id)) == finished.total_chunks


def test_a_failed_reindex_keeps_the_previous_generation_searchable(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    embedder = FlakyEmbedder()
    runtime = make_runtime(embedder=embedder, workers=1, max_attempts=1)
    first = done(runtime, upload(runtime, tmp_path, "closures.txt", long_text("closures")).id)
    before = runtime.service.search.search(
        "default", first.dataset_id, "closures", top_k=100, mode=SearchMode.KEYWORD
    )
    embedder.fail_on = {embedder.calls + 2}  # the reindex fails after writing one batch
    reindex_id = runtime.service.documents.reindex("default", first.document_id)
    failed = done(runtime, reindex_id, ("failed",))
    assert (failed.kind, failed.error_code, failed.error_category) == (
        "reindex",
        "embedder_timeout",
        "transient",
    )
    after = runtime.service.search.search(
        "default", first.dataset_id, "closures", top_k=100, mode=SearchMode.KEYWORD
    )
    assert [h.chunk_id for h in after] == [h.chunk_id for h in before]
    assert {g for g, _ in chunk_rows(runtime, first.document_id)} == {1}  # partial gen 2 gone
    document = runtime.service.documents.get("default", first.document_id)
    assert (document.searchable, document.active_generation, document.status) == (
        True,
        1,
        "failed",
    )


def test_a_successful_reindex_switches_generations_atomically(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    runtime = make_runtime(workers=1)
    first = done(runtime, upload(runtime, tmp_path, "iter.txt", long_text("iterators")).id)
    reindexed = done(runtime, runtime.service.documents.reindex("default", first.document_id))
    assert reindexed.kind == "reindex"
    rows = chunk_rows(runtime, first.document_id)
    assert {g for g, _ in rows} == {2}
    assert len(rows) == reindexed.total_chunks == first.total_chunks
    document = runtime.service.documents.get("default", first.document_id)
    assert (document.active_generation, document.chunk_count) == (2, len(rows))
    assert index_rows(runtime) == (len(rows),) * 3


def test_cancel_mid_embedding_removes_the_partial_generation(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    embedder = FlakyEmbedder(delay_s=0.05)
    runtime = make_runtime(embedder=embedder, workers=1)
    job = upload(runtime, tmp_path, "lifetimes.txt", long_text("lifetimes", 200))
    wait_for(lambda: runtime.service.jobs.get("default", job.id).processed_chunks > 0)
    runtime.service.jobs.cancel("default", job.id)
    cancelled = done(runtime, job.id, ("cancelled",))
    calls_at_cancel = embedder.calls
    threading.Event().wait(0.3)
    assert embedder.calls <= calls_at_cancel + 1  # stopped at the next batch boundary
    assert chunk_rows(runtime, cancelled.document_id) == []
    assert index_rows(runtime) == (0, 0, 0)
    assert runtime.service.documents.get("default", cancelled.document_id).status == "cancelled"
    retried = done(runtime, runtime.service.jobs.retry("default", job.id).id)
    assert retried.processed_chunks == retried.total_chunks
    assert len(chunk_rows(runtime, retried.document_id)) == retried.total_chunks


def test_deleting_a_document_while_it_is_processed_leaves_nothing_behind(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    embedder = FlakyEmbedder(delay_s=0.05)
    runtime = make_runtime(embedder=embedder, workers=1)
    job = upload(runtime, tmp_path, "borrow.txt", long_text("borrowing", 200))
    wait_for(lambda: runtime.service.jobs.get("default", job.id).processed_chunks > 0)
    blob = runtime.blobs.path(runtime.service.documents.get("default", job.document_id).sha256)
    runtime.service.documents.delete("default", job.document_id)
    wait_for(lambda: embedder.calls > 0 and runtime.runner.heartbeat._leases == set())
    threading.Event().wait(0.3)
    assert index_rows(runtime) == (0, 0, 0)
    assert not blob.exists()
    with runtime.db.read() as conn:
        assert conn.scalar(select(func.count()).select_from(documents)) == 0


def test_the_same_bytes_are_one_document_and_one_blob(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    runtime = make_runtime()
    first = upload(runtime, tmp_path, "a.txt", long_text("traits", 5))
    second = upload(runtime, tmp_path, "copy-of-a.txt", long_text("traits", 5))
    assert (second.id, second.document_id) == (first.id, first.document_id)
    blobs = [p for p in (runtime.settings.data_dir / "blobs").rglob("*") if p.is_file()]
    assert len(blobs) == 1


def test_many_documents_complete_exactly_once(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    runtime = make_runtime(workers=3)
    jobs = [
        upload(runtime, tmp_path, f"{topic}-{n}.txt", long_text(f"{topic} {n}", 20))
        for n in range(4)
        for topic in TOPICS
    ]
    finished = [done(runtime, job.id) for job in jobs]
    assert {job.attempt for job in finished} == {1}
    total = sum(job.total_chunks or 0 for job in finished)
    assert index_rows(runtime) == (total,) * 3
    with runtime.db.read() as conn:
        duplicates = conn.execute(
            text(
                "SELECT document_id, generation, ordinal FROM chunks "
                "GROUP BY 1, 2, 3 HAVING count(*) > 1"
            )
        ).all()
    assert duplicates == []


def test_a_restart_finishes_what_was_accepted(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    """Jobs accepted but never run (the process stopped) are run by the next process."""
    quiet = make_runtime(start=False)
    quiet.acquire()

    upgrade(quiet.db.engine)
    quiet.index.ensure()
    quiet.service.datasets.ensure_default("default")
    jobs = [upload(quiet, tmp_path, f"{t}.txt", long_text(t, 10)) for t in TOPICS[:3]]
    quiet.db.dispose()
    quiet.lock.release()
    assert {runtime_job.status for runtime_job in jobs} == {JobStatus.PENDING.value}

    again = make_runtime(data_dir=quiet.settings.data_dir)
    for job in jobs:
        assert done(again, job.id).processed_chunks > 0


def test_stale_uploads_in_incoming_are_removed_at_start(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    data = tmp_path / "stale"
    LocalBlobStore(data).stage(100).write(b"half an upload")
    runtime = make_runtime(data_dir=data)
    assert list(runtime.blobs.incoming.iterdir()) == []


def test_only_the_newest_job_of_a_document_can_be_retried(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    embedder = FlakyEmbedder(fail_on=[1])
    runtime = make_runtime(embedder=embedder, workers=1, max_attempts=1)
    first = done(
        runtime, upload(runtime, tmp_path, "t.txt", long_text("traits", 50)).id, ("failed",)
    )
    second = done(runtime, runtime.service.documents.reindex("default", first.document_id))
    with pytest.raises(Conflict) as refused:
        runtime.service.jobs.retry("default", first.id)
    assert refused.value.code == "superseded"
    assert {g for g, _ in chunk_rows(runtime, first.document_id)} == {second_generation(second)}


def second_generation(job: JobView) -> int:
    return 2 if job.kind == "reindex" else 1


def test_a_retry_with_other_chunk_settings_leaves_no_stale_chunks(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    """Attempt 1 writes two batches of small chunks and fails; the dataset's chunk size grows
    before attempt 2, which makes fewer chunks: none of attempt 1's extra ordinals may survive."""
    runtime_box: list[EmbeddedRole] = []

    class ResizingEmbedder(FlakyEmbedder):
        def embed(self, texts: Sequence[str]) -> Vectors:
            if self.calls == 2:
                runtime = runtime_box[0]
                default = runtime.service.datasets.resolve("default", None)
                runtime.service.datasets.update(
                    "default", default.id, {"chunk_size": 200, "chunk_overlap": 10}
                )
            return super().embed(texts)

    runtime = make_runtime(embedder=ResizingEmbedder(fail_on=[3]), workers=1, chunk_size=32)
    runtime_box.append(runtime)
    finished = done(runtime, upload(runtime, tmp_path, "x.txt", long_text("closures")).id)
    assert finished.attempt == 2
    rows = chunk_rows(runtime, finished.document_id)
    assert sorted(ordinal for _, ordinal in rows) == list(range(finished.total_chunks or 0))
    assert index_rows(runtime) == (len(rows),) * 3
    document = runtime.service.documents.get("default", finished.document_id)
    assert document.chunk_count == finished.total_chunks


def test_stopping_gives_unfinished_jobs_back_without_spending_an_attempt(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    embedder = FlakyEmbedder()
    embedder.gate.clear()  # the worker is stuck inside the model when the process stops
    runtime = make_runtime(embedder=embedder, workers=1, shutdown_grace_s=0.3)
    job = upload(runtime, tmp_path, "stuck.txt", long_text("lifetimes", 50))
    wait_for(lambda: runtime.service.jobs.get("default", job.id).stage == "embedding")
    runtime.stop()
    runtime.started_at = None  # stopped by hand
    embedder.gate.set()
    with runtime.db.read() as conn:
        row = conn.execute(
            select(ingest_jobs.c.status, ingest_jobs.c.attempt).where(ingest_jobs.c.id == job.id)
        ).one()
    assert (row.status, row.attempt) == ("retrying", 0)
    again = make_runtime(data_dir=runtime.settings.data_dir, embedder=HashingEmbedder())
    finished = done(again, job.id)
    assert finished.attempt == 1


def test_vacuum_keeps_index_rows_pointing_at_their_chunks(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    """SQLite documents that VACUUM may renumber the implicit rowids of a table without an
    INTEGER PRIMARY KEY; the first document's rows are deleted so that renumbering would shift
    the second one's chunks away from their vector and keyword rows."""
    runtime = make_runtime(workers=1)
    gone = done(runtime, upload(runtime, tmp_path, "a.txt", long_text("ownership", 40)).id)
    keep = done(runtime, upload(runtime, tmp_path, "b.txt", long_text("borrowing", 40)).id)
    runtime.service.documents.delete("default", gone.document_id)
    if runtime.db.is_sqlite:
        raw = runtime.db.engine.raw_connection()  # VACUUM runs outside any transaction
        try:
            raw.driver_connection.execute("VACUUM")  # type: ignore[union-attr]
        finally:
            raw.close()
    else:
        with runtime.db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            c.exec_driver_sql("VACUUM FULL")
    by_words = runtime.service.search.search(
        "default", keep.dataset_id, "borrowing", top_k=50, mode=SearchMode.KEYWORD
    )
    by_vector = runtime.service.search.search(
        "default", keep.dataset_id, "borrowing example", top_k=50, mode=SearchMode.VECTOR
    )
    assert len(by_words) == keep.total_chunks
    assert len(by_vector) == keep.total_chunks
    assert all("borrowing" in h.text for h in [*by_words, *by_vector])


def test_unreferenced_stored_files_are_swept_at_start(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    runtime = make_runtime(workers=1)
    kept = done(runtime, upload(runtime, tmp_path, "a.txt", long_text("traits", 5)).id)
    data_dir = runtime.settings.data_dir
    runtime.stop()
    runtime.started_at = None
    stray = runtime.blobs.path("ab" * 32)
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_bytes(b"left behind by a commit that failed")
    again = make_runtime(data_dir=data_dir)
    assert not stray.exists()
    assert again.blobs.exists(again.service.documents.get("default", kept.document_id).sha256)
