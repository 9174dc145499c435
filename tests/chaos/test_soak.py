"""The soak's short form, as CI runs it: documents of every format through the scale-out
topology while every kind of fault strikes at random, then the audit and the memory check."""

from __future__ import annotations

import shutil

import pytest
from rich.console import Console

from knowledgeops.lab.chaos import render_soak, run_soak_suite
from knowledgeops.lab.chaos.soak import BROKEN_CODE, FAULTS
from tests.conftest import unavailable

pytestmark = [pytest.mark.postgres, pytest.mark.scaleout]


@pytest.mark.timeout(900)
def test_the_short_soak_loses_doubles_and_leaks_nothing() -> None:
    if shutil.which("redis-server") is None:
        unavailable("redis-server is not installed")
    result = run_soak_suite(200, short=True)
    console = Console(width=200)
    for table in render_soak(result):
        console.print(table)
    audit = result.audit
    assert audit.problems == []
    assert (audit.duplicates, audit.stuck) == (0, 0)
    assert audit.accepted == 200
    assert result.broken_accepted == 2  # one in a hundred, each failed for its own reason
    assert audit.failed == {BROKEN_CODE: 2}
    assert audit.completed == 198
    struck = {fault.kind for fault in result.faults}
    assert struck == set(FAULTS)
    for fault in result.faults:  # each recovered, and was timed
        assert fault.recover_s is not None, fault
    # the faults reached the work: retries for their reasons are on record
    assert audit.setbacks.get("worker_lost", 0) >= 1
    assert audit.setbacks.get("rate_limited", 0) >= 1
    lived = [m for m in result.memory if m.lived_whole_run]
    assert {m.name for m in lived} >= {"api1"}
    assert all(m.growth <= 0.10 for m in lived), result.memory
