"""The chaos suite's crash point: off by default, dies like kill -9 when named, once if asked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = "from knowledgeops.jobs import faults; faults.hit('before_complete'); print('alive')"


def run(**env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KOPS_FAULT")}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_point_is_off_unless_named() -> None:
    assert run().stdout.strip() == "alive"
    assert run(KOPS_FAULT="some_other_point").stdout.strip() == "alive"


def test_the_named_point_kills_the_process_once(tmp_path: Path) -> None:
    marker = tmp_path / "spent"
    first = run(KOPS_FAULT="before_complete", KOPS_FAULT_ONCE=str(marker))
    assert (first.returncode, first.stdout) == (137, "")
    assert marker.read_text().strip().isdigit()
    second = run(KOPS_FAULT="before_complete", KOPS_FAULT_ONCE=str(marker))
    assert (second.returncode, second.stdout.strip()) == (0, "alive")
