"""/metrics in Prometheus' text format: jobs by status, outbox backlog, waiting and heartbeat
ages, outcomes by error category, stage durations; read from the database."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import accepted, ingest, upload, wait_done
from tests.fixtures.documents import make_corrupt_pdf, make_text


def scrape(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_metrics_follow_the_jobs(client: TestClient, tmp_path: Path) -> None:
    before = scrape(client)
    assert before[("kops_jobs", (("status", "completed"),))] == 0
    assert before[("kops_outbox_backlog", ())] == 0

    ingest(client, make_text(tmp_path / "a.txt", "The kettle whistles when the water boils.\n"))
    broken = accepted(upload(client, make_corrupt_pdf(tmp_path / "b.pdf")))
    assert wait_done(client, broken["jobId"])["status"] == "failed"

    after = scrape(client)
    assert after[("kops_jobs", (("status", "completed"),))] == 1
    assert after[("kops_jobs", (("status", "failed"),))] == 1
    assert after[("kops_job_outcomes_total", (("category", ""), ("outcome", "completed")))] == 1
    failed = (("category", "permanent"), ("outcome", "failed"))
    assert after[("kops_job_outcomes_total", failed)] == 1
    for stage in ("queued", "parsing", "embedding", "indexing"):
        assert after[("kops_stage_duration_seconds_count", (("stage", stage),))] >= 1
        assert after[("kops_stage_duration_seconds_sum", (("stage", stage),))] >= 0
    assert after[("kops_running_job_heartbeat_age_seconds_count", ())] == 0
    assert after[("kops_oldest_waiting_job_age_seconds", ())] == 0
    assert ("process_resident_memory_bytes", ()) in after
