"""The chaos suite's short form, as CI runs it: every scenario against real processes and
services of its own, and nothing lost, doubled or stuck."""

from __future__ import annotations

import shutil

import pytest
from rich.console import Console

from knowledgeops.lab.chaos import render as render_table
from knowledgeops.lab.chaos import run_chaos
from tests.conftest import unavailable

pytestmark = [pytest.mark.postgres, pytest.mark.scaleout]


def test_the_short_chaos_suite_loses_and_doubles_nothing() -> None:
    if shutil.which("redis-server") is None:
        unavailable("redis-server is not installed")
    results = run_chaos(short=True)
    Console(width=220).print(render_table(results))
    assert [r.scenario for r in results if not r.ok] == []
    assert all(r.accepted > 0 and r.completed == r.accepted for r in results)
    setbacks = {r.scenario: r.setbacks for r in results}
    # each fault really hit the work: the jobs it touched were retried for its reason
    assert setbacks["kill -9 a worker process mid-embedding"].get("worker_lost", 0) >= 1
    assert setbacks["worker dies after the index write, before completed"].get("worker_lost") >= 1
    assert setbacks["worker paused past its lease (SIGSTOP), then resumed"].get("worker_lost") >= 1
    provider = setbacks["provider 429s and 500s, then 401 until the key is fixed"]
    assert provider.get("rate_limited", 0) >= 1
    assert provider.get("embedder_error", 0) >= 1
    assert provider.get("embedder_auth", 0) == 2
