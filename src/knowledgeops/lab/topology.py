"""The scale-out topology as real processes on this machine: `kops api`, `kops relay` and any
number of `kops worker`, each a subprocess with its own log, plus a throwaway `redis-server`.

Used by `kops bench scaleout` and by the tests that run the topology for real. Every process is
started in its own process group, so `stop()` takes its children (Celery's pool, uvicorn's
workers) down with it, also when a test fails half-way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

from knowledgeops.errors import LabError
from knowledgeops.lab.devpg import free_port

KOPS = [sys.executable, "-m", "knowledgeops.cli"]
READY_TIMEOUT_S = 180.0  # s: model loading on a busy 2-core machine is slow
MODEL_LOADED = "loaded sentence-transformers/all-MiniLM-L6-v2"
WORKER_READY = " ready."  # Celery: "kops-123@host ready."


class TopologyError(LabError):
    """A process did not start or get ready; the message carries the end of its log."""


@dataclass
class Proc:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal(self, signum: int) -> None:
        """Signal the process group (the process and what it started)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signum)

    def kill(self) -> None:
        """SIGKILL to the whole group, as a crash would."""
        self.signal(signal.SIGKILL)
        self.process.wait(timeout=15)

    def stop(self, timeout: float = 30.0) -> None:
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        self.signal(signal.SIGKILL)  # children left behind in the group


def spawn(name: str, args: list[str], env: dict[str, str], log_path: Path) -> Proc:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Proc(name, process, log_path)


@dataclass
class LocalRedis:
    """A `redis-server` of our own on a free port, nothing kept on disk: it may be stopped and
    started freely without touching the machine's shared Redis."""

    root: Path
    port: int = field(default_factory=free_port)
    proc: Proc | None = None
    password: str | None = None  # requirepass: clients must AUTH

    def url(self, db: int = 0) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise TopologyError("redis-server is not installed (apt install redis-server)")
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", str(self.root)]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = spawn("redis", args, dict(os.environ), self.root / "redis.log")
        deadline = time.monotonic() + 15

        while True:
            try:
                client = redis.Redis(
                    port=self.port, password=self.password, socket_connect_timeout=0.5
                )
                client.ping()
                client.close()
                return
            except redis.RedisError:
                if time.monotonic() > deadline or not self.proc.alive():
                    raise TopologyError(f"redis-server did not start:\n{self.proc.log()}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(timeout=10)
            self.proc = None


def kops_env(base: dict[str, str] | None = None, **settings: Any) -> dict[str, str]:
    """A `kops` process environment: no KOPS_* from the caller, the model offline, `settings`
    as KOPS_<NAME> variables."""
    env = {k: v for k, v in (base or dict(os.environ)).items() if not k.startswith("KOPS_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    for name, value in settings.items():
        env[f"KOPS_{name.upper()}"] = str(value)
    return env


@dataclass
class Topology:
    root: Path
    database_url: str
    broker_url: str
    cache_url: str
    settings: dict[str, Any] = field(default_factory=dict)
    api_port: int = field(default_factory=free_port)
    procs: list[Proc] = field(default_factory=list)
    api_key: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def env(self, **extra: Any) -> dict[str, str]:
        return kops_env(
            database_url=self.database_url,
            broker_url=self.broker_url,
            cache_url=self.cache_url,
            data_dir=self.root / "data",
            **{**self.settings, **extra},
        )

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*KOPS, *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def migrate(self) -> None:
        """`kops migrate`, then `kops keys create`: the key `client()` sends."""
        done = self.run("migrate")
        if done.returncode != 0:
            raise TopologyError(f"kops migrate failed:\n{done.stdout}\n{done.stderr}")
        if self.api_key is None:
            made = self.run("keys", "create", "--name", "topology harness")
            if made.returncode != 0:
                raise TopologyError(f"kops keys create failed:\n{made.stdout}\n{made.stderr}")
            self.api_key = made.stdout.strip()

    def client(self, timeout: float = 30.0) -> httpx.Client:
        """An HTTP client for the API, with the harness's API key."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.Client(base_url=self.url, timeout=timeout, headers=headers)

    # --- processes ------------------------------------------------------------------------------
    def _spawn(self, role: str, *args: str, raw_env: dict[str, str] | None = None) -> Proc:
        count = sum(p.name.startswith(role) for p in self.procs)
        name = f"{role}{count + 1}"
        env = {**self.env(), **(raw_env or {})}
        proc = spawn(name, [*KOPS, role, *args], env, self.root / "logs" / f"{name}.log")
        self.procs.append(proc)
        return proc

    def start_api(self) -> Proc:
        return self._spawn("api", "--port", str(self.api_port))

    def start_relay(self) -> Proc:
        return self._spawn("relay")

    def start_worker(
        self,
        concurrency: int = 1,
        raw_env: dict[str, str] | None = None,
        *,
        lanes: str = "all",
    ) -> Proc:
        """`raw_env`: extra environment variables for this worker only (fault injection);
        `lanes`: what it runs (`kops worker --lanes`: all, jobs or webhooks)."""
        args = ("--concurrency", str(concurrency), "--lanes", lanes)
        return self._spawn("worker", *args, raw_env=raw_env)

    def start(
        self,
        *,
        workers: int = 2,
        concurrency: int = 1,
        relays: int = 1,
        local_model: bool = True,
        worker_env: dict[str, str] | None = None,
    ) -> None:
        """Start and wait until ready: with `local_model`, until every worker process has
        loaded the model; otherwise until every Celery worker says it is ready."""
        self.start_api()
        for _ in range(relays):
            self.start_relay()
        for _ in range(workers):
            self.start_worker(concurrency, raw_env=worker_env)
        self.wait_ready(
            models=workers * concurrency if local_model else 0,
            workers=0 if local_model else workers,
        )

    def by_role(self, role: str) -> list[Proc]:
        return [p for p in self.procs if p.name.startswith(role) and p.alive()]

    def wait_ready(
        self, *, models: int, workers: int = 0, timeout: float = READY_TIMEOUT_S
    ) -> None:
        """The API answers /readyz, `models` worker processes have loaded the model and
        `workers` Celery workers said they are ready."""
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.url, timeout=5) as client:
            while True:
                dead = [p for p in self.procs if not p.alive()]
                if dead:
                    raise TopologyError(self._report(f"{dead[0].name} exited", dead[0]))
                logs = [p.log() for p in self.by_role("worker")]
                loaded = sum(log.count(MODEL_LOADED) for log in logs)
                ready = sum(WORKER_READY in log for log in logs)
                try:
                    api_ready = client.get("/readyz").status_code == 200
                except httpx.HTTPError:
                    api_ready = False
                if api_ready and loaded >= models and ready >= workers:
                    return
                if time.monotonic() > deadline:
                    raise TopologyError(
                        self._report(f"not ready within {timeout:g} s ({loaded}/{models} models)")
                    )
                time.sleep(0.2)

    def _report(self, what: str, proc: Proc | None = None) -> str:
        shown = [proc] if proc is not None else self.procs
        tails = "\n".join(f"--- {p.name} ---\n{p.log()[-3000:]}" for p in shown)
        return f"{what}\n{tails}"

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.log()}" for p in self.procs)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.procs.clear()
