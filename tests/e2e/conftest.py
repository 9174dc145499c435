"""Running the real product: `kops serve` as a subprocess on a free port, with its own data folder
and the real all-MiniLM-L6-v2 model, spoken to over HTTP.

`kops_server(...)` starts a server and waits for `/readyz`; every server a test started is killed
at teardown, and the log of each one (stdout and stderr together) is attached to the report of a
failed test. `run_kops(...)` runs any other `kops` command to the end and returns its result.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

READY_TIMEOUT_S = 60.0
KOPS = [sys.executable, "-m", "knowledgeops.cli"]
_LOGS = pytest.StashKey[list[Path]]()


FIRST_KEY = re.compile(r"kops_[A-Za-z0-9_-]{43}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def kops_env(data_dir: Path | None = None, **settings: Any) -> dict[str, str]:
    """The environment of a `kops` process: no KOPS_* leaking from the caller, the model offline,
    `settings` as KOPS_<NAME> variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KOPS_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    env["COLUMNS"] = "200"  # rich wraps at 80 columns when it does not write to a terminal
    if data_dir is not None:
        env["KOPS_DATA_DIR"] = str(data_dir)
    for name, value in settings.items():
        env[f"KOPS_{name.upper()}"] = str(value)
    return env


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    port: int
    data_dir: Path
    log_path: Path
    launched_at: float  # time.perf_counter() just before the process was started
    ready_s: float | None = None  # seconds from launch to the first 200 from /readyz
    api_key: str | None = None  # printed by the first start on its data folder; sent by `http`
    http: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.http = httpx.Client(base_url=self.url, timeout=60.0)

    def use_key(self, key: str | None) -> None:
        self.api_key = key
        if key:
            self.http.headers["Authorization"] = f"Bearer {key}"

    def printed_key(self) -> str | None:
        """The API key the first start on a new data folder wrote (stderr is not a terminal
        here, so it goes to `<data>/first-api-key`, mode 0600, and the log says where)."""
        path = self.data_dir / "first-api-key"
        return path.read_text().strip() if path.exists() else None

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> float:
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive():
                pytest.fail(
                    f"kops serve exited with {self.process.returncode} before it was ready:\n"
                    + self.log()
                )
            try:
                if self.http.get("/readyz", timeout=2.0).status_code == 200:
                    self.ready_s = time.perf_counter() - self.launched_at
                    return self.ready_s
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"kops serve was not ready within {timeout:g} s:\n" + self.log())
            time.sleep(0.05)

    def wait_model(self, timeout: float = READY_TIMEOUT_S) -> float:
        """Seconds from launch until /readyz says the model is loaded."""
        deadline = time.monotonic() + timeout
        while True:
            body = self.http.get("/readyz").json()
            if body.get("model") == "loaded":
                return time.perf_counter() - self.launched_at
            if time.monotonic() > deadline:
                pytest.fail(f"the model did not load within {timeout:g} s:\n" + self.log())
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL, as a crash or the OOM killer would, and reap the process."""
        self.http.close()
        if self.alive():
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, as `kill` or a service manager would; returns the exit status."""
        self.http.close()
        if self.alive():
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        return int(self.process.returncode)

    # --- small helpers over the API -------------------------------------------------------------
    def default_dataset(self) -> str:
        items = self.http.get("/datasets").json()["items"]
        return str(next(d["id"] for d in items if d["isDefault"]))

    def upload(self, path: Path) -> tuple[dict[str, Any], float]:
        """Upload a file; returns the 202 body and the seconds the server took to accept it."""
        started = time.perf_counter()
        with path.open("rb") as handle:
            response = self.http.post("/docs/upload", files={"file": (path.name, handle)})
        elapsed = time.perf_counter() - started
        assert response.status_code == 202, response.text
        return response.json(), elapsed

    def job(self, job_id: str) -> dict[str, Any]:
        response = self.http.get(f"/docs/jobs/{job_id}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def search(
        self, dataset_id: str, query: str, *, mode: str = "hybrid", top_k: int = 5
    ) -> list[dict[str, Any]]:
        response = self.http.post(
            f"/datasets/{dataset_id}/search", json={"query": query, "mode": mode, "topK": top_k}
        )
        assert response.status_code == 200, response.text
        results: list[dict[str, Any]] = response.json()["results"]
        return results


@pytest.fixture
def kops_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """`kops_server(data_dir=None, wait=True, **settings)` starts `kops serve` (a new data folder
    under tmp_path unless `data_dir` is given) and, with `wait`, returns once /readyz says 200."""
    servers: list[Server] = []
    keys: dict[Path, str | None] = {}  # the first key of each data folder, for its restarts
    logs = request.node.stash.setdefault(_LOGS, [])

    def start(*, data_dir: Path | None = None, wait: bool = True, **settings: Any) -> Server:
        n = len(servers)
        data_dir = data_dir or tmp_path / f"data{n}"
        port = free_port()
        log_path = tmp_path / f"serve{n}-port{port}.log"
        logs.append(log_path)
        launched = time.perf_counter()
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [*KOPS, "serve", "--port", str(port), "--host", "127.0.0.1"],
                env=kops_env(data_dir, **settings),
                cwd=tmp_path,  # no stray .env is read
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: killed as a whole
            )
        server = Server(process, f"http://127.0.0.1:{port}", port, data_dir, log_path, launched)
        servers.append(server)
        if wait:
            server.wait_ready()
            keys.setdefault(data_dir, server.printed_key())
            server.use_key(keys[data_dir])
        return server

    yield start
    for server in servers:
        server.kill()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.failed:
        for path in item.stash.get(_LOGS, []):
            if path.exists():
                report.sections.append(
                    (f"kops serve log {path.name}", path.read_text(errors="replace"))
                )


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def __str__(self) -> str:
        return (
            f"exit {self.returncode} after {self.seconds:.1f} s\n--- stdout\n{self.stdout}"
            f"--- stderr\n{self.stderr}"
        )


def run_kops(
    *args: str,
    data_dir: Path | None = None,
    timeout: float = 120.0,
    cwd: Path | None = None,
    columns: int | None = None,
    api_key: str | None = None,
) -> Result:
    """Run `kops ARGS…` to the end (killed after `timeout`); `columns`: the terminal width rich
    assumes (default 200); `api_key`: in KOPS_API_KEY."""
    env = kops_env(data_dir)
    if api_key is not None:
        env["KOPS_API_KEY"] = api_key
    if columns is not None:
        env["COLUMNS"] = str(columns)
    started = time.perf_counter()
    done = subprocess.run(
        [*KOPS, *args],
        env=env,
        cwd=cwd or tempfile.gettempdir(),  # not the repository: no stray .env is read
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    return Result(
        done.returncode,
        done.stdout.decode(errors="replace"),
        done.stderr.decode(errors="replace"),
        time.perf_counter() - started,
    )
