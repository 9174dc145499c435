"""The chaos lab's audit reads every job through the API, as a user would: thousands of them
reach the key's rate limit, and the audit waits out each 429 instead of counting an error
answer as a job (the full soak's audit of 10,000 jobs did that once)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from knowledgeops.errors import LabError
from knowledgeops.lab.chaos.lab import jobs
from tests.api.conftest import ingest
from tests.fixtures.documents import make_text


def test_the_audit_waits_out_the_rate_limit_and_reads_every_job(
    make_client: Callable[..., TestClient], tmp_path: Path
) -> None:
    client = make_client(rate_limit="20/second")
    job_id = ingest(client, make_text(tmp_path / "a.txt", "a page to audit"))["id"]
    answers = [client.get(f"/docs/jobs/{job_id}").status_code for _ in range(40)]
    assert 429 in answers  # the limit bites at this pace
    many = [jobs(client, [job_id])[job_id]["status"] for _ in range(50)]
    assert many == ["completed"] * 50


def test_an_answer_that_is_no_job_stops_the_audit_with_what_the_api_said(
    client: TestClient,
) -> None:
    with pytest.raises(LabError, match="answered 404"):
        jobs(client, ["00000000-0000-0000-0000-000000000000"])
