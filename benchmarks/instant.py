"""Ray Tune's part of a launch, in process, for benchmarks and fast tests: trials take no time.

`launch(..., executor=instant_executor(score))` runs the real launch (study folder, lock, journal, plan,
per-cell Optuna studies, MLflow) and replaces only Tune's execution of the trials: the real adapters
(`PlanSearcher`, `CellScheduler`, `TrackingCallback`, `ProgressCallback`) see what Tune shows them, each
trial reporting `score(config, seed, epoch)` as its dev score once per epoch, `slots` trials at a time (a fused
array, `resources.fuse`, one of them, reporting its members' scores together).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.run.tune_adapters import MEMBERS, CellScheduler, PlanSearcher, ProgressCallback, TrackingCallback

Score = Callable[[dict, int, int], float]


@dataclass
class Trial:
    """What the adapters read of a Ray trial."""

    trial_id: str
    config: dict
    error_file: str | None = None


def no_timer(name: str, function: Callable) -> Callable:
    return function


def instant_executor(score: Score, slots: int = 16, wrap: Callable[[str, Callable], Callable] = no_timer,
                     on_finished: Callable[[int], None] | None = None,
                     epoch_seconds: Callable[[dict, int], float] | None = None) -> Callable:
    """An executor for `launch`: `wrap(name, function)` may time the adapter calls (benchmarks/scale.py);
    `on_finished(n)` is called after the n-th trial ends (a tick for a benchmark, an interrupt for a test);
    `epoch_seconds(config, epoch)`: the wall time each epoch claims to take, stamped on its report as a
    worker stamps it (no time passes), so that the compute accounting has known figures."""

    def execute(plan, state, tracker, storage, name, max_concurrent, progress, banner) -> None:
        searcher = PlanSearcher(state, slots)
        scheduler, tracking = CellScheduler(state), TrackingCallback(state, tracker)
        with open(os.devnull, "w") as sink:
            view = ProgressCallback(state, banner, stream=sink, live=False)
            view.setup()
            suggest, complete = wrap("ask", searcher.suggest), wrap("tell", searcher.on_trial_complete)
            prune = wrap("pruner", scheduler.on_trial_result)
            start, result, finish = (wrap("mlflow", f) for f in (tracking.on_trial_start, tracking.on_trial_result,
                                                                  tracking.on_trial_complete))
            poll = wrap("progress", view.on_step_end)
            running: dict[str, tuple[Trial, dict[str, list]]] = {}  # Ray trial -> (trial, its members' progress)
            issued = finished = 0
            while True:
                while len(running) < slots:
                    config = suggest(f"t{issued}")
                    if not isinstance(config, dict):
                        break
                    trial = Trial(f"t{issued}", config)
                    issued += 1
                    start(0, [], trial)
                    members = {}
                    for member in config.get(MEMBERS, [config]):  # a fused array's members, else the one trial
                        done = state.records[member["trial_key"]].results  # a resumed trial goes on from there
                        best = max((r["dev_spearman"] for r in done if "dev_spearman" in r), default=None)
                        members[member["trial_key"]] = [member["trial"], len(done), best, len(done) + 1]
                    running[trial.trial_id] = (trial, members)
                if not running:
                    return
                for trial_id in list(running):
                    trial, members = running[trial_id]
                    reports = {}
                    for key, progress in members.items():
                        cfg, best = progress[0], progress[2]
                        if state.records[key].finished:
                            continue  # pruned out of its array
                        # a trial interrupted after its last epoch's result, before it ended, reports that epoch
                        # again, as a worker restored from its last checkpoint does (it trained every epoch)
                        epoch = min(progress[1] + 1, cfg["epochs"])
                        dev = score(cfg, cfg["seed"], epoch)
                        best = dev if best is None else max(best, dev)
                        progress[1:3] = [epoch, best]
                        metrics = {"epoch": epoch, "dev_spearman": dev, "train_loss": 1.0 / epoch,
                                   "best_dev_spearman": best, "params": 1000 * (1 + cfg.get("layer", 0))}
                        if epoch == cfg["epochs"] and cfg.get("score_test"):
                            metrics["test_spearman"] = dev - 1.0
                        if epoch_seconds is not None:  # one attempt per trial of this launch, as a worker stamps it
                            elapsed = sum(epoch_seconds(cfg, e) for e in range(progress[3], epoch + 1))
                            metrics.update({"attempt": trial.trial_id, "attempt_s": elapsed / len(members),
                                            "hardware_cpu_model": "Instant CPU", "hardware_gpu_model": "none"})
                        reports[key] = metrics
                    array = MEMBERS in trial.config
                    metrics = ({MEMBERS: reports} if array else next(iter(reports.values()))) if reports else {}
                    if reports:
                        result(0, [], trial, {**metrics, "node_ip": "10.0.0.1"})
                    stop = not reports or prune(None, trial, metrics) == "STOP"
                    if stop or all(p[1] >= p[0]["epochs"] or state.records[k].finished for k, p in members.items()):
                        complete(trial_id, metrics)
                        finish(0, [], trial)
                        del running[trial_id]
                        finished += 1
                        if on_finished is not None:
                            on_finished(finished)
                poll(0, [])

    return execute
