"""The pipeline streams a document's chunks through the model a window at a time: the chunks,
their vectors and the job's counts are the same as when the whole document is one window."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import text

from knowledgeops.roles.embedded import EmbeddedRole
from tests.integration.test_exactly_once import done, long_text, upload


def stored(runtime: EmbeddedRole, document_id: str) -> list[tuple[Any, ...]]:
    """(ordinal, text, content hash, tokens, pages, section, vector) of each chunk, in order."""
    vec = runtime.index.vec  # type: ignore[union-attr]
    with runtime.db.read() as conn:
        rows = conn.execute(
            text(
                "SELECT c.ordinal, c.text, c.content_hash, c.token_count, c.page_start, "
                f"c.page_end, c.section, v.embedding FROM chunks c JOIN {vec} v ON v.rowid = c.seq "
                "WHERE c.document_id = :d ORDER BY c.ordinal"
            ),
            {"d": document_id},
        ).all()
    return [(*row[:7], np.frombuffer(row[7], dtype=np.float32)) for row in rows]


def test_a_document_longer_than_a_window_gets_the_same_chunks_and_vectors(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    body = "\n\n".join(long_text(topic, 60) for topic in ("ownership", "borrowing", "traits"))
    whole = make_runtime()
    streamed = make_runtime()
    streamed.pipeline.window = 8  # the batch size: every batch is a window of its own

    results = []
    for runtime in (whole, streamed):
        job = done(runtime, upload(runtime, tmp_path, "book.txt", body).id)
        results.append((job, stored(runtime, job.document_id)))
    (job_whole, rows_whole), (job_streamed, rows_streamed) = results

    assert len(rows_whole) > 3 * 8  # several windows
    assert job_streamed.total_chunks == job_streamed.processed_chunks == len(rows_streamed)
    assert job_whole.total_chunks == len(rows_whole)
    assert [r[:7] for r in rows_streamed] == [r[:7] for r in rows_whole]
    assert [r[0] for r in rows_streamed] == list(range(len(rows_streamed)))
    for a, b in zip(rows_streamed, rows_whole, strict=True):
        np.testing.assert_array_equal(a[7], b[7])


def test_a_streamed_document_reports_its_total_once_the_chunker_has_finished(
    make_runtime: Callable[..., EmbeddedRole], tmp_path: Path
) -> None:
    """While a long document streams, its total is unknown (null), never a guess; progress
    counts written chunks only; at the end the total is exact."""
    runtime = make_runtime()
    runtime.pipeline.window = 8
    seen: list[tuple[str, int | None, int | None]] = []
    report = runtime.store.report

    def spy(lease: Any, **kw: Any) -> None:
        report(lease, **kw)
        job = runtime.service.jobs.get("default", lease.job_id)
        seen.append((job.stage, job.total_chunks, job.processed_chunks))

    runtime.store.report = spy  # type: ignore[method-assign]
    body = "\n\n".join(long_text(topic, 60) for topic in ("lifetimes", "closures"))
    job = done(runtime, upload(runtime, tmp_path, "long.txt", body).id)
    final = job.total_chunks
    assert final is not None
    assert final > 16
    embedding = [(total, processed) for stage, total, processed in seen if stage == "embedding"]
    assert embedding[0] == (None, 0)  # the first window: total not known yet
    known = [i for i, (total, _) in enumerate(embedding) if total is not None]
    assert known
    assert all(embedding[i][0] == final for i in known)
    assert all(total is None for total, _ in embedding[: known[0]])
    processed = [p for _, p in embedding if p is not None]
    assert processed == sorted(processed)
    assert processed[-1] == final
