"""The verbs of one study: validate, plan, schema, launch, resume, status, list, sync and doctor, and what a
launch or resume prints at its end."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.app import (
    ADDRESS,
    DATA_DIR,
    DEBUG,
    INTERRUPTED,
    MAX_CONCURRENT,
    NAME,
    STORAGE,
    STUDY_FILE,
    NewName,
    Overrides,
    app,
    cli_name,
    quiet_libraries,
    study_options,
    user_errors,
)


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
    if found.fusion:
        console.print(f"fuse: {found.fusion}")
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
    study = api.load_study(study_file, overrides or (), name=name, data_dir=data_dir, check=False,  # launch checks
                           storage=storage)
    where = storage or study.config.storage_path  # where the study folder goes, as given, for the lines naming it
    run_to_end(study.name, where, started, lambda stops: study.launch(
        address=address, max_concurrent=max_concurrent, resume=resume_existing, stops=stops))


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
    run_to_end(name, storage, started, lambda stops: api.resume(
        name, overrides or (), storage=storage, address=address, max_concurrent=max_concurrent, data_dir=data_dir,
        stops=stops))


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



def run_to_end(name: str, storage: str | Path | None, started: float, start: Callable) -> None:
    """A launch or resume (`start(stops)`): its summary line, where its report went and what to do next,
    with the command's wall time (MLflow down: how to catch up). Stopped by Ctrl-C or SIGTERM: the summary,
    how to continue, and exit 130 (143); the local Ray stopped under it: the one line at once."""
    from orchestrator import api
    from orchestrator.run.progress import duration
    from orchestrator.run.ray_session import Stops, shutdown_ray

    def cluster_lost(code: int) -> None:  # the local Ray stopped under the launch (a stop signal to the group)
        typer.echo(interrupted_line(name, storage), err=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    stops = Stops(on_lost=cluster_lost)
    try:
        result = start(stops)
    except api.StudyInterrupted as stopped:
        shutdown_ray()  # first, with Ctrl-C held off: a second Ctrl-C lands in it otherwise
        summarize(stopped.result)
        typer.echo(f"interrupted: {cli_name()} resume {name}{study_options(stopped.result.study_dir.parent)}",
                   err=True)
        raise typer.Exit(128 + stops.signal if stops.signal else INTERRUPTED) from None
    except KeyboardInterrupt:  # a second Ctrl-C, or one before Tune ran: one line, not a traceback
        shutdown_ray()
        typer.echo(interrupted_line(name, storage), err=True)
        raise typer.Exit(128 + stops.signal if stops.signal else INTERRUPTED) from None
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
    from orchestrator.study.folder import StudyFolder

    if StudyFolder.named(name, storage).exists():
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
