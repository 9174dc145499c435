"""A local PostgreSQL 16 with pgvector, run from the binaries the `pgserver` package ships.

Debian here has no pgvector package (the machine's own PostgreSQL has none); `pgserver` (PyPI)
carries PostgreSQL 16 with pgvector. This runs `initdb` and `pg_ctl` on a folder and a TCP port
of your choosing, for the scale-out quick start (`kops postgres start`) and for the tests.
Production brings its own PostgreSQL ≥ 15 with pgvector; nothing in the service depends on this
module.

PostgreSQL refuses to run as root; as root the server runs as the `postgres` system user, which
must exist (it does wherever Debian's PostgreSQL is installed).
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from knowledgeops.errors import LabError

START_TIMEOUT_S = 60  # s


class LocalPostgresError(LabError):
    """The local server could not be made or started; the message says why."""


def binaries() -> Path:
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise LocalPostgresError(
            "the pgserver package is not installed: pip install 'knowledgeops[pgserver]'"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (path / "pg_ctl").exists():
        raise LocalPostgresError(f"pgserver is installed but has no binaries at {path}")
    return path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class LocalPostgres:
    """One server: its data folder, port and the database `kops` made for the service."""

    root: Path
    port: int = 5433
    host: str = "127.0.0.1"
    database: str = "kops"
    durable: bool = True  # False (tests): fsync off, faster, loses data on a machine crash

    @property
    def pgdata(self) -> Path:
        return self.root / "pgdata"

    @property
    def log_file(self) -> Path:
        return self.root / "postgres.log"

    def url(self, database: str | None = None) -> str:
        return f"postgresql+psycopg://postgres@{self.host}:{self.port}/{database or self.database}"

    # --- running the binaries -------------------------------------------------------------------
    def _user(self) -> str | None:
        if os.geteuid() != 0:
            return None
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            raise LocalPostgresError(
                "PostgreSQL will not run as root and there is no `postgres` user to run it as; "
                "create one (useradd postgres) or run as an ordinary user"
            ) from None
        return "postgres"

    def _run(self, tool: str, *args: str, timeout: float = START_TIMEOUT_S) -> str:
        command = [str(binaries() / tool), *args]
        try:
            done = subprocess.run(
                command,
                user=self._user(),
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
                cwd=self.root,
            )
        except subprocess.TimeoutExpired:
            raise LocalPostgresError(f"{tool} did not finish within {timeout:g} s") from None
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip()[-2000:]
            raise LocalPostgresError(f"{tool} failed: {detail}{self._log_tail()}")
        return done.stdout

    def _log_tail(self) -> str:
        try:
            tail = self.log_file.read_text(errors="replace").strip().splitlines()[-15:]
        except OSError:
            return ""
        return "\n--- postgres.log ---\n" + "\n".join(tail) if tail else ""

    def _own(self, path: Path) -> None:
        user = self._user()
        if user is None:
            return
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)

    # --- lifecycle ------------------------------------------------------------------------------
    def initialised(self) -> bool:
        return (self.pgdata / "PG_VERSION").exists()

    def _check_reachable(self) -> None:
        """As root the server runs as `postgres`, which must be able to walk down to the data."""
        if self._user() is None:
            return
        for folder in self.root.resolve().parents:
            if not folder.stat().st_mode & 0o001:
                raise LocalPostgresError(
                    f"the postgres user cannot enter {folder}, above {self.root}; "
                    f"choose another folder or run: chmod o+x {folder}"
                )

    def init(self) -> None:
        if self.initialised():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        self._check_reachable()
        self.pgdata.mkdir(mode=0o700, exist_ok=True)
        self._own(self.root)
        self._own(self.pgdata)
        self._run(
            "initdb", "-D", str(self.pgdata), "-U", "postgres", "--auth=trust", "--encoding=UTF8"
        )

    def running(self) -> bool:
        done = subprocess.run(
            [str(binaries() / "pg_ctl"), "status", "-D", str(self.pgdata)],
            user=self._user(),
            capture_output=True,
            check=False,
            cwd=self.root,
        )
        return done.returncode == 0

    def start(self) -> None:
        """initdb if needed, start the server, make the `kops` database with pgvector."""
        self.init()
        if not self.running():
            options = f"-h {self.host} -p {self.port} -k {self.root}"
            if not self.durable:
                options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            options += " -c max_connections=300"
            self._run(
                "pg_ctl",
                "start",
                "-D",
                str(self.pgdata),
                "-w",
                "-t",
                str(START_TIMEOUT_S),
                "-l",
                str(self.log_file),
                "-o",
                options,
            )
        self._ensure_database()

    def _ensure_database(self) -> None:

        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                with psycopg.connect(
                    host=self.host,
                    port=self.port,
                    user="postgres",
                    dbname="postgres",
                    autocommit=True,
                    connect_timeout=5,
                ) as conn:
                    exists = conn.execute(
                        "SELECT 1 FROM pg_database WHERE datname = %s", (self.database,)
                    ).fetchone()
                    if not exists:
                        conn.execute(f'CREATE DATABASE "{self.database}"')
                break
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise LocalPostgresError(f"the server does not answer: {exc}") from None
                time.sleep(0.2)
        with psycopg.connect(
            host=self.host,
            port=self.port,
            user="postgres",
            dbname=self.database,
            autocommit=True,
        ) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")

    def stop(self, mode: str = "fast") -> None:
        if self.initialised() and self.running():
            self._run("pg_ctl", "stop", "-D", str(self.pgdata), "-m", mode, "-w")

    def kill(self) -> None:
        """Stop without a checkpoint (a crash, for fault tests)."""
        self.stop(mode="immediate")

    def destroy(self) -> None:
        self.stop(mode="immediate")
        shutil.rmtree(self.root, ignore_errors=True)
