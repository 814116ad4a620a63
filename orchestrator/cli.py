"""The `orchestrator` command line. Bad input ends in one line on stderr and exit code 2."""

from __future__ import annotations

import errno
import functools
import json
import logging
import math
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli_usage import OrchestratorTyper
from trainables.errors import UserInputError, UserInputErrors

app = OrchestratorTyper(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Ablation and hyperparameter studies of sentence encoders on Ray Tune, tracked in MLflow.")

DEBUG = typer.Option(False, "--debug", help="Show the full traceback of an error.")


def show_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"orchestrator (ablation-orchestrator) {version('ablation-orchestrator')}")
        except PackageNotFoundError:
            typer.echo("orchestrator (ablation-orchestrator) 0+unknown")
        raise typer.Exit()


@app.callback()
def commands(_version: bool = typer.Option(False, "--version", callback=show_version, is_eager=True,
                                           help="Print the version and exit.")) -> None:
    """Ablation and hyperparameter studies of sentence encoders on Ray Tune, tracked in MLflow."""


def user_errors(command: Callable) -> Callable:
    """Turn a UserInputError into `error: <one line>` and exit code 2 (traceback with --debug), and a
    Ctrl-C that the verb does not handle itself into `interrupted: ...` and exit 130."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except KeyboardInterrupt:
            if kwargs.get("debug"):
                traceback.print_exc()
            verb = next((c.name for c in app.registered_commands if c.name and c.callback is not None
                         and c.callback.__name__ == command.__name__), command.__name__.replace("_", "-"))
            typer.echo(f"interrupted: `{cli_name()} {verb}` stopped before it finished; run it again", err=True)
            raise typer.Exit(INTERRUPTED) from None
        except UserInputError as exc:
            if kwargs.get("debug"):
                traceback.print_exc()
            for line in exc.lines() if isinstance(exc, UserInputErrors) else [str(exc)]:  # every problem found
                typer.echo(f"error: {line}", err=True)
            raise typer.Exit(getattr(exc, "exit_code", 2)) from None
        except OSError as exc:
            if exc.filename is None or exc.errno not in FILE_FIXES:  # not a path the user can put right
                raise
            if kwargs.get("debug"):
                traceback.print_exc()
            typer.echo(f"error: {exc.filename}: {exc.strerror or exc}; {FILE_FIXES[exc.errno]}", err=True)
            raise typer.Exit(2) from None

    return wrapper


# A path that is not what a verb expects (a state file of a study folder replaced by a folder, a storage path that
# is a file, a file it may not read): one line naming the path, whichever file of whichever verb it is
FILE_FIXES = {
    errno.EISDIR: "a folder stands where a file belongs: move it aside and run the command again (a study folder's "
                  "state files that can be rebuilt are rebuilt from its journal by `orchestrator resume`)",
    errno.ENOTDIR: "a file stands where a folder belongs: move it aside, or give --storage (storage_path) a folder",
    errno.EEXIST: "a file stands where a folder belongs: move it aside, or give --storage (storage_path) a folder",
    errno.EACCES: "make it readable (and writable for launch, resume and sync), or give another folder",
    errno.EPERM: "make it readable (and writable for launch, resume and sync), or give another folder",
    errno.ENOENT: "it is gone: check the path (a study folder moved or deleted while the command ran?)",
}


def quiet_libraries() -> None:
    """Progress bars and advice from transformers and MLflow's database chatter would bury the one
    line a user needs. Environment variables, so nothing heavy is imported to quiet it."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # MLflow resets its logger's level on import
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    for name in ("mlflow", "alembic", "ray.tune", "ray.train"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # MLflow logs a refused SQL write with its traceback before raising it; the launch says it in one line
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    own = logging.getLogger("orchestrator")  # our warnings (an MLflow outage, a replay) reach stderr whatever
    if not own.handlers:                     # other libraries did to the root logger
        handler = CurrentStderr()
        handler.setFormatter(logging.Formatter("warning: %(message)s"))
        own.addHandler(handler)
        own.setLevel(logging.INFO)
        own.propagate = False


class CurrentStderr(logging.StreamHandler):
    """A handler that writes to whatever `sys.stderr` is when it emits (a redirect, a test runner)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def parse_layers(value: str) -> list[int] | None:
    """`all` (None) or a comma list such as `0,3,6`."""
    if value.strip().lower() == "all":
        return None
    try:
        return [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise UserInputError("--layers", value, "use `all` or layer numbers such as 0,3,6") from None


@app.command()
@user_errors
def probe(
    model: Annotated[str, typer.Option(help="Hub id or local model folder.")],
    task: Annotated[str, typer.Option(help="Task name: stsb, stsb_multi_mt, korsts, sick, sick_full, mrpc.")] = "stsb",
    language: Annotated[str | None, typer.Option(help="Language of a multilingual task (stsb_multi_mt).")] = None,
    split: Annotated[str, typer.Option(help="dev or test.")] = "test",
    pooling: Annotated[str, typer.Option(help="mean, cls, max, mean_sqrt_len or last_token (a decoder's; cls is "
                                               "refused for causal models).")] = "mean",
    layers: Annotated[str, typer.Option(help="`all` or a comma list such as 0,3,6.")] = "all",
    data_dir: Annotated[str | None, typer.Option(help="Data folder (default: $ORCHESTRATOR_DATA_DIR, else "
                                                      "../shared/data beside the checkout, else the hub).")] = None,
    max_seq_length: Annotated[int, typer.Option(min=2, help="Tokens per sentence (at least 2: the special "
                                                           "tokens).")] = 128,
    precision: Annotated[str, typer.Option(help="fp32, bf16 or auto (bf16 where it is fast).")] = "fp32",
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    suite: Annotated[str | None, typer.Option(help="Score a suite instead of one task: `sts` is STS12-16, STS-B "
                                                   "and SICK-R (test splits) and their average.")] = None,
    max_eval_samples: Annotated[int | None, typer.Option(min=1, help="Score at most this many pairs per set "
                                                              "(a fixed random subset).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per layer per line.")] = False,
    debug: bool = DEBUG,
) -> None:
    """Zero-shot layer profile of an encoder: every layer pooled and scored, one forward pass. The same
    vectors give label-free diagnostics per layer (RankMe, anisotropy, alignment, uniformity), the layer
    each would pick and its Spearman with the labelled ranking (a second table; keys in --json)."""
    from orchestrator import api
    from trainables.evaluation.sts_suite import LABELS, suite_tasks

    quiet_libraries()
    rows = api.probe(model, task=task, language=language, split=split, pooling=pooling, layers=parse_layers(layers),
                     data_dir=data_dir, max_seq_length=max_seq_length, precision=precision, device=device,
                     suite=suite, max_eval_samples=max_eval_samples).to_dict("records")
    if suite is not None:
        if as_json:
            for row in rows:
                print(json.dumps({"model": model, "suite": suite, "split": "test", "pooling": pooling, **row}))
            return
        shown = [{"layer": r["layer"], "params": r["params"], **{LABELS[t]: r[t] for t in suite_tasks(suite)},
                  "Avg.": r["avg"]} for r in rows]
        print_layer_table(shown, f"{model} · {suite} suite (test, Spearman ×100 of cosine) · {pooling} pooling",
                          unit="")
        return
    if as_json:  # an undefined correlation (constant vectors, e.g. CLS at layer 0) is null
        for row in rows:
            clean = {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}
            print(json.dumps({"model": model, "task": task, "language": language, "split": split,
                              "pooling": pooling, **clean}))
        return
    print_layer_table(rows, f"{model} · {task}{'/' + language if language else ''} · {split} · {pooling} pooling")


STORAGE = typer.Option(None, "--storage", help="Folder of study folders (default: the study's storage_path "
                                                 "or ./studies).")
ADDRESS = typer.Option(None, "--address", help="Ray cluster: local (default), auto, or host:port; also RAY_ADDRESS.")
MAX_CONCURRENT = typer.Option(None, "--max-concurrent", min=1, help="At most this many trials at once.")
DATA_DIR = typer.Option(None, "--data-dir", help="Data folder in the layout of shared/data (default: "
                                                   "$ORCHESTRATOR_DATA_DIR, else ../shared/data beside the checkout, "
                                                   "else the hub); a study's own data_dir: must name the same.")
STUDY_FILE = typer.Argument(help="The study's YAML file (`orchestrator schema` prints its keys).")
NAME = typer.Argument(help="The study's name (its folder under --storage).")
Overrides = Annotated[list[str] | None, typer.Argument(
    metavar="KEY=VALUE", show_default=False,
    help="Changes to the study file, e.g. train.lr=3e-5 'replicate.seeds=[0,1,2]' ablate.layer=all (values are "
         "YAML; ~KEY removes a key); the study folder keeps the merged file.")]
NewName = Annotated[str | None, typer.Option("--name", help="Run the study under this name (a variation of the "
                                                            "file, in its own study folder and MLflow experiment).")]


@app.command()
@user_errors
def validate(study_file: str = STUDY_FILE, overrides: Overrides = None, name: NewName = None,
             data_dir: str | None = DATA_DIR, debug: bool = DEBUG) -> None:
    """Check a study file (keys, types, names, layers against the model, data, tracking URI); every problem
    found is one line."""
    from orchestrator import api

    quiet_libraries()
    found = api.plan(study_file, overrides or (), name=name, data_dir=data_dir)
    typer.echo(f"ok: {found.name}: {len(found.cells)} cells, {found.trials} trials")
    for data in found.declared_data:  # what it read of a data set the study declares, and the plugins it names
        typer.echo(f"data {data.name}: " + ", ".join(f"{split} {part.rows:,} rows (sha256 {part.sha256[:12]}…)"
                                                     for split, part in data.splits.items()))
    if found.plugins:
        typer.echo("plugins: " + ", ".join(f"{p.name} ({p.distribution} {p.version})" for p in found.plugins))


@app.command()
@user_errors
def plan(study_file: str = STUDY_FILE, overrides: Overrides = None, name: NewName = None,
         estimate: bool = typer.Option(False, "--estimate", help="Run a short pilot and estimate trial-hours and "
                                                                 "wall time; kept in the study's folder, so its "
                                                                 "report shows it beside what the study spent."),
         data_dir: str | None = DATA_DIR, storage: str | None = STORAGE, debug: bool = DEBUG) -> None:
    """List every ablation cell, the trials per phase and the total trial-rounds (epochs, cycles, ...)."""
    from rich.console import Console
    from rich.table import Table

    from orchestrator import api

    quiet_libraries()
    found = api.plan(study_file, overrides or (), name=name, estimate=estimate, data_dir=data_dir,
                     storage=storage)
    table = Table(title=f"{found.name}: {found.trainable} on {found.task} · {', '.join(found.models)}")
    table.add_column("#", justify="right")
    table.add_column("cell")
    table.add_column("tuning trials", justify="right")
    table.add_column("replicates", justify="right")
    for cell in found.cells.itertuples():
        table.add_row(str(cell.index), cell.cell, str(cell.tuning_trials), str(cell.replicates))
    console = Console(width=max(120, shutil.get_terminal_size().columns))
    console.print(table)
    tuned = ", ".join(f"{k} ~ {v}" for k, v in found.tuned.items()) or "nothing (grid x seeds)"
    console.print(f"tuned per cell: {tuned}")
    console.print(f"seeds: {', '.join(map(str, found.seeds))} · metric: {found.metric} ({found.mode})")
    console.print(f"trials: {found.tuning_trials} tuning + {found.replicate_trials} replicate = {found.trials}; at "
                  f"most {found.max_trial_rounds} trial-{found.round_name}s ({found.rounds_per_trial} per trial)")
    if found.estimate is not None and found.pilot is not None:
        pilot, guess = found.pilot, found.estimate
        console.print(f"pilot (this machine, {found.cpu_per_trial:g} CPU per trial): build {pilot.build_s:.1f} s, "
                      f"{pilot.unit} {pilot.unit_s:.3f} s x {pilot.units_per_round:g} per round, dev evaluation "
                      f"{pilot.eval_s:.1f} s (deepest cell)")
        stages = (f", {guess.stages} pretraining stage(s) {guess.stage_hours:.2f} h" if guess.stages else "")
        console.print(f"estimate: tuning {guess.tuning_hours:.2f} trial-h ({guess.tuning_rounds:.1f} rounds with "
                      f"ASHA's rungs), replicates {guess.replicate_hours:.2f} trial-h ({guess.replicate_rounds} "
                      f"rounds){stages}; total {guess.trial_hours:.2f} trial-h on {guess.slots} slots: wall "
                      f"{guess.wall_hours * 60:.1f} min")
        if found.budget_hours is not None:
            verdict = "within" if guess.wall_hours <= found.budget_hours else "OVER"
            console.print(f"budget: {found.budget_hours:g} h: {verdict}")
        if found.estimate_kept is not None:
            console.print(f"kept in {found.estimate_kept}: the launch of this study file records it and its report "
                          "shows it beside what the study spent")


@app.command()
def schema() -> None:
    """Print the JSON Schema of the study file (for editor completion)."""
    from orchestrator import api

    print(json.dumps(api.schema(), indent=2))


@app.command()
@user_errors
def launch(study_file: str = STUDY_FILE, overrides: Overrides = None, name: NewName = None,
           address: str | None = ADDRESS, storage: str | None = STORAGE, max_concurrent: int | None = MAX_CONCURRENT,
           resume_existing: bool = typer.Option(False, "--resume", help="Continue the study if it exists already."),
           data_dir: str | None = DATA_DIR, debug: bool = DEBUG) -> None:
    """Run a study on Ray Tune (a fresh local Ray unless --address), tracked in MLflow."""
    from orchestrator import api

    started = time.monotonic()
    quiet_libraries()
    spec = api.load_study(study_file, overrides or (), name=name, data_dir=data_dir, check=False)  # launch checks
    where = storage or spec.config.storage_path  # where the study folder goes, for the lines that name it
    run_to_end(spec.name, where, started, lambda: api.launch(spec, storage=storage, address=address,
                                                             max_concurrent=max_concurrent, resume=resume_existing))


@app.command()
@user_errors
def resume(name: str = NAME, overrides: Overrides = None, address: str | None = ADDRESS,
           storage: str | None = STORAGE, max_concurrent: int | None = MAX_CONCURRENT,
           data_dir: str | None = DATA_DIR, debug: bool = DEBUG) -> None:
    """Continue an interrupted study: finished trials are kept, interrupted ones continue. Overrides may
    extend it (more seeds, trials or axis values); one that would invalidate finished work is refused."""
    from orchestrator import api

    started = time.monotonic()
    quiet_libraries()
    run_to_end(name, storage, started, lambda: api.resume(name, overrides or (), storage=storage, address=address,
                                                          max_concurrent=max_concurrent, data_dir=data_dir))


@app.command()
@user_errors
def status(name: str = NAME, storage: str | None = STORAGE,
           as_json: bool = typer.Option(False, "--json", help="One JSON object: counts and every cell."),
           debug: bool = DEBUG) -> None:
    """Trials done / running / failed and the best dev score per cell, from the study's journal."""
    from orchestrator import api

    quiet_libraries()
    found = api.status(name, storage=storage)
    if as_json:
        print(json.dumps(found.as_dict()))
        return
    from rich.console import Console

    Console(width=max(120, shutil.get_terminal_size().columns)).print(found.table())
    typer.echo(f"study folder {found.folder}: {found.folder_bytes / 2**20:.1f} MiB (finished trials keep no "
               "checkpoint)" + ("; a launch is running it now" if found.running_now else ""))


@app.command(name="list")
@user_errors
def list_studies(storage: str | None = STORAGE,
                 as_json: bool = typer.Option(False, "--json", help="One JSON object per study."),
                 debug: bool = DEBUG) -> None:
    """The studies in a storage folder, with their state: finished, running now, or interrupted."""
    from orchestrator import api

    rows = api.list_studies(storage=storage)
    if not rows:
        typer.echo(f"no studies in {api.storage_folder(storage)}")
        return
    for row in rows:
        if as_json:
            print(json.dumps(row))
        else:
            detail = (f"{row['completed']} completed, {row['pruned']} pruned, {row['failed'] + row['diverged']} "
                      f"failed of {row['planned']} planned" if "planned" in row else row.get("problem", ""))
            typer.echo(f"{row['study']}: {row['state']}" + (f" · {detail}" if detail else ""))


@app.command()
@user_errors
def sync(name: str = NAME, storage: str | None = STORAGE, debug: bool = DEBUG) -> None:
    """Replay a study's journal into MLflow: runs, epochs and outcomes an outage missed."""
    from orchestrator import api

    quiet_libraries()
    counts = api.sync(name, storage=storage)
    typer.echo(f"{name}: created {counts['runs']} runs, logged {counts['epochs']} epochs, closed "
               f"{counts['closed']} runs; {counts['killed']} unfinished runs marked KILLED")


@app.command()
@user_errors
def doctor(address: str | None = ADDRESS, study: Annotated[str | None, typer.Option(
        "--study", help="Also check this study file: model, data, tracking URI, plan.")] = None,
           storage: str | None = STORAGE, data_dir: str | None = DATA_DIR, tracking_uri: Annotated[
               str | None, typer.Option("--tracking-uri", help="Check this MLflow tracking server (else the "
                                        "study's, if it is one): its backend, its artifact store from every node, "
                                        "its latency.")] = None,
           debug: bool = DEBUG) -> None:
    """Check the cluster (nodes, resources, versions), storage from every node, a tracking server, and a
    study's model, data and tracker: one line per check; exit 1 if any fails."""
    from orchestrator import api

    quiet_libraries()
    checks = api.doctor(address=address, study=study, storage=storage, data_dir=data_dir, tracking_uri=tracking_uri)
    for check in checks:
        typer.echo(check.line())
    if not all(c.ok for c in checks):
        raise typer.Exit(1)


@app.command()
@user_errors
def ui(name: str = NAME, storage: str | None = STORAGE, port: int = typer.Option(5000, min=1, max=65535,
                                                                        help="Port, or the next free one."),
       optuna: bool = typer.Option(False, "--optuna", help="optuna-dashboard of the cells' tuning instead."),
       debug: bool = DEBUG) -> None:
    """Start the MLflow UI (or optuna-dashboard) for the study on 127.0.0.1 and print its URL once it
    answers; exit 1 if it cannot start."""
    from orchestrator import Study

    study = Study.named(name, storage)
    if optuna:
        log = study.optuna_log
        if not log.exists():
            raise UserInputError("NAME", name, f"no {log}: the study tunes nothing, or was launched before Optuna "
                                               "studies were kept; `orchestrator resume` writes it")
        dashboard = own_command("optuna-dashboard")
        if dashboard is None:
            raise UserInputError("--optuna", True, f"install it: {sys.executable} -m pip install optuna-dashboard")
        from orchestrator.ui_proxy import start_proxy

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
    from orchestrator.ui_proxy import sqlite_runs_path, start_proxy

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
    import time
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

    from orchestrator.ui_proxy import SHARED_VIEW_TAG, experiment_path

    experiment = MlflowClient(tracking_uri=uri).get_experiment_by_name(name)
    if experiment is None:
        return ""
    return experiment_path(experiment.experiment_id, SHARED_VIEW_TAG in experiment.tags)


@app.command()
@user_errors
def report(names: Annotated[list[str], typer.Argument(help="One study, or several for one report across them.")],
           tracking_uri: str | None = typer.Option(None, help="MLflow store (default: each study's)."),
           out: str | None = typer.Option(None, help="Output folder (default: reports/NAME or reports/A+B)."),
           formats: str | None = typer.Option(None, "--format", help="Comma list of md, tex, csv (default: the "
                                                                      "study's report.formats)."),
           bundle: bool = typer.Option(False, "--bundle", help="Also write one archive for a paper's supplementary "
                                                               "material (NAME-bundle.tar.gz beside the report): the "
                                                               "report, study file, record, locked environment, data "
                                                               "hashes, the code and a README to reproduce any cell."),
           storage: str | None = STORAGE, debug: bool = DEBUG) -> None:
    """Paper tables (Markdown, LaTeX), plots and tidy CSVs from a study's MLflow runs; with several
    studies, one report whose tables have the study (its `report.label`) as an axis."""
    from orchestrator import api

    chosen = [f.strip() for f in (formats or "").split(",") if f.strip()]
    known = {"md": "markdown", "tex": "latex", "csv": "csv"}
    bad = [f for f in chosen if f not in known]
    if bad:
        raise UserInputError("--format", bad[0], "use a comma list of md, tex, csv")
    quiet_libraries()
    written = api.report(names, storage=storage, tracking_uri=tracking_uri, out=out,
                         formats=[known[f] for f in chosen] or None, bundle=bundle)
    typer.echo(f"report: {written.folder / 'report.md'} ({len(written.files)} files)")
    if written.bundle is not None:
        typer.echo(f"bundle: {written.bundle} ({written.bundle.stat().st_size / 2**20:.1f} MiB; its README says how "
                   "to reproduce any cell)")


@app.command()
@user_errors
def reproduce(folder: Annotated[str, typer.Argument(help="A folder written by `orchestrator report` (or an unpacked "
                                                         "--bundle).")],
              cell: Annotated[str, typer.Option(help="The cell's axis values, e.g. layer=3 or "
                                                     "'layer=3 pooling=mean'.")],
              seed: Annotated[int, typer.Option(help="The replicate seed.")],
              data_dir: Annotated[str | None, typer.Option(help="The folder holding the study's data (default: the "
                                                                "one the study used).")] = None,
              tolerance: Annotated[float, typer.Option(min=0.0, help="The largest difference that counts as the "
                                                                     "same score.")] = 1e-6,
              debug: bool = DEBUG) -> None:
    """Rerun one replicate of a report from its stored config and seed (the data's and the model's sha256
    checked first) and print the reported and recomputed dev and test scores side by side; exit 1, naming
    what of the environment differs from the launch's, when they differ."""
    from orchestrator import api
    from orchestrator.reproduce import render

    quiet_libraries()
    result = api.reproduce(folder, cell=cell, seed=seed, data_dir=data_dir, tolerance=tolerance)
    for line in render(result):
        typer.echo(line)
    if not result.matches:
        raise typer.Exit(1)


@app.command()
@user_errors
def verify(folder: Annotated[str, typer.Argument(help="A folder written by `orchestrator report`.")],
           tracking_uri: str | None = typer.Option(None, help="MLflow store (default: the report's)."),
           rerun: Annotated[int, typer.Option(min=0, help="Also rerun this many replicates drawn at random (as "
                                                           "`reproduce` does) and set each one's difference "
                                                           "against its cell's seed-to-seed sd: 0 on a CPU, a "
                                                           "GPU's nondeterminism elsewhere.")] = 0,
           rerun_seed: Annotated[int, typer.Option(help="The seed that draws the replicates to rerun.")] = 0,
           data_dir: Annotated[str | None, typer.Option(help="The folder holding the study's data, for --rerun "
                                                             "(default: the one the study used).")] = None,
           debug: bool = DEBUG) -> None:
    """Recompute every number of a written report from MLflow; exit 1 naming each cell that differs.
    With --rerun N, N replicates are also run again here, same seed, and their same-seed variation shown."""
    from orchestrator import api

    quiet_libraries()
    checked = api.verify(folder, tracking_uri=tracking_uri)
    for problem in checked.problems:
        typer.echo(f"differs: {problem}", err=True)
    if not checked.ok:
        raise typer.Exit(1)
    typer.echo(f"ok: every number of {checked.folder} ({checked.cells} cells) matches MLflow")
    if rerun:
        from orchestrator.reproduce import read_report, render_reruns

        total = len(read_report(Path(folder))[0])
        for line in render_reruns(api.rerun(folder, rerun, draw_seed=rerun_seed, data_dir=data_dir), total,
                                  rerun_seed):
            typer.echo(line)


INTERRUPTED = 130  # the shell's code for a process ended by SIGINT; 143 for SIGTERM


def cli_name() -> str:
    """The CLI as the user called it (`.venv/bin/orchestrator`, or `orchestrator` from PATH), so that the
    commands it suggests paste as they are."""
    called = sys.argv[0] if sys.argv else ""
    if Path(called).name != "orchestrator" or not called or shutil.which("orchestrator") == called:
        return "orchestrator"
    return called


def study_options(storage: str | Path | None) -> str:
    """`--storage DIR` where the study folder is not under ./studies (which NAME alone finds)."""
    from orchestrator.study_folder import DEFAULT_STORAGE

    if storage is None or Path(storage).expanduser().resolve() == Path(DEFAULT_STORAGE).resolve():
        return ""
    return f" --storage {storage}"


def run_to_end(name: str, storage: str | Path | None, started: float, start: Callable) -> None:
    """A launch or resume: its summary line, where its report went and what to do next, with the command's
    wall time (MLflow down: how to catch up). Stopped by Ctrl-C or SIGTERM: the summary, how to continue,
    and exit 130 (143)."""
    from orchestrator import api
    from orchestrator.launcher import CLUSTER_LOST, TERMINATED, shutdown_ray
    from orchestrator.progress import duration

    def cluster_lost(code: int) -> None:  # the local Ray stopped under the launch (a stop signal to the group)
        typer.echo(interrupted_line(name, storage), err=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    CLUSTER_LOST["on_lost"] = cluster_lost
    try:
        result = start()
    except api.StudyInterrupted as stopped:
        shutdown_ray()  # first, with Ctrl-C held off: a second Ctrl-C lands in it otherwise
        summarize(stopped.result)
        typer.echo(f"interrupted: {cli_name()} resume {name}{study_options(stopped.result.study_dir.parent)}",
                   err=True)
        raise typer.Exit(128 + TERMINATED["signal"] if TERMINATED["signal"] else INTERRUPTED) from None
    except KeyboardInterrupt:  # a second Ctrl-C, or one before Tune ran: one line, not a traceback
        shutdown_ray()
        typer.echo(interrupted_line(name, storage), err=True)
        raise typer.Exit(INTERRUPTED) from None
    finally:
        CLUSTER_LOST["on_lost"] = None  # the launch is over: an API launch in this process waits for Ray
    shutdown_ray()
    summarize(result)
    cli, options = cli_name(), study_options(result.study_dir.parent)
    if result.report is None:
        typer.echo(f"MLflow is unreachable: no report yet; when it is back run `{cli} sync {name}{options}` and "
                   f"`{cli} report {name}{options}`", err=True)
        return
    folder = result.report.folder
    typer.echo(f"report: {folder / 'report.md'} ({len(result.report.files)} files)")
    steps = [(f"{cli} ui {name}{options}", "the runs in the MLflow UI"),
             (f"{cli} verify {folder}", "every number of the report checked against MLflow"),
             (f"{cli} report {name}{options}", "the report written again (after editing report: in the study file)")]
    width = max(len(command) for command, _ in steps)
    typer.echo(f"{name}: done in {duration(time.monotonic() - started)}. Next:")
    for command, what in steps:
        typer.echo(f"  {command.ljust(width)}  # {what}")


def interrupted_line(name: str, storage: str | Path | None) -> str:
    """How to go on after a Ctrl-C: `resume` once the launch has stored the study; before that (Ray
    starting, the folder being made) nothing ran, and `resume` would find no study to continue."""
    from orchestrator.study import Study

    if Study.named(name, storage).exists():
        return f"interrupted: {cli_name()} resume {name}{study_options(storage)}"
    return (f"interrupted before the study began: nothing ran and there is nothing to resume; run the same "
            f"`{cli_name()} launch` again")


def summarize(result) -> None:
    counts = result.counts
    state = "finished" if result.finished else "not finished"
    skipped = counts.get("skipped", 0)
    skipped_text = (f" ({skipped} replicate{'s' if skipped > 1 else ''} skipped: `orchestrator status "
                    f"{result.study_dir.name}` says why)" if skipped else "")
    typer.echo(f"{result.study_dir.name}: {state}: {counts['completed']} completed, {counts['pruned']} pruned, "
               f"{counts['diverged']} diverged, {counts['failed']} failed of {counts['planned']} planned"
               f"{skipped_text}; study folder {result.study_dir}")


def print_layer_table(rows: list[dict], title: str, unit: str = " ×100") -> None:
    """One row per layer, the best value of each metric in bold; a collapsed layer's scores (every
    cosine within 1e-4 of the others) carry a ° and its cosine spread is said under the table. Rows
    with label-free diagnostics get a second table of them (each one's pick in bold) and one line per
    diagnostic: the layer it picks and its Spearman with the labelled ranking of layers."""
    from rich.console import Console
    from rich.table import Table

    from trainables.evaluation.diagnostics import DIRECTIONS

    diagnostics = [d for d in DIRECTIONS if d in rows[0]]
    summaries = {f"{d}_{end}" for d in diagnostics for end in ("pick", "rho")}
    metrics = [k for k in rows[0] if k not in ("layer", "params", "threshold", "cosine_spread", *diagnostics,
                                               *summaries)]
    best = {m: max((r[m] for r in rows if not math.isnan(r[m])), default=None) for m in metrics}
    collapsed = {r["layer"]: r["cosine_spread"] for r in rows if is_number(r.get("cosine_spread"))
                 and not math.isnan(r[metrics[0]])}  # a table's rows carry the key as NaN where a layer has none
    table = Table(title=title)
    table.add_column("layer", justify="right")
    for metric in metrics:
        table.add_column(f"{metric}{unit}", justify="right")
    table.add_column("params (M)", justify="right")
    for row in rows:
        mark = "°" if row["layer"] in collapsed else ""
        cells = ["—" if math.isnan(row[m]) else f"[bold]{row[m]:.2f}{mark}[/bold]" if row[m] == best[m]
                 else f"{row[m]:.2f}{mark}" for m in metrics]
        table.add_row(str(row["layer"]), *cells, f"{row['params'] / 1e6:.1f}")
    console = Console()
    console.print(table)
    if collapsed:  # under the table, not a caption squeezed to its width
        console.print("° collapsed (every cosine within 1e-4 of the others), cosine spread: " + ", ".join(
            f"layer {layer} {spread:.1e}".replace("e-0", "e-") for layer, spread in collapsed.items()), soft_wrap=True)
    if diagnostics:
        print_diagnostics(console, rows, diagnostics)


DIAGNOSTIC_FORMATS = {"rankme": ".1f", "anisotropy": ".3f", "alignment": ".3f", "uniformity": ".3f"}


def print_diagnostics(console, rows: list[dict], diagnostics: list[str]) -> None:
    """The label-free diagnostics as their own small table (raw values, not x100) and one line each."""
    from rich.table import Table

    from trainables.evaluation.diagnostics import DIRECTIONS

    table = Table(title="label-free diagnostics (the split's sentences and pairs, no scores)")
    table.add_column("layer", justify="right")
    for name in diagnostics:
        table.add_column(f"{name} ({'max' if DIRECTIONS[name] > 0 else 'min'})", justify="right")
    for row in rows:
        cells = ["—" if not is_number(row[d]) else f"[bold]{row[d]:{DIAGNOSTIC_FORMATS[d]}}[/bold]"
                 if row["layer"] == row[f"{d}_pick"] else f"{row[d]:{DIAGNOSTIC_FORMATS[d]}}" for d in diagnostics]
        table.add_row(str(row["layer"]), *cells)
    console.print(table)
    for name in diagnostics:
        pick, rho = rows[0][f"{name}_pick"], rows[0][f"{name}_rho"]
        picked = f"layer {int(pick)}" if is_number(pick) else "no layer"
        agreement = f"{rho:+.2f}" if is_number(rho) else "— (under 3 scored layers, or constant)"
        console.print(f"{name} picks {picked}; Spearman with the labelled layer ranking {agreement}",
                      soft_wrap=True)


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not math.isnan(value)


def main() -> None:  # pragma: no cover - console entry point
    sys.exit(app())


if __name__ == "__main__":  # pragma: no cover
    main()
