"""The `kops` commands a user types, run as real processes against a real `kops serve`."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.e2e.conftest import FIRST_KEY, KOPS, Server, free_port, kops_env, run_kops
from tests.e2e.corpus import long_text
from tests.fixtures.documents import (
    make_corrupt_pdf,
    make_html,
    make_markdown,
    make_scanned_pdf,
    make_text,
)

pytestmark = pytest.mark.e2e

LIGHTHOUSES = (
    "Lighthouse keepers lived in stone towers on rocky headlands and remote islands. Every "
    "evening they climbed the spiral stairs, trimmed the wicks and polished the great lenses so "
    "that the beam could warn ships away from the reefs until dawn.\n"
)
TIDES = """\
# Why the sea rises and falls twice a day

The Moon's gravity pulls the oceans into two bulges, one facing the Moon and one on the far
side of the Earth. As the planet turns, a coast passes through both bulges every day.

## Spring and neap tides

When Sun and Moon line up the range is largest. Write the height as h[0] + a[/1] × cos(t) and
mark the [important] terms: rich markup must be printed as it is.
"""
ORCHIDS = """\
<h1>Growing orchids indoors</h1>
<p>Moth orchids like bright light without direct sun, bark instead of soil, and water only
when the roots turn silvery. They bloom again when nights are a few degrees cooler.</p>
"""


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_kops_ingest_cli(kops_server: Callable[..., Server], tmp_path: Path) -> None:
    server = kops_server()
    batch = tmp_path / "batch"
    batch.mkdir()
    make_text(batch / "lighthouses.txt", LIGHTHOUSES)
    make_markdown(batch / "tides.md", TIDES)
    make_html(batch / "orchids.html", ORCHIDS, title="Orchids")
    make_scanned_pdf(batch / "scan [v2].pdf")  # accepted, then fails: no text layer
    make_corrupt_pdf(batch / "broken.pdf")  # accepted (it starts like a PDF), then fails
    check_ingest_with_failures(server, batch)

    # only good files: two new ones and one already ingested (the same bytes: no new job)
    good = tmp_path / "good"
    good.mkdir()
    shutil.copy(batch / "lighthouses.txt", good / "lighthouses-copy.txt")
    make_text(good / "bees.txt", "Worker bees dance to show where the flowers are.\n")
    make_text(good / "café.txt", "Le café crème se boit le matin à Paris.\n", encoding="latin-1")
    result = run_kops("ingest", str(good), "--url", server.url, api_key=server.api_key)
    assert result.returncode == 0, result
    assert "3 documents ingested" in result.stdout, result
    assert "Traceback" not in result.output, result

    check_search(server)
    check_jobs(server, total=7, failed=2)

    # nothing listens: a clear message, no traceback
    nowhere = f"http://127.0.0.1:{free_port()}"
    for args in (("ingest", str(good)), ("search", "lamps"), ("jobs",)):
        result = run_kops(*args, "--url", nowhere)
        assert result.returncode != 0, result
        assert "Traceback" not in result.output, result
        assert f"cannot reach KnowledgeOps at {nowhere}" in _one_line(result.stderr), result


def check_ingest_with_failures(server: Server, batch: Path) -> None:
    """`kops ingest` of 3 good files and 2 that fail: exit 1, each failure named with why."""
    result = run_kops("ingest", str(batch), "--url", server.url, api_key=server.api_key)
    out = _one_line(result.output)
    assert result.returncode == 1, result
    assert "Traceback" not in result.output, result
    assert "2 of 5 documents failed" in out, result
    failed = {line.strip() for line in result.stderr.splitlines() if line.startswith("  ")}
    scan = next(line for line in failed if line.startswith("scan [v2].pdf: failed:"))
    assert "text layer" in scan, scan
    assert "OCR" in scan, scan
    assert "[permanent]" in scan, scan  # the category, not eaten as rich markup
    broken = next(line for line in failed if line.startswith("broken.pdf: failed:"))
    assert "PDF" in broken, broken
    assert "damaged" in broken or "could not be read" in broken, broken
    jobs = {j["fileName"]: j for j in server.http.get("/docs/jobs").json()["items"]}
    assert {name: j["status"] for name, j in jobs.items()} == {
        "lighthouses.txt": "completed",
        "tides.md": "completed",
        "orchids.html": "completed",
        "scan [v2].pdf": "failed",
        "broken.pdf": "failed",
    }
    for name in ("scan [v2].pdf", "broken.pdf"):
        assert jobs[name]["id"] in out, f"the failure line names the job of {name}"
    print(f"\n[e2e figures] kops ingest of 5 files (2 bad) took {result.seconds:.1f} s")


def check_search(server: Server) -> None:
    """`kops search`: the expected file first, document text printed as it is (not markup)."""
    result = run_kops(
        "search",
        "who looked after the lamps that warned sailors at night",
        "--url",
        server.url,
        api_key=server.api_key,
    )
    assert result.returncode == 0, result
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert lines[0].startswith("1. lighthouses.txt"), result
    result = run_kops(
        "search", "formula for the height of the tide", "--url", server.url, api_key=server.api_key
    )
    assert result.returncode == 0, result
    assert result.stdout.startswith("1. tides.md"), result
    assert "a[/1]" in result.stdout, result
    assert "[important]" in result.stdout, result


def check_jobs(server: Server, *, total: int, failed: int) -> None:
    """`kops jobs`: every job with its whole id (what `retry` takes), wide terminal or narrow."""
    listed = server.http.get("/docs/jobs").json()
    assert listed["total"] == total
    for columns in (200, 80):
        result = run_kops("jobs", "--url", server.url, columns=columns, api_key=server.api_key)
        assert result.returncode == 0, result
        for job in listed["items"]:
            assert job["id"] in result.stdout, (columns, job["id"], result)
        assert f"{total} of {total} jobs" in result.stdout, result
        assert "no text layer" in result.stdout, result
    result = run_kops("jobs", "--status", "failed", "--url", server.url, api_key=server.api_key)
    assert result.returncode == 0, result
    assert f"{failed} of {failed} jobs" in result.stdout, result


def test_kops_ingest_when_the_server_dies(
    kops_server: Callable[..., Server], tmp_path: Path
) -> None:
    """The server dies while `kops ingest` follows its jobs: a clear message, no traceback."""
    server = kops_server()
    folder = tmp_path / "docs"
    folder.mkdir()
    make_text(folder / "long.txt", long_text("dies", 30, seed=3))
    follower = subprocess.Popen(
        [*KOPS, "ingest", str(folder), "--url", server.url],
        env={**kops_env(), "KOPS_API_KEY": server.api_key or ""},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(
            lambda: server.http.get("/docs/jobs", params={"status": "running"}).json()["total"],
            30,
            "the job running",
        )
        time.sleep(0.5)  # `kops ingest` has its 202 and follows the job
        server.kill()
        stdout, stderr = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    output = (stdout + stderr).decode(errors="replace")
    assert follower.returncode == 1, output
    assert "Traceback" not in output, output
    # ConnectError at the next poll; a reset or a disconnect if the kill lands during a request
    said = _one_line(output)
    assert "cannot reach KnowledgeOps" in said or "lost the connection to KnowledgeOps" in said, (
        output
    )
    assert "kops jobs" in output, output


def test_migrate_command(kops_server: Callable[..., Server], tmp_path: Path) -> None:
    data_dir = tmp_path / "fresh"
    result = run_kops("migrate", data_dir=data_dir)
    assert result.returncode == 0, result
    assert "migrated database from empty to" in result.stdout, result
    assert (data_dir / "kops.db").is_file()

    result = run_kops("migrate", "--data-dir", str(data_dir))
    assert result.returncode == 0, result
    assert "database is up to date" in result.stdout, result

    server = kops_server(data_dir=data_dir)
    result = run_kops("migrate", data_dir=data_dir)
    stderr = _one_line(result.stderr)
    assert result.returncode != 0, result
    assert "Traceback" not in result.output, result
    assert f"pid {server.pid}" in stderr, result
    assert "already using the data folder" in stderr, result
    assert "Stop the other process" in stderr, result
    assert server.http.get("/readyz").status_code == 200
    assert (data_dir / "kops.lock").read_text().strip() == str(server.pid)


def test_kops_cancel_and_kops_retry(kops_server: Callable[..., Server], tmp_path: Path) -> None:
    """A job waiting behind a long one is cancelled from the CLI, then retried from the CLI and
    completes; a second cancel of a finished job is refused with the server's reason."""
    server = kops_server(workers=1)
    long_doc = make_text(tmp_path / "long.txt", long_text("harbour", paragraphs=60, seed=3))
    waiting_doc = make_text(tmp_path / "tides.txt", TIDES)
    long_job, _ = server.upload(long_doc)
    waiting_job, _ = server.upload(waiting_doc)
    wait_for(lambda: server.job(long_job["jobId"])["status"] == "running", what="the long job")
    assert server.job(waiting_job["jobId"])["status"] == "pending"

    cancelled = run_kops(
        "cancel", waiting_job["jobId"], "--url", server.url, api_key=server.api_key
    )
    assert cancelled.returncode == 0, cancelled.output
    assert f"job {waiting_job['jobId']}: cancelled" in cancelled.output
    assert server.job(waiting_job["jobId"])["status"] == "cancelled"

    retried = run_kops("retry", waiting_job["jobId"], "--url", server.url, api_key=server.api_key)
    assert retried.returncode == 0, retried.output
    assert f"job {waiting_job['jobId']}: pending" in retried.output
    done = wait_for(
        lambda: server.job(waiting_job["jobId"])["status"] == "completed",
        timeout=180,
        what="the retried job",
    )
    assert done

    again = run_kops("cancel", waiting_job["jobId"], "--url", server.url, api_key=server.api_key)
    assert again.returncode == 1
    assert "error:" in again.output


def test_kops_keys_against_a_running_server(
    kops_server: Callable[..., Server], tmp_path: Path
) -> None:
    """The first start prints one key; `kops keys create` prints a new key alone on stdout
    (usable as `KEY=$(kops keys create …)`), `list` shows prefixes only, `revoke` takes effect
    at the next request; the CLI's 401 names KOPS_API_KEY."""
    server = kops_server()
    first = server.api_key
    assert first is not None
    key_file = server.data_dir / "first-api-key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert first not in server.log()  # the log says where the key is, never the key
    assert str(key_file) in server.log()
    created = run_kops(
        "keys", "create", "--tenant", "team-b", "--name", "ci", data_dir=server.data_dir
    )
    assert created.returncode == 0, created
    team_b = created.stdout.strip()
    assert FIRST_KEY.fullmatch(team_b), created
    listed = run_kops("keys", "list", data_dir=server.data_dir)
    assert listed.returncode == 0, listed
    assert team_b[:12] in listed.stdout
    assert team_b not in listed.stdout
    assert first not in listed.stdout
    assert "team-b" in listed.stdout

    # team-b sees none of the default tenant's datasets, through the CLI too
    mine = run_kops("jobs", "--url", server.url, api_key=team_b)
    assert mine.returncode == 0, mine
    revoked = run_kops("keys", "revoke", team_b[:12], data_dir=server.data_dir)
    assert revoked.returncode == 0, revoked
    refused = run_kops("jobs", "--url", server.url, api_key=team_b)
    assert refused.returncode == 1
    assert "revoked" in refused.stderr
    assert "KOPS_API_KEY" in refused.stderr
    anonymous = run_kops("jobs", "--url", server.url)
    assert anonymous.returncode == 1
    assert "KOPS_API_KEY" in anonymous.stderr
    bad_tenant = run_kops("keys", "create", "--tenant", "Bad Tenant!", data_dir=server.data_dir)
    assert bad_tenant.returncode == 1
    assert "tenant" in bad_tenant.stderr
    assert "Traceback" not in bad_tenant.output
