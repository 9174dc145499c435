# ruff: noqa: F811 (make_runtime, imported: the fixture that runs each test on both engines)
"""Re-embedding a dataset whose model changed (ingest/reembed.py), on the real embedded runtime,
on SQLite and on PostgreSQL with pgvector.

Two deterministic "models" stand in for real ones (the subject is the job, not the vectors):
the same hashing embedder, salted differently, under two model ids. The second one counts what
the workers give it and can hold them at a chosen call, so a test can look at a dataset half-way
through.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from knowledgeops.db.schema import chunks, documents, outbox
from knowledgeops.errors import Conflict, TransientError
from knowledgeops.ingest.embedders.base import Vectors
from knowledgeops.lab.embedders import HashingEmbedder
from knowledgeops.roles.embedded import EmbeddedRole
from knowledgeops.service.search import SearchMode
from knowledgeops.service.views import JobView
from tests.integration.test_exactly_once import (  # noqa: F401 (make_runtime: both engines)
    chunk_rows,
    done,
    index_rows,
    long_text,
    make_runtime,
    upload,
)

from ..conftest import wait_for

MODEL_A = "test/model-a"
MODEL_B = "test/model-b"
TENANT = "default"


def _in_worker() -> bool:
    return threading.current_thread().name.startswith("kops-worker")


class ModelB(HashingEmbedder):
    """The new model. `hold_at`: the workers' call (1-based) that waits for `release()`;
    `fail_at`: calls that raise a transient error (a provider timing out)."""

    def __init__(self, *, hold_at: int | None = None, fail_at: Sequence[int] = ()) -> None:
        super().__init__(model_id=MODEL_B, salt="b:")
        self.hold_at = hold_at
        self.fail_at = set(fail_at)
        self.worker_calls = 0
        self.worker_texts = 0  # texts embedded for documents (not queries), failed calls not
        self.query_calls = 0
        self.held = threading.Event()
        self.gate = threading.Event()

    def release(self) -> None:
        self.gate.set()

    def embed(self, texts: Sequence[str]) -> Vectors:
        if not _in_worker():
            self.query_calls += 1
            return super().embed(texts)
        self.worker_calls += 1
        call = self.worker_calls
        if call == self.hold_at:
            self.held.set()
            self.gate.wait(30)
        if call in self.fail_at:
            raise TransientError("the embedding provider timed out", code="embedder_timeout")
        self.worker_texts += len(texts)
        return super().embed(texts)


class ModelA(HashingEmbedder):
    def __init__(self) -> None:
        super().__init__(model_id=MODEL_A)
        self.query_calls = 0

    def embed(self, texts: Sequence[str]) -> Vectors:
        if not _in_worker():
            self.query_calls += 1
        return super().embed(texts)


TOPICS = ("ownership", "borrowing", "lifetimes")


def _dataset_of_three(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path, b: ModelB, **settings: Any
) -> tuple[EmbeddedRole, ModelA, list[JobView]]:
    a = ModelA()
    runtime = make_runtime(embedder=[a, b], workers=1, **settings)
    jobs = [
        done(runtime, upload(runtime, tmp_path, f"{topic}.txt", long_text(topic, 90)).id)
        for topic in TOPICS
    ]
    return runtime, a, jobs


def _models(runtime: EmbeddedRole) -> dict[str, str | None]:
    with runtime.db.read() as conn:
        return {
            row.file_name: row.embedding_model
            for row in conn.execute(select(documents.c.file_name, documents.c.embedding_model))
        }


def _reembed(runtime: EmbeddedRole, dataset_id: str, model: str = MODEL_B) -> str:
    view = runtime.service.datasets.update(TENANT, dataset_id, {"embedding_model": model})
    assert view.embedding_model == model
    assert view.reembed_job_id is not None
    return view.reembed_job_id


def _search(runtime: EmbeddedRole, dataset_id: str, query: str, mode: SearchMode) -> list[Any]:
    return runtime.service.search.search(TENANT, dataset_id, query, top_k=200, mode=mode)


def _total_chunks(jobs: list[JobView]) -> int:
    return sum(job.total_chunks or 0 for job in jobs)


def test_a_new_model_reembeds_every_document_once_while_search_keeps_answering(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    b = ModelB(hold_at=4)  # each document is a few batches: hold at the second document's
    runtime, a, jobs = _dataset_of_three(make_runtime, tmp_path, b)
    dataset_id = jobs[0].dataset_id
    before = {job.document_id: chunk_rows(runtime, str(job.document_id)) for job in jobs}
    assert all(16 < len(rows) <= 24 for rows in before.values())  # three batches of 8 each
    assert set(_models(runtime).values()) == {MODEL_A}

    job_id = _reembed(runtime, dataset_id)
    assert b.held.wait(30)
    job = wait_for(
        lambda: (j := runtime.service.jobs.get(TENANT, job_id)).processed_chunks == 1 and j
    )
    assert (job.kind, job.status, job.stage, job.unit) == (
        "reembed",
        "running",
        "embedding",
        "documents",
    )
    assert (job.total_chunks, job.document_id, job.file_name) == (3, None, None)
    dataset = runtime.service.datasets.get(TENANT, dataset_id)
    assert dataset.document_models == {MODEL_B: 1, MODEL_A: 2}
    assert dataset.embedding_model == MODEL_B  # uploads from now on are embedded by B

    # half-way: every document answers, from its current generation, each by its own model
    queries_a, queries_b = a.query_calls, b.query_calls
    for mode in (SearchMode.VECTOR, SearchMode.HYBRID):
        hits = _search(runtime, dataset_id, "example explains borrowing", mode)
        assert {hit.document_id for hit in hits} == set(before)
        assert len({(hit.document_id, hit.ordinal) for hit in hits}) == len(hits)
    assert (a.query_calls - queries_a, b.query_calls - queries_b) == (2, 2)

    b.release()
    finished = done(runtime, job_id)
    assert (finished.processed_chunks, finished.total_chunks, finished.attempt) == (3, 3, 1)
    assert set(_models(runtime).values()) == {MODEL_B}
    after = {job.document_id: chunk_rows(runtime, str(job.document_id)) for job in jobs}
    for document_id, rows in after.items():
        old_generation = {g for g, _ in before[document_id]}
        assert {g for g, _ in rows} == {max(old_generation) + 1}  # the old one is gone
        assert sorted(o for _, o in rows) == sorted(o for _, o in before[document_id])
    total = _total_chunks(jobs)
    assert index_rows(runtime) == (total,) * 3  # no duplicate, no leftover vector or word
    assert b.worker_texts == total  # every chunk embedded once by the new model
    queries_a = a.query_calls
    hits = _search(runtime, dataset_id, "example explains lifetimes", SearchMode.HYBRID)
    assert hits
    assert hits[0].file_name == "lifetimes.txt"
    assert a.query_calls == queries_a  # the old model is no longer asked
    assert runtime.service.datasets.get(TENANT, dataset_id).document_models == {MODEL_B: 3}

    # a redelivery of the finished job does nothing
    runtime.queue.publish(job_id)
    assert runtime.runner.run_job(job_id).value == "skipped"
    assert b.worker_texts == total

    # an upload after the change is embedded by the new model
    late = done(runtime, upload(runtime, tmp_path, "traits.txt", long_text("traits", 10)).id)
    assert _models(runtime)["traits.txt"] == MODEL_B
    assert b.worker_texts == total + (late.total_chunks or 0)


def test_an_interrupted_reembed_resumes_where_it_stopped_and_embeds_nothing_twice(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    # the first document takes calls 1-3; the second's first batch (4) is written, its second
    # (5) fails: the retry skips the first document, and the second's first batch comes back
    # from the embedding cache (on by default; the tests turn it off unless asked)
    b = ModelB(fail_at=[5])
    runtime, _, jobs = _dataset_of_three(make_runtime, tmp_path, b, embed_cache=True)
    per_document = [job.total_chunks or 0 for job in jobs]
    assert all(16 < n <= 24 for n in per_document), per_document  # three batches of 8 each
    job_id = _reembed(runtime, jobs[0].dataset_id)
    finished = done(runtime, job_id)
    assert (finished.status, finished.attempt, finished.retries) == ("completed", 2, 1)
    assert (finished.processed_chunks, finished.total_chunks) == (3, 3)
    total = _total_chunks(jobs)
    assert b.worker_texts == total  # the failed batch aside, the model embedded nothing twice
    assert index_rows(runtime) == (total,) * 3
    assert set(_models(runtime).values()) == {MODEL_B}


def test_a_cancelled_reembed_keeps_what_it_finished_and_can_be_started_again(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    b = ModelB(hold_at=4)
    runtime, a, jobs = _dataset_of_three(make_runtime, tmp_path, b)
    dataset_id = jobs[0].dataset_id
    job_id = _reembed(runtime, dataset_id)
    assert b.held.wait(30)
    runtime.service.jobs.cancel(TENANT, job_id)
    b.release()  # the held batch comes back to a job that is no longer the worker's
    cancelled = done(runtime, job_id, ("cancelled",))
    assert cancelled.processed_chunks == 1
    models = _models(runtime)
    assert sorted(models.values()) == [MODEL_A, MODEL_A, MODEL_B]
    # the unfinished generation was dropped: every document holds only its searchable one
    with runtime.db.read() as conn:
        active = dict(conn.execute(select(documents.c.id, documents.c.active_generation)).all())
        held = conn.execute(select(chunks.c.document_id, chunks.c.generation).distinct()).all()
    assert all(active[document_id] == generation for document_id, generation in held)
    queries_a, queries_b = a.query_calls, b.query_calls
    hits = _search(runtime, dataset_id, "example explains ownership", SearchMode.HYBRID)
    assert len({hit.document_id for hit in hits}) == 3
    assert (a.query_calls - queries_a, b.query_calls - queries_b) == (1, 1)  # both models

    # the same change again takes the rest
    again = _reembed(runtime, dataset_id)
    assert again != job_id
    finished = done(runtime, again)
    assert (finished.processed_chunks, finished.total_chunks) == (3, 3)
    assert set(_models(runtime).values()) == {MODEL_B}
    assert index_rows(runtime) == (_total_chunks(jobs),) * 3
    queries_a = a.query_calls
    _search(runtime, dataset_id, "example explains ownership", SearchMode.VECTOR)
    assert a.query_calls == queries_a  # all on B: the old model is no longer asked


def test_a_model_change_waits_for_the_datasets_jobs_and_names_the_models(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    b = ModelB(hold_at=1)
    runtime, _, jobs = _dataset_of_three(make_runtime, tmp_path, b)
    dataset_id = jobs[0].dataset_id
    datasets = runtime.service.datasets
    with pytest.raises(Exception, match="the available models are") as unknown:
        datasets.update(TENANT, dataset_id, {"embedding_model": "no/such-model"})
    assert getattr(unknown.value, "code", None) == "unknown_model"
    # the same model again: nothing to do, no job
    same = datasets.update(TENANT, dataset_id, {"embedding_model": MODEL_A})
    assert same.reembed_job_id is None
    job_id = _reembed(runtime, dataset_id)
    assert b.held.wait(30)
    # while the re-embed runs: the same change again is accepted and starts nothing new
    assert datasets.update(TENANT, dataset_id, {"embedding_model": MODEL_B}).reembed_job_id == (
        job_id
    )
    # another change must wait for it
    with pytest.raises(Conflict, match="pending or running") as busy:
        datasets.update(TENANT, dataset_id, {"embedding_model": MODEL_A})
    assert busy.value.code == "jobs_in_progress"
    assert job_id in busy.value.message
    b.release()
    done(runtime, job_id)


def test_a_failed_reembed_drops_its_unfinished_generation_and_a_retry_finishes_it(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    b = ModelB(fail_at=[2])  # the first document's second batch, with no attempt left
    runtime, _, jobs = _dataset_of_three(make_runtime, tmp_path, b, max_attempts=1)
    dataset_id = jobs[0].dataset_id
    job_id = _reembed(runtime, dataset_id)
    failed = done(runtime, job_id, ("failed",))
    assert (failed.error_code, failed.error_category) == ("embedder_timeout", "transient")
    assert set(_models(runtime).values()) == {MODEL_A}
    assert index_rows(runtime) == (_total_chunks(jobs),) * 3  # its first batch is gone
    other = runtime.service.datasets.get(TENANT, dataset_id)
    assert other.reembed_job_id == job_id
    assert runtime.service.jobs.retry(TENANT, job_id).status == "pending"
    finished = done(runtime, job_id)
    assert (finished.processed_chunks, finished.total_chunks) == (3, 3)
    assert set(_models(runtime).values()) == {MODEL_B}
    assert index_rows(runtime) == (_total_chunks(jobs),) * 3


def test_a_document_deleted_mid_reembed_is_skipped_and_leaves_nothing_behind(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    b = ModelB(hold_at=4)  # the second document's first batch
    runtime, _, jobs = _dataset_of_three(make_runtime, tmp_path, b)
    job_id = _reembed(runtime, jobs[0].dataset_id)
    assert b.held.wait(30)
    runtime.service.documents.delete(TENANT, str(jobs[1].document_id))
    b.release()
    finished = done(runtime, job_id)
    assert (finished.processed_chunks, finished.total_chunks) == (3, 3)
    assert sorted(_models(runtime)) == ["lifetimes.txt", "ownership.txt"]
    assert set(_models(runtime).values()) == {MODEL_B}
    kept = (jobs[0].total_chunks or 0) + (jobs[2].total_chunks or 0)
    assert index_rows(runtime) == (kept,) * 3


def test_a_dataset_deleted_mid_reembed_takes_its_job_along(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    b = ModelB(hold_at=2)
    a = ModelA()
    runtime = make_runtime(embedder=[a, b], workers=1)
    dataset = runtime.service.datasets.create(TENANT, "doomed")
    staged = runtime.blobs.stage(10_000_000)
    staged.write(long_text("traits", 90).encode())
    accepted = runtime.service.uploads.accept(
        TENANT,
        staged,
        file_name="traits.txt",
        declared_type=None,
        dataset_id=dataset.id,
        idempotency_key=None,
    )
    done(runtime, accepted.job.id)
    job_id = _reembed(runtime, dataset.id)
    assert b.held.wait(30)
    runtime.service.datasets.delete(TENANT, dataset.id)
    b.release()
    with pytest.raises(Exception, match="not found"):
        runtime.service.jobs.get(TENANT, job_id)
    assert runtime.store.get(job_id) is None  # its row is gone (with its outbox row)
    wait_for(lambda: b.worker_texts > 0)  # the held batch came back to a job that is gone
    with runtime.db.read() as conn:
        left = conn.execute(select(outbox.c.id).where(outbox.c.job_id == job_id)).all()
    assert left == []
    assert index_rows(runtime) == (0, 0, 0)  # nor did its late batch write anything


def test_a_failed_reindex_cannot_be_retried_over_a_reembedded_generation(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    """A re-embed takes the next generation number, never a failed job's: retrying that job
    afterwards would start by dropping its generation, now the searchable one."""

    class Refuses(ModelA):
        refuse = False

        def embed(self, texts: Sequence[str]) -> Vectors:
            if self.refuse and _in_worker():
                raise TransientError("the embedding provider timed out", code="embedder_timeout")
            return super().embed(texts)

    a, b = Refuses(), ModelB()
    runtime = make_runtime(embedder=[a, b], workers=1, max_attempts=1)
    first = done(runtime, upload(runtime, tmp_path, "closures.txt", long_text("closures", 30)).id)
    a.refuse = True
    failed_id = runtime.service.documents.reindex(TENANT, str(first.document_id))
    assert done(runtime, failed_id, ("failed",)).status == "failed"
    finished = done(runtime, _reembed(runtime, first.dataset_id))
    assert finished.processed_chunks == 1
    with pytest.raises(Conflict) as refused:
        runtime.service.jobs.retry(TENANT, failed_id)
    assert refused.value.code == "superseded"
    rows = chunk_rows(runtime, str(first.document_id))
    assert len(rows) == first.total_chunks
    assert {generation for generation, _ in rows} == {3}  # 1, the failed 2, then the re-embed
