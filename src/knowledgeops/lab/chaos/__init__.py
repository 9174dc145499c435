"""`kops chaos`: break the scale-out topology on purpose and prove nothing is lost or doubled.

Everything runs on services of its own: a throwaway PostgreSQL with pgvector (initdb + pg_ctl in a
temporary folder), a `redis-server` on a free port and the fake embeddings provider (real
vectors; faults on command), so it may stop and start them freely. Each scenario gets a fresh
database and a fresh topology (`kops api`, `kops relay`, two `kops worker`), uploads documents over
HTTP, injects its fault while work is in flight, waits for the system to recover and audits the
database:

- every accepted upload's job ended completed (or failed only where the scenario expects it);
- no chunk twice (document, generation, ordinal), chunk rows = `totalChunks`, one vector row per
  chunk, and no job completed twice (the `job_events` record);
- nothing stuck (a job not finished when the wait ran out).

`--soak N` runs N documents of every format through one topology while faults strike at
random (soak.py). The table it prints has one row per scenario; the command exits 1 on any loss,
duplicate or stuck job. `--short` is the form CI runs (fewer documents, shorter outages). Every
process and folder it started is removed at the end, also when it fails.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.table import Table

from knowledgeops.lab.chaos.lab import Lab, ScenarioResult
from knowledgeops.lab.chaos.scenarios import SCENARIOS
from knowledgeops.lab.chaos.soak import SoakResult, run_soak
from knowledgeops.lab.chaos.soak import render as render_soak

__all__ = [
    "SCENARIOS",
    "render",
    "render_soak",
    "run_chaos",
    "run_soak_suite",
    "write_json",
    "write_soak_json",
]


def run_chaos(*, short: bool, only: list[str] | None = None) -> list[ScenarioResult]:
    names = only or list(SCENARIOS)
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenarios {unknown}; choose from {sorted(SCENARIOS)}")
    root = Path(tempfile.mkdtemp(prefix="kops-chaos-"))
    root.chmod(0o755)  # PostgreSQL runs as `postgres` when we are root
    lab = Lab(root, short)
    results = []
    try:
        lab.start()
        for name in names:
            try:
                results.append(SCENARIOS[name](lab))
            except Exception as exc:  # a scenario that broke is a failure, not a crash
                results.append(ScenarioResult(name, problems=[f"{type(exc).__name__}: {exc}"]))
    finally:
        lab.stop()
        shutil.rmtree(root, ignore_errors=True)
    return results


def run_soak_suite(count: int, *, short: bool, seed: int = 7) -> SoakResult:
    """`kops chaos --soak N`: the lab's services, one topology, N documents, random faults."""
    root = Path(tempfile.mkdtemp(prefix="kops-soak-"))
    root.chmod(0o755)  # PostgreSQL runs as `postgres` when we are root
    lab = Lab(root, short)
    try:
        lab.start()
        return run_soak(lab, count, short=short, seed=seed)
    finally:
        lab.stop()
        shutil.rmtree(root, ignore_errors=True)


def write_soak_json(result: SoakResult, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    body = asdict(result)
    body["ok"] = result.ok
    body["memory"] = [{**asdict(m), "growth": round(m.growth, 4)} for m in result.memory]
    out.write_text(json.dumps(body, indent=2))


def render(results: list[ScenarioResult]) -> Any:

    table = Table(title="kops chaos")
    for column in (
        "scenario",
        "accepted",
        "completed",
        "failed (reasons)",
        "retries on the way (reasons)",
        "duplicates",
        "stuck",
        "recover s",
        "verdict",
    ):
        table.add_column(column)
    for r in results:
        failed = ", ".join(f"{k} ×{v}" for k, v in sorted(r.failed.items())) or "0"
        setbacks = ", ".join(f"{k} ×{v}" for k, v in sorted(r.setbacks.items())) or "0"
        verdict = "ok" if r.ok else "FAIL: " + "; ".join(r.problems or ["duplicates/stuck"])
        table.add_row(
            r.scenario,
            str(r.accepted),
            str(r.completed),
            failed,
            setbacks,
            str(r.duplicates),
            str(r.stuck),
            "" if r.recover_s is None else f"{r.recover_s:g}",
            verdict,
        )
    return table


def write_json(results: list[ScenarioResult], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([{**asdict(r), "ok": r.ok} for r in results], indent=2))
