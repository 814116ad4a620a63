"""What runs next, and what each outcome means: the ablate x tune x replicate semantics.

One in-memory Optuna study per ablation cell (its seeded sampler, TPE by default, through ask/tell; its
pruner, successive halving by default, only ever sees that cell's trials; with several `tune.objectives`, a
multi-objective study whose Pareto set `orchestrator.study.objectives` reads). Order of work: trials interrupted
by a previous launch first, then replicates of cells whose tuning is done (the best fully-trained config x
seeds), then tuning trials round-robin over cells. Rebuilt from the journal on resume.
Pure Python: no Ray import, so it is tested directly.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeGuard, cast

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import TrialState

from orchestrator.study.cells import Cell
from orchestrator.study.journal import Journal, Outcome, TrialRecord
from orchestrator.study.objectives import (
    KEY_ATTR,
    generation_attrs,
    objective_values,
    pareto_keys,
    replicate_choice,
)
from orchestrator.study.plan import StudyPlan
from orchestrator.study.replay import RUNG, frozen_trial, reported_steps, rung_records
from orchestrator.study.seed_rules import ci95_half, stein_half, wants_another
from search_spaces.optuna_domains import optuna_space
from search_spaces.optuna_samplers import make_pruner, make_sampler, nsga2_population, objective_directions
from trainables.errors import storage_full

if TYPE_CHECKING:
    from orchestrator.study.config import TuneSection

FINISHED = "FINISHED"
optuna.logging.set_verbosity(optuna.logging.WARNING)


class StudyState:
    def __init__(self, plan: StudyPlan, journal: Journal, optuna_log: Path | None = None):
        """`optuna_log`: an Optuna journal file the cells' studies are mirrored into (rewritten from
        the study's journal at each launch), for optuna-dashboard."""
        self.plan, self.journal = plan, journal
        self.storage = None
        if optuna_log is not None and plan.study.tune:
            from optuna.storages import JournalStorage
            from optuna.storages.journal import JournalFileBackend

            optuna_log.unlink(missing_ok=True)
            self.storage = JournalStorage(JournalFileBackend(str(optuna_log)))
        self.space: dict[str, BaseDistribution] = optuna_space(plan.tuned)
        self.directions = objective_directions(plan.objectives, plan.mode)
        self.multi = len(plan.objectives) > 1  # several objectives: told as values, never pruned
        self.studies = {cell.index: self._new_study(cell) for cell in plan.cells} if plan.study.tune else {}
        self.records: dict[str, TrialRecord] = {}
        # what the driver asks about on every trial, kept as it changes so that no question scans the
        # whole study (a 10,000-trial study would pay for it on each trial: benchmarks/scale.py)
        self.by_cell: dict[tuple[int, str], dict[str, TrialRecord]] = {}  # (cell, phase) -> its records
        self.finished_keys: list[str] = []  # in the order they finished (a resume: the earlier ones first)
        self._outcomes: dict[Outcome, int] = dict.fromkeys(Outcome, 0)
        self._open: dict[tuple[int, str], int] = {}  # (cell, phase) -> its records not finished
        self._best: dict[int, TrialRecord | None] = {}  # cells whose tuning finished: their best trial
        self.asked: dict[str, optuna.trial.Trial] = {}
        self.storage_full: str | None = None  # a trial failed because the disk was full: the launch stops
        self.requeue: list[TrialRecord] = []
        self._replay()

    def __getstate__(self) -> dict[str, Any]:
        """Tune pickles its searcher and scheduler with the experiment; the journal, not that
        pickle, is what a resume reads, so nothing is carried."""
        return {}

    # --- construction and replay ------------------------------------------------------------

    def _new_study(self, cell: Cell) -> optuna.Study:
        tune = cast("TuneSection", self.plan.study.tune)  # a study's cells have studies only when it tunes
        sampler = make_sampler(tune.sampler, tune.sampler_seed + cell.index, tune.startup_trials, tune.qmc_type,
                               nsga2_population(tune.trials, tune.population_size),
                               self.plan.tuning_members_of(cell.index) > 1)
        pruner = make_pruner(tune.scheduler, tune.grace_epochs, tune.reduction_factor, self.plan.reports_of(cell.index))
        name = f"{self.plan.study.name} {cell.key}"
        if self.multi:
            directions = cast(list[Literal["maximize", "minimize"]], self.directions)
            return optuna.create_study(directions=directions, sampler=sampler, pruner=pruner,
                                       storage=self.storage, study_name=name)
        direction = cast(Literal["maximize", "minimize"], self.directions[0])
        return optuna.create_study(direction=direction, sampler=sampler, pruner=pruner, storage=self.storage,
                                   study_name=name)

    def _replay(self) -> None:
        """Rebuild from the journal: finished tuning trials go back into their cell's study;
        unfinished trials, and trials a full disk failed, are queued to run again (from their last
        checkpoint)."""
        index = {cell.key: cell.index for cell in self.plan.cells}
        for record in self.journal.records().values():
            if record.cell_key is not None:  # the plan may have gained cells since: find it by its values
                if record.cell_key not in index:
                    continue
                record.cell = index[record.cell_key]
            if record.outcome == Outcome.FAILED and storage_full(record.error):  # not the trial's fault: again
                record.outcome = record.error = record.ended = None
            self._index(record)
            if record.finished:
                self._count_finished(record, was_open=False)
            if record.finished and record.phase == "tune":
                self.studies[record.cell].add_trial(self._frozen(record))
            elif not record.finished:
                self.requeue.append(record)

    def _frozen(self, record: TrialRecord) -> optuna.trial.FrozenTrial:
        told = self._told(record) if record.outcome == Outcome.COMPLETED else None
        return frozen_trial(record, self.space, told, {} if self.multi else self._steps(record), self._rungs(record))

    def _steps(self, record: TrialRecord) -> dict[int, float]:
        return reported_steps(record, self.plan.metric)

    def _rungs(self, record: TrialRecord) -> dict[str, float]:
        return rung_records(record, self._steps(record), self.studies[record.cell].pruner,
                            self.plan.reports_of(record.cell))

    # --- what runs next -------------------------------------------------------------------------

    def next_trial(self) -> TrialRecord | str | None:
        """The next trial to start; FINISHED when nothing is left; None while only running trials
        block further work (their outcomes decide the replicates)."""
        if self.requeue:
            return self._reissue(self.requeue.pop(0))
        for cell in self.plan.start_order():
            replicate = self._next_replicate(cell)
            if replicate is not None:
                return replicate
        tuning = self._next_tuning()
        if tuning is not None:
            return tuning
        return FINISHED if all(r.finished for r in self.records.values()) else None

    def _reissue(self, record: TrialRecord) -> TrialRecord:
        """A trial interrupted by an earlier launch, issued again (a tuning trial asked again of its cell's study,
        with its epochs so far and the generation it was bred in)."""
        if record.phase == "tune":
            self.studies[record.cell].enqueue_trial(record.tuned, skip_if_exists=False)
            trial = self.asked[record.key] = self.studies[record.cell].ask(self.space)
            trial.set_user_attr(KEY_ATTR, record.key)
            # its epochs before the interruption and what the pruner made of them (it goes on from the rung
            # it had reached; a multi-objective study reports none), and the generation NSGA-II bred it in
            for step, value in ({} if self.multi else self._steps(record)).items():
                trial.report(value, step=step)
            for name, value in {**self._rungs(record), **record.sampler_attrs}.items():
                trial.storage.set_trial_system_attr(trial._trial_id, name, value)
        self._issue(record)
        return record

    def next_array(self) -> list[TrialRecord] | str | None:
        """`next_trial`, with the trials of its cell and phase that may start beside it in one fused array
        (`resources.fuse`): interrupted ones first, then new seeds (replicates) or the cell's next suggestions
        (tuning, when its tuning fuses), up to the cell's members. FINISHED or None as `next_trial`."""
        first = self.next_trial()
        if not isinstance(first, TrialRecord):
            return first
        array = [first]
        cell = self.plan.cells[first.cell]
        size = (self.plan.members_of if first.phase == "replicate" else self.plan.tuning_members_of)(first.cell)
        while len(array) < size:
            queued = next((r for r in self.requeue if r.cell == first.cell and r.phase == first.phase), None)
            if queued is not None:
                self.requeue.remove(queued)
                array.append(self._reissue(queued))
                continue
            more = self._next_replicate(cell) if first.phase == "replicate" else self._next_tuning(cell)
            if more is None:
                break
            array.append(more)
        return array

    def _index(self, record: TrialRecord) -> None:
        group = self.by_cell.setdefault((record.cell, record.phase), {})
        if record.key not in group and not record.finished:
            self._open[record.cell, record.phase] = self._open.get((record.cell, record.phase), 0) + 1
        self.records[record.key] = group[record.key] = record

    def _count_finished(self, record: TrialRecord, was_open: bool = True) -> None:
        self._outcomes[cast(Outcome, record.outcome)] += 1  # a finished record has its outcome
        self.finished_keys.append(record.key)
        if was_open:
            self._open[record.cell, record.phase] -= 1

    def issued(self, cell: Cell, phase: str) -> list[TrialRecord]:
        return list(self.by_cell.get((cell.index, phase), {}).values())

    def tuning_done(self, cell: Cell) -> bool:
        key = (cell.index, "tune")
        return len(self.by_cell.get(key, ())) >= self.plan.trials_per_cell and not self._open.get(key, 0)

    def best_tuned(self, cell: Cell) -> TrialRecord | None:
        """The cell's best fully-trained tuning trial, by the dev metric only (with several objectives: its
        Pareto trial with the best dev score, `orchestrator.study.objectives.replicate_choice`)."""
        if cell.index in self._best:
            return self._best[cell.index]
        done = [r for r in self.issued(cell, "tune") if r.outcome == Outcome.COMPLETED and _finite(self._value(r))]
        sign = 1 if self.plan.mode == "max" else -1
        best = max(done, key=lambda r: sign * cast(float, self._value(r))) if done else None  # finite: scored
        if self.multi:
            front = self.pareto(cell)
            told = {r.key: cast("list[float]", self._told(r)) for r in front}  # on the frontier: told values
            best = replicate_choice(front, told, self.plan.objectives, self.directions)
        if self.tuning_done(cell):  # a finished tuning never changes in this state: asked once per trial
            self._best[cell.index] = best
        return best

    def pareto(self, cell: Cell) -> list[TrialRecord]:
        """The cell's Pareto set with several objectives (Optuna's `best_trials`), in the order its trials
        were asked; empty with one objective."""
        if not self.multi:
            return []
        return [self.records[key] for key in pareto_keys(self.studies[cell.index]) if key in self.records]

    def pareto_marks(self) -> dict[str, bool]:
        """With several objectives: whether each tuning trial of a cell whose tuning is done is on the cell's
        Pareto set (MLflow's `orchestrator.pareto` tags; the report marks them); empty with one objective."""
        marks: dict[str, bool] = {}
        for cell in self.plan.cells if self.multi else ():
            if self.tuning_done(cell):
                front = {r.key for r in self.pareto(cell)}
                marks.update({r.key: r.key in front for r in self.issued(cell, "tune")})
        return marks

    def skip_reason(self, cell: Cell) -> str | None:
        """Why a cell gets no replicates (its tuning finished and left no config with a dev score to
        replicate), else None. A degenerate trial completed but never had a dev score to compare."""
        if not self.plan.study.tune or not self.tuning_done(cell) or self.best_tuned(cell) is not None:
            return None
        if self.multi and any(r.outcome == Outcome.COMPLETED and _finite(self._value(r))
                              for r in self.issued(cell, "tune")):
            missing = ", ".join(name for name in self.plan.objectives if name != "dev")
            return f"skipped: no tuning trial reported {missing} (tune.objectives)"
        outcomes = [r.outcome for r in self.issued(cell, "tune")]
        names: dict[Outcome | None, str] = {Outcome.COMPLETED: "degenerate", Outcome.DIVERGED: "diverged",
                                            Outcome.FAILED: "failed", Outcome.PRUNED: "pruned"}
        counts = {name: sum(names.get(o) == name for o in outcomes) for name in dict.fromkeys(names.values())}
        only = [name for name, count in counts.items() if count == len(outcomes)]
        if only:
            return f"skipped: every tuning trial {only[0]}"
        return "skipped: no tuning trial finished with a dev score (" + ", ".join(
            f"{count} {name}" for name, count in counts.items() if count) + ")"

    def replicates(self, cell: Cell) -> list[TrialRecord]:
        """The cell's replicate runs that count: those of its current config (never superseded)."""
        return [r for r in self.issued(cell, "replicate") if not r.superseded]

    def _supersede_stale(self, cell: Cell, tuned: dict[str, Any]) -> None:
        """More tuning trials (a study extended on resume) found a better config: replicates of the
        old one no longer describe the cell; they stay in MLflow, tagged, and are run again."""
        for record in self.replicates(cell):
            if record.finished and record.tuned != tuned:
                record.superseded = True
                self.journal.write("superseded", key=record.key)

    def _next_replicate(self, cell: Cell) -> TrialRecord | None:
        if self.plan.study.tune and not self.tuning_done(cell):
            return None
        tuned: dict[str, Any] = {}
        if self.plan.study.tune:
            best = self.best_tuned(cell)
            if best is None:  # every tuning trial failed or diverged: nothing to replicate
                return None
            tuned = best.tuned
            self._supersede_stale(cell, tuned)
        seeds_done = {r.seed for r in self.replicates(cell)}
        pending = [s for s in self.plan.seeds if s not in seeds_done]
        if not pending and self.seed_rule(cell)[0]:  # the dev mean is not precise enough yet: one more seed
            pending = [s for s in self.extra_seeds() if s not in seeds_done][:1]
        if not pending:
            return None
        seed = pending[0]
        key = f"c{cell.index}-s{seed}"
        if key in self.records:  # a superseded replicate holds the plain key
            key = f"{key}-r{sum(k.startswith(key) for k in self.records)}"
        record = TrialRecord(key=key, cell=cell.index, phase="replicate", seed=seed,
                             tuned=tuned, config=self.plan.trial_config(cell, tuned, seed))
        self._issue(record)
        return record

    def extra_seeds(self) -> list[int]:
        """Seeds an adaptive rule may add after `replicate.seeds`: the next whole numbers, never the
        tuning seed, up to `max_seeds` in all."""
        rule = self.plan.study.replicate
        if rule.max_seeds is None:
            return []
        taken = set(self.plan.seeds) | ({self.plan.study.tune.seed} if self.plan.study.tune else set())
        extra: list[int]
        extra, candidate = [], max(self.plan.seeds) + 1
        while len(self.plan.seeds) + len(extra) < rule.max_seeds:
            if candidate not in taken:
                extra.append(candidate)
            candidate += 1
        return extra

    def seed_rule(self, cell: Cell) -> tuple[bool, str]:
        """(does the cell want another seed?, why it stopped or goes on) under `replicate.until`: the
        cell's dev scores in seed order against `until.dev_ci95`, by `until.rule` (two-stage: the
        planned seeds' spread fixes the total; sequential: one more while the CI is too wide), capped
        by `max_seeds`. Dev only: test never decides."""
        rule = self.plan.study.replicate
        if rule.until is None:
            return False, ""
        current = self.replicates(cell)
        if not current or not all(r.finished for r in current) or \
                {r.seed for r in current} < set(self.plan.seeds):
            return False, f"{len(current)} seeds so far"
        scored = [(r.seed, self._value(r)) for r in sorted(current, key=lambda r: r.seed)
                  if r.outcome == Outcome.COMPLETED]
        first = [v for seed, v in scored if seed in self.plan.seeds and _finite(v)]
        values = first + [v for seed, v in scored if seed not in self.plan.seeds and _finite(v)]
        more, why = wants_another(rule.until.rule, values, len(first), rule.until.dev_ci95, cast(int, rule.max_seeds))
        if more and len(current) >= cast(int, rule.max_seeds):  # failed seeds count: the cap is on runs
            half = stein_half(first, len(values)) if rule.until.rule == "two_stage" else ci95_half(values)
            return False, f"stopped at max_seeds {rule.max_seeds}: dev 95% CI ±{half:.2f}"
        return more, why

    def cell_done(self, cell: Cell) -> bool:
        """Every replicate the cell will get has finished."""
        current = self.replicates(cell)
        return (bool(current) and all(r.finished for r in current) and {r.seed for r in current} >=
                set(self.plan.seeds) and not self.seed_rule(cell)[0])

    def _next_tuning(self, only: Cell | None = None) -> TrialRecord | None:
        """The next suggestion, of the open cell with fewest trials (or of `only`, a fused array's cell)."""
        if not self.plan.study.tune:
            return None
        open_cells = [c for c in ([only] if only is not None else self.plan.cells)
                      if len(self.by_cell.get((c.index, "tune"), ())) < self.plan.trials_per_cell]
        if not open_cells:
            return None
        rank = {c.index: i for i, c in enumerate(self.plan.start_order())}  # round-robin, costliest first
        cell = min(open_cells, key=lambda c: (len(self.by_cell.get((c.index, "tune"), ())), rank[c.index]))
        trial = self.studies[cell.index].ask(self.space)
        n = len(self.by_cell.get((cell.index, "tune"), ()))
        trial.set_user_attr(KEY_ATTR, f"c{cell.index}-t{n}")
        seed = self.plan.study.tune.seed  # disjoint from the replicate seeds (checked by the plan)
        record = TrialRecord(key=f"c{cell.index}-t{n}", cell=cell.index, phase="tune", seed=seed,
                             tuned=dict(trial.params),
                             config=self.plan.trial_config(cell, dict(trial.params), seed, "tune"),
                             number=trial.number,
                             sampler_attrs=generation_attrs(self.studies[cell.index], trial._trial_id))
        self.asked[record.key] = trial
        self._issue(record)
        return record

    def _issue(self, record: TrialRecord) -> None:
        record.cell_key = self.plan.cells[record.cell].key
        self._index(record)
        self.journal.write("issued", key=record.key, cell=record.cell, cell_key=record.cell_key, phase=record.phase,
                           seed=record.seed, tuned=record.tuned, config=record.config, number=record.number,
                           **({"sampler_attrs": record.sampler_attrs} if record.sampler_attrs else {}))

    # --- outcomes ----------------------------------------------------------------------------------

    def on_result(self, key: str, metrics: dict[str, Any]) -> bool:
        """Record one epoch; True when the cell's pruner stops this tuning trial."""
        record = self.records[key]
        record.results.append(metrics)
        trial = self.asked.get(key)
        value = metrics.get(self.plan.metric)
        stop, rungs = False, {}
        if record.phase == "tune" and trial is not None and "epoch" in metrics and _finite(value) and not self.multi:
            # a multi-objective study is never pruned (Optuna has no intermediate values for several objectives)
            trial.report(value, step=int(metrics["epoch"]))
            stop = int(metrics["epoch"]) < self.plan.reports_of(record.cell) and trial.should_prune()
            rungs = {k: v for k, v in trial.storage.get_trial_system_attrs(trial._trial_id).items()
                     if k.startswith(RUNG) and record.rungs.get(k) != v}  # what this report's pruning recorded
            record.rungs.update(rungs)
        # the pruner's rung records with the result that made them: a resume gives them back to the cell's study
        self.journal.write("result", key=key, metrics=metrics, **({"rungs": rungs} if rungs else {}))
        return stop

    def on_checkpoint(self, key: str, path: str) -> None:
        if key in self.records:
            self.records[key].checkpoint = path
            self.journal.write("checkpoint", key=key, path=path)

    def is_complete(self) -> bool:
        """Every trial finished and nothing left to issue (a cell whose tuning all failed has no
        replicates to run)."""
        if self.requeue or not all(r.finished for r in self.records.values()):
            return False
        for cell in self.plan.cells:
            if self.plan.study.tune and not self.tuning_done(cell):
                return False
            best = self.best_tuned(cell) if self.plan.study.tune else None
            if self.plan.study.tune and best is None:
                continue
            current = [r for r in self.replicates(cell) if best is None or r.tuned == best.tuned]
            if not {r.seed for r in current} >= set(self.plan.seeds) or self.seed_rule(cell)[0]:
                return False
        return True

    def on_finished(self, key: str, outcome: Outcome, error: str | None = None) -> None:
        record = self.records[key]
        if record.finished:
            return
        full = self.plan.reports_of(record.cell)
        if outcome == Outcome.COMPLETED and int(record.last.get("epoch", full)) < full:
            outcome = Outcome.PRUNED  # stopped before the last epoch: tell the truth
        record.outcome, record.error = outcome, error
        if outcome == Outcome.FAILED and storage_full(error):
            self.storage_full = error
        self._count_finished(record)
        self.journal.write("finished", key=key, outcome=outcome.value, error=error, wall_s=record.wall_s)
        trial = self.asked.pop(key, None)
        if trial is not None:
            study, told = self.studies[record.cell], self._told(record)
            if outcome == Outcome.COMPLETED and told is not None:
                study.tell(trial, told)
            elif outcome == Outcome.PRUNED:
                study.tell(trial, state=TrialState.PRUNED)
            else:
                study.tell(trial, state=TrialState.FAIL)

    def _told(self, record: TrialRecord) -> float | list[float] | None:
        """What a completed trial tells its cell's study: its best dev score, or with several objectives its
        value of each (None: it has none to tell, and is told failed)."""
        if self.multi:
            return objective_values(record, self.plan.objectives, self._value(record))
        value = self._value(record)
        return value if _finite(value) else None

    def _value(self, record: TrialRecord) -> float | None:
        """A trial's score: its best dev value over epochs (what the best-dev epoch reached)."""
        reported = [r.get(self.plan.metric) for r in record.results]
        values = [v for v in reported if _finite(v)]
        if not values:
            return None
        return max(values) if self.plan.mode == "max" else min(values)

    # --- summaries ----------------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        skipped = sum(len(self.plan.seeds) for cell in self.plan.cells if self.skip_reason(cell))
        finished = sum(self._outcomes.values())
        return {"planned": self.plan.tuning_trials + self.plan.replicate_trials, "skipped": skipped,
                "issued": len(self.records), "running": len(self.records) - finished,
                **{o.value: n for o, n in self._outcomes.items()}}

    def best_per_cell(self) -> dict[str, float | None]:
        return {cell.key: max((cast(float, self._value(r)) for r in self.issued(cell, "tune") + self.replicates(cell)
                               if _finite(self._value(r))), default=None) for cell in self.plan.cells}

    def tuning_best(self, cell: Cell) -> float | None:
        """The best dev score of the cell's tuning trials (the report's tuning table shows it)."""
        values = [v for v in map(self._value, self.issued(cell, "tune")) if _finite(v)]
        if not values:
            return None
        return max(values) if self.plan.mode == "max" else min(values)

    def replicates_mean(self, cell: Cell) -> float | None:
        """The mean over the cell's finished replicates of each run's best dev score (what the report's dev
        selection compares)."""
        values = [v for v in map(self._value, self.replicates(cell)) if _finite(v)]
        return sum(values) / len(values) if values else None


def _finite(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and math.isfinite(value)
