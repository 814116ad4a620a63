"""Services a lab runs beside its studies, started privately for a test or a benchmark: a PostgreSQL
cluster (Debian's `postgresql`) and an `mlflow server` on it (or on SQLite). Each binds 127.0.0.1 on a
free port, keeps its files in its own folder, and is stopped by the pid it was started with."""

from __future__ import annotations

import contextlib
import glob
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def postgres_bin() -> Path | None:
    """The newest Debian PostgreSQL server binaries (/usr/lib/postgresql/<version>/bin), else pg_config's."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    pg_config = shutil.which("pg_config")
    if pg_config:
        folder = Path(subprocess.run([pg_config, "--bindir"], capture_output=True, text=True).stdout.strip())
        if (folder / "initdb").exists():
            return folder
    return None


class PostgresCluster:
    """`initdb` into a fresh folder, `postgres` listening on 127.0.0.1 only (no Unix socket), a password
    for its one role. PostgreSQL refuses to run as root: as root, the server runs as `nobody`, which owns
    the folder. `restart(outage_s)` is a fast shutdown (clients are disconnected) and a start again."""

    def __init__(self, role: str = "mlflow", database: str = "mlflow"):
        self.bin = postgres_bin()
        if self.bin is None:
            raise RuntimeError("PostgreSQL is not installed (Debian: apt-get install postgresql)")
        self.role, self.database, self.password = role, database, secrets.token_hex(16)
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="pg-", dir="/tmp"))
        self.data = self.folder / "data"
        self.owner = {"user": "nobody", "group": "nogroup", "extra_groups": []} if os.geteuid() == 0 else {}
        self.process: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        """SQLAlchemy's URI for psycopg 3 (what `mlflow server --backend-store-uri` takes)."""
        return f"postgresql+psycopg://{self.role}:{self.password}@127.0.0.1:{self.port}/{self.database}"

    def _as_owner(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=self.folder,
                              env={"PATH": os.environ.get("PATH", ""), "LC_ALL": "C"}, **self.owner, **kwargs)

    def start(self) -> PostgresCluster:
        if self.owner:
            shutil.chown(self.folder, "nobody", "nogroup")
        password_file = self.folder / "password"
        password_file.write_text(self.password + "\n")
        if self.owner:
            shutil.chown(password_file, "nobody", "nogroup")
        password_file.chmod(0o600)
        made = self._as_owner(str(self.bin / "initdb"), "-D", str(self.data), "-U", self.role, "--auth=scram-sha-256",
                              f"--pwfile={password_file}", "-E", "UTF8", "--no-locale", "--no-sync")
        password_file.unlink()
        if made.returncode != 0:
            raise RuntimeError(f"initdb failed: {made.stdout[-2000:]}{made.stderr[-2000:]}")
        self.run()
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user=self.role, password=self.password,
                             dbname="postgres", autocommit=True) as connection:
            connection.execute(f"CREATE DATABASE {self.database}")
        return self

    def run(self) -> None:
        """Start the server and wait until it accepts connections."""
        log = open(self.folder / "postgres.log", "a")  # noqa: SIM115 (the server writes it)
        self.process = subprocess.Popen(
            [str(self.bin / "postgres"), "-D", str(self.data), "-h", "127.0.0.1", "-p", str(self.port), "-k", "",
             "-c", "fsync=off"], stdout=log, stderr=subprocess.STDOUT, cwd=self.folder,
            env={"PATH": os.environ.get("PATH", ""), "LC_ALL": "C"}, start_new_session=True, **self.owner)
        deadline = time.monotonic() + 60
        while self._as_owner(str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)).returncode != 0:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"postgres did not start: {(self.folder / 'postgres.log').read_text()[-2000:]}")
            time.sleep(0.2)

    def halt(self) -> None:
        """Fast shutdown (SIGINT): open connections are cut, the data is checkpointed."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            self.process = None

    def restart(self, outage_s: float) -> None:
        self.halt()
        time.sleep(outage_s)
        self.run()

    def stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGQUIT)  # immediate shutdown, the server and its backends
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=30)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            self.process = None
        shutil.rmtree(self.folder, ignore_errors=True)


class MlflowServer:
    """`mlflow server` on 127.0.0.1 with a backend store (SQLite in `folder` unless given) and an
    artifact destination it proxies (`--artifacts-destination`)."""

    def __init__(self, folder: Path, backend: str | None = None):
        self.folder, self.port = folder, free_port()
        self.backend = backend or f"sqlite:///{folder / 'server.db'}"
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 120) -> MlflowServer:
        log = open(self.folder / "mlflow-server.log", "a")  # noqa: SIM115 (the server writes it)
        self.process = subprocess.Popen(
            [str(BIN / "mlflow"), "server", "--backend-store-uri", self.backend,
             "--artifacts-destination", str(self.folder / "artifacts"), "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            # MLflow's job runner and its seven huey consumers (GenAI jobs) serve nothing a study uses
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2):
                    return self
            except OSError:
                if self.process.poll() is not None:
                    break
                time.sleep(0.5)
        raise RuntimeError(f"mlflow server did not start: {(self.folder / 'mlflow-server.log').read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            self.process = None
