"""`orchestrator ui`: the study's MLflow UI (and optuna-dashboard) served on 127.0.0.1 behind the
same-origin proxy, on the asked port or the next free one, until Ctrl-C."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import typer

from orchestrator.cli.app import DEBUG, NAME, STORAGE, app, user_errors
from trainables.errors import UserInputError


@app.command()
@user_errors
def ui(name: str = NAME, storage: str | None = STORAGE, port: int = typer.Option(5000, min=1, max=65535,
                                                                        help="Port, or the next free one."),
       optuna: bool = typer.Option(False, "--optuna", help="optuna-dashboard of the cells' tuning instead."),
       debug: bool = DEBUG) -> None:
    """Start the MLflow UI (or optuna-dashboard) for the study on 127.0.0.1 and print its URL once it
    answers; exit 1 if it cannot start."""
    from orchestrator.study.folder import StudyFolder

    study = StudyFolder.named(name, storage)
    if optuna:
        log = study.optuna_log
        if not log.exists():
            raise UserInputError("NAME", name, f"no {log}: the study tunes nothing, or was launched before Optuna "
                                               "studies were kept; `orchestrator resume` writes it")
        dashboard = own_command("optuna-dashboard")
        if dashboard is None:
            raise UserInputError("--optuna", True, f"install it: {sys.executable} -m pip install optuna-dashboard")
        from orchestrator.run.ui_proxy import start_proxy

        chosen = free_port(port)
        upstream = system_port()  # behind the proxy: optuna-dashboard checks neither Host nor Origin itself
        proxy = start_proxy(chosen, upstream, rewrite_pages=False)
        try:
            serve([dashboard, "--host", "127.0.0.1", "--port", str(upstream), str(log)], chosen, "",
                  f"optuna-dashboard for {name} (one Optuna study per cell)", ready=f"http://127.0.0.1:{upstream}/")
        finally:
            proxy.shutdown()
        return

    uri = study.tracking_uri
    if not uri.startswith("sqlite"):
        typer.echo(f"the study is tracked on {uri}: open {uri.rstrip('/')}/{runs_path(uri, name)}")
        return
    from orchestrator.run.ui_proxy import sqlite_runs_path, start_proxy

    refuse_missing_store(uri, name)  # MLflow would make an empty one there: a viewer writes nothing
    chosen = free_port(port)
    upstream = system_port()  # MLflow itself, behind the proxy that opens runs in the model-training view
    proxy = start_proxy(chosen, upstream)
    # MLflow's job runner and its huey consumers run GenAI jobs (scorers, prompt optimisation): seven
    # processes and most of the UI's memory that a runs table does not use
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    try:
        serve([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1", "--port",
               str(upstream), "--workers", "1"], chosen, lambda: sqlite_runs_path(uri, name), f"MLflow UI for {name}",
              ready=f"http://127.0.0.1:{upstream}/health", env=env)
    finally:
        proxy.shutdown()


def refuse_missing_store(uri: str, name: str) -> None:
    """One line when a study's SQLite store is not where its launch left it (moved, deleted)."""
    from sqlalchemy.engine import make_url

    database = make_url(uri).database
    if database and database != ":memory:" and not Path(database).is_file():
        raise UserInputError("NAME", name, f"its MLflow store {database} is not there (moved or deleted?); put it "
                                           "back at that path to see its runs (`orchestrator status` reads the "
                                           "study's own journal meanwhile)")


def own_command(command: str) -> str | None:
    """A console script of the orchestrator's own environment (a venv used without activating it),
    else one on PATH."""
    beside = Path(sys.executable).parent / command
    return str(beside) if beside.exists() else shutil.which(command)


def free_port(asked: int) -> int:
    """`asked` when nothing listens on it on 127.0.0.1, else a free port the system picks (said)."""
    import socket

    with socket.socket() as probe:
        # as the servers bind: a port whose last connections wait out TIME_WAIT (the UI just stopped) is free
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", asked))
            return asked
        except OSError:
            pass
    chosen = system_port()
    typer.echo(f"port {asked} is busy: using {chosen}", err=True)
    return chosen


def system_port() -> int:
    """A port nothing listens on now, picked by the system."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serve(command: list[str], port: int, path: str | Callable[[], str], what: str, start_timeout_s: float = 120.0,
          ready: str | None = None, env: dict | None = None) -> None:
    """Run a web server until Ctrl-C or SIGTERM; its URL is printed once it (`ready`, when given: a URL
    that answers once it does) answers, and exit 1 (with its last words) if it ends before that.
    `path`: the URL's path, or what computes it while the server starts."""
    import signal
    import subprocess
    import tempfile
    import urllib.request

    def stop(signum, frame):
        raise KeyboardInterrupt

    # Explicit handlers: a process started from a non-interactive shell's background job inherits SIGINT
    # *ignored*, and Python then never raises KeyboardInterrupt; SIGTERM (kill, systemd) stops it too.
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    with tempfile.TemporaryFile(mode="w+") as errors:
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors, env=env)
        try:
            path = path() if callable(path) else path
            deadline = time.monotonic() + start_timeout_s
            while True:
                if server.poll() is not None:
                    errors.seek(0)
                    last = [line.strip() for line in errors.read().splitlines() if line.strip()][-1:] or ["no output"]
                    typer.echo(f"error: {what} could not start (exit {server.returncode}): {last[0][:300]}", err=True)
                    raise typer.Exit(1)
                try:
                    with urllib.request.urlopen(ready or f"http://127.0.0.1:{port}/", timeout=2):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        server.terminate()
                        typer.echo(f"error: {what} did not answer on port {port} in {start_timeout_s:g} s", err=True)
                        raise typer.Exit(1) from None
                    time.sleep(0.5)
            typer.echo(f"{what}: http://127.0.0.1:{port}/{path}  (Ctrl-C stops it)", err=False)
            sys.stdout.flush()
            server.wait()
        except KeyboardInterrupt:
            pass
        finally:
            if server.poll() is None:
                server.terminate()
                try:
                    server.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait(timeout=10)


def runs_path(uri: str, name: str) -> str:
    """The UI path of the study's runs table. MLflow 3 keeps a GenAI / model-training mode per
    browser (GenAI by default); `workflowType` in the URL opens the model-training runs table."""
    from mlflow.tracking import MlflowClient

    from orchestrator.run.ui_proxy import SHARED_VIEW_TAG, experiment_path

    experiment = MlflowClient(tracking_uri=uri).get_experiment_by_name(name)
    if experiment is None:
        return ""
    return experiment_path(experiment.experiment_id, SHARED_VIEW_TAG in experiment.tags)
