"""What one document may cost: each limit fails the job as `user_action_required` (or permanent
for a ZIP bomb) with a message that names the setting, and the worker goes on with the next job.
The files are real files of each format; the limits are set low to meet them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import accepted, ingest, upload, wait_done
from tests.fixtures.documents import make_docx, make_docx_bomb, make_html, make_pdf, make_text


def failed(client: TestClient, path: Path) -> dict[str, Any]:
    job = wait_done(client, accepted(upload(client, path))["jobId"], timeout=60)
    assert job["status"] == "failed", job
    return job


@pytest.mark.parametrize(
    ("settings", "make", "code", "setting"),
    [
        (
            {"max_pdf_pages": 3},
            lambda d: make_pdf(d / "long.pdf", [f"page {n}" for n in range(4)]),
            "too_many_pages",
            "KOPS_MAX_PDF_PAGES",
        ),
        (
            {"max_unzipped_mb": 0.001},
            lambda d: make_docx(d / "big.docx"),
            "too_large",
            "KOPS_MAX_UNZIPPED_MB",
        ),
        (
            {"max_html_mb": 0.001},
            lambda d: make_html(d / "page.html", "<p>" + "words and more words " * 200 + "</p>"),
            "html_too_large",
            "KOPS_MAX_HTML_MB",
        ),
        (
            {"max_text_chars": 500},
            lambda d: make_text(d / "long.txt", "A sentence of plain text.\n" * 100),
            "text_too_long",
            "KOPS_MAX_TEXT_CHARS",
        ),
        (
            {"max_chunks_per_document": 3},
            lambda d: make_text(
                d / "many.txt", "Another distinct sentence here, number x.\n" * 300
            ),
            "too_many_chunks",
            "KOPS_MAX_CHUNKS_PER_DOCUMENT",
        ),
    ],
    ids=["pdf-pages", "docx-unzipped", "html-size", "text-length", "chunks"],
)
def test_a_document_over_a_limit_fails_with_a_message_naming_it(
    make_client: Callable[..., TestClient],
    tmp_path: Path,
    settings: dict[str, Any],
    make: Callable[[Path], Path],
    code: str,
    setting: str,
) -> None:
    client = make_client(**settings)
    job = failed(client, make(tmp_path))
    assert job["errorCode"] == code
    assert job["errorCategory"] == "user_action_required"
    assert setting in job["error"]
    # the same worker goes on: a small document right after completes
    assert ingest(client, make_text(tmp_path / "small.txt", "small and fine"))["status"] == (
        "completed"
    )


def test_a_zip_bomb_is_refused_unopened(client: TestClient, tmp_path: Path) -> None:
    bomb = make_docx_bomb(tmp_path / "bomb.docx", make_docx(tmp_path / "src.docx"), inflated_mb=8)
    job = failed(client, bomb)
    assert job["errorCode"] == "zip_bomb"
    assert job["errorCategory"] == "permanent"
    assert "KOPS_MAX_ZIP_RATIO" in job["error"]


def test_a_parse_that_takes_too_long_is_stopped_and_the_worker_goes_on(
    make_client: Callable[..., TestClient], tmp_path: Path
) -> None:
    client = make_client(parse_timeout_s=0.05, workers=1, pdf_part_pages=0)  # one parse
    pages = [f"Page {n}: harbours and tides and lighthouses. " * 40 for n in range(400)]
    job = failed(client, make_pdf(tmp_path / "slow.pdf", pages))
    assert job["errorCode"] == "parse_timeout"
    assert job["errorCategory"] == "user_action_required"
    assert "KOPS_PARSE_TIMEOUT_S" in job["error"]
    assert ingest(client, make_text(tmp_path / "next.txt", "the next job"))["status"] == (
        "completed"
    )
