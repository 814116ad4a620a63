"""The study file's `tune.sampler` and `tune.scheduler` names as Optuna's own samplers and pruners, and its
`tune.objectives` as the directions of each cell's Optuna study.

Every decision (which configuration next, which trial stops, which trials form the Pareto set) is the
library's: each name is one Optuna class built with the settings the study gives, nothing rewritten.
`space_problems` says, before launch, where a sampler cannot search a space the way its name promises, and
`objective_problems` where the objectives and the sampler or pruner do not go together. Optuna is imported
only when a sampler or pruner is built, so `validate` and `plan` stay light.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import TYPE_CHECKING

from search_spaces.params import Choice, IntRange, LogUniform, Param, Uniform
from trainables.errors import UserInputError

if TYPE_CHECKING:
    from optuna.pruners import BasePruner
    from optuna.samplers import BaseSampler

SAMPLERS = ("tpe", "random", "gp", "cmaes", "qmc", "bruteforce", "nsga2")
PRUNERS = ("asha", "hyperband", "none")
# the Optuna class behind each name (the reproducibility section names it)
SAMPLER_CLASSES = {"tpe": "TPESampler", "random": "RandomSampler", "gp": "GPSampler", "cmaes": "CmaEsSampler",
                   "qmc": "QMCSampler", "bruteforce": "BruteForceSampler", "nsga2": "NSGAIISampler"}
PRUNER_CLASSES = {"asha": "SuccessiveHalvingPruner", "hyperband": "HyperbandPruner", "none": "NopPruner"}
STARTUP_SAMPLERS = ("tpe", "gp", "cmaes")  # the samplers that draw `startup_trials` at random before modelling
# tune.objectives: what each names (the report and the record say it) and its direction (None: the dev metric's)
OBJECTIVES = {"dev": ("the dev metric", None), "params": ("the parameter count", "minimize")}
SINGLE_OBJECTIVE_SAMPLERS = ("cmaes",)  # Optuna's samplers that optimise one objective only


def make_sampler(name: str, seed: int, startup_trials: int = 3, qmc_type: str = "sobol",
                 population_size: int = 50, constant_liar: bool = False) -> BaseSampler:
    """Optuna's sampler for `tune.sampler: name`, seeded (a cell passes `sampler_seed` plus its index);
    `population_size`: NSGA-II's (`nsga2_population` resolves the study file's); `constant_liar`: TPE's rule
    for suggestions asked while others run (a fused array's members are asked together): a running trial
    counts as the worst seen, so the next suggestion looks elsewhere."""
    import optuna
    from optuna.exceptions import ExperimentalWarning

    samplers = optuna.samplers
    with warnings.catch_warnings():  # QMC and brute force are marked experimental: one warning per cell is noise
        warnings.simplefilter("ignore", ExperimentalWarning)
        if name == "tpe":
            return samplers.TPESampler(seed=seed, n_startup_trials=startup_trials, constant_liar=constant_liar)
        if name == "random":
            return samplers.RandomSampler(seed=seed)
        if name == "gp":
            return samplers.GPSampler(seed=seed, n_startup_trials=startup_trials)
        if name == "cmaes":
            # a choice is always drawn by the independent (random) sampler: said once in the docs and the report
            return samplers.CmaEsSampler(seed=seed, n_startup_trials=startup_trials, warn_independent_sampling=False)
        if name == "qmc":  # scrambled, so that another sampler_seed draws another sequence
            return samplers.QMCSampler(qmc_type=qmc_type, scramble=True, seed=seed)
        if name == "bruteforce":
            return planned_brute_force()(seed=seed)
        if name == "nsga2":
            return samplers.NSGAIISampler(seed=seed, population_size=population_size)
    raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)}, but got sampler={name!r}")


def make_pruner(name: str, grace: int, reduction_factor: int, max_rounds: int) -> BasePruner:
    """Optuna's pruner for `tune.scheduler: name`; `max_rounds`: the rounds a full trial of the cell reports
    (Hyperband's largest resource)."""
    import optuna

    if name == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=grace, reduction_factor=reduction_factor)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=grace, max_resource=max_rounds,
                                              reduction_factor=reduction_factor)
    if name == "none":
        return optuna.pruners.NopPruner()
    raise ValueError(f"scheduler must be one of {', '.join(PRUNERS)}, but got scheduler={name!r}")


def nsga2_population(trials: int, population_size: int | None) -> int:
    """NSGA-II's trials per generation: the study file's, else a quarter of the cell's trials, within 4 to 50
    (Optuna's own default) and at most half of them (at least 2), so that a search of any size breeds for at
    least one generation after its random first one."""
    if population_size is not None:
        return population_size
    return max(2, min(max(4, min(50, trials // 4)), trials // 2))


def objective_directions(objectives: list[str] | tuple[str, ...], mode: str) -> list[str]:
    """Optuna's direction of each of `tune.objectives`: dev in the dev metric's `mode`, the others their own."""
    dev = "maximize" if mode == "max" else "minimize"
    return [OBJECTIVES[name][1] or dev for name in objectives]


def objective_problems(objectives: list[str], sampler: str, scheduler: str, trials: int,
                       population_size: int | None) -> list[UserInputError]:
    """Where `tune.objectives` and the sampler or pruner do not go together, one line each (empty: they do)."""
    problems = []
    written = f"[{', '.join(objectives)}]"
    if "dev" not in objectives:
        problems.append(UserInputError("tune.objectives", written, "list dev among them (e.g. [dev, params]): the "
                                                                   "replicates are chosen by dev, and a search on "
                                                                   "size alone only finds the smallest model"))
    repeated = sorted({name for name in objectives if objectives.count(name) > 1})
    if repeated:
        problems.append(UserInputError("tune.objectives", written, f"{', '.join(repeated)} is listed twice: name "
                                                                   "each objective once"))
    several = len(set(objectives)) > 1
    if several and scheduler != "none":
        problems.append(UserInputError("tune.scheduler", scheduler, f"Optuna cannot prune a study of several "
                                                                    f"objectives (tune.objectives {written}): use "
                                                                    f"scheduler: none (their default)"))
    if several and sampler in SINGLE_OBJECTIVE_SAMPLERS:
        problems.append(UserInputError("tune.sampler", sampler, f"Optuna's {SAMPLER_CLASSES[sampler]} optimises one "
                                                                f"objective and tune.objectives lists "
                                                                f"{len(objectives)}: use nsga2 (their default), tpe, "
                                                                f"gp, random, qmc or bruteforce"))
    if sampler == "nsga2" and population_size is not None and population_size >= trials:
        problems.append(UserInputError("tune.population_size", population_size, f"NSGA-II draws its first "
                                                                                f"generation of population_size "
                                                                                f"trials at random and breeds "
                                                                                f"after it, so with tune.trials "
                                                                                f"{trials} it never would: set it "
                                                                                f"below {trials}, or use sampler: "
                                                                                f"random"))
    return problems


def hyperband_brackets(max_rounds: int, grace: int, reduction_factor: int) -> list[int]:
    """The trial-allocation weight of each of Hyperband's brackets, as Optuna's HyperbandPruner computes them
    (bracket b stops trials first after `grace * reduction_factor**b` rounds; a trial's bracket follows from a
    hash of its study's name and number, in these proportions). Empty: no bracket, nothing is pruned."""
    count = math.floor(math.log(max_rounds / grace, reduction_factor)) + 1 if max_rounds >= 1 else 0
    return [math.ceil(count * reduction_factor ** (count - 1 - b) / (count - b)) for b in range(max(count, 0))]


def space_configurations(params: dict[str, Param]) -> int | None:
    """How many configurations a discrete space holds (None: a continuous range makes it infinite)."""
    total = 1
    for param in params.values():
        if isinstance(param, Uniform | LogUniform):
            return None
        total *= (param.high - param.low + 1 if isinstance(param, IntRange)
                  else len(param.values) if isinstance(param, Choice) else 1)
    return total


def space_problems(sampler: str, trials: int, params: dict[str, Param]) -> list[UserInputError]:
    """Where `sampler` cannot search `params` as its name promises, one line each (empty: it can)."""
    import importlib.util

    problems = []
    if sampler == "cmaes" and importlib.util.find_spec("cmaes") is None:
        problems.append(UserInputError("tune.sampler", sampler, "Optuna's CMA-ES needs the package cmaes: "
                                                                "pip install cmaes"))
    if sampler == "cmaes" and not any(isinstance(p, Uniform | LogUniform | IntRange) for p in params.values()):
        problems.append(UserInputError("tune.sampler", sampler, "CMA-ES searches numeric ranges and tune.params "
                                                                "has only lists of values (Optuna would draw every "
                                                                "trial at random): use tpe, gp, qmc or bruteforce, "
                                                                "or give a range ({loguniform: [a, b]})"))
    if sampler == "bruteforce":
        problems.extend(UserInputError(f"tune.params.{name}", _written(p), f"bruteforce tries every configuration, "
                                       f"and a {_written(p).popitem()[0]} range has endless values: give {name} a "
                                       f"list of values or use another tune.sampler")
                        for name, p in params.items() if isinstance(p, Uniform | LogUniform))
        total = space_configurations(params)
        if total is not None and trials > total:
            problems.append(UserInputError("tune.trials", trials, f"bruteforce tries each of the space's {total} "
                                                                  f"configurations once: set tune.trials to at "
                                                                  f"most {total}"))
    return problems


def _written(param: Param) -> dict:
    return {"uniform" if isinstance(param, Uniform) else "loguniform": [param.low, param.high]}


@functools.cache
def planned_brute_force() -> type:
    """Optuna's BruteForceSampler, its suggestions unchanged, told through ask and tell: the plan's trial count
    ends a cell's search, so the sampler's own stop (`Study.stop`, which only works inside `Study.optimize`
    and would raise on the tell of the space's last configuration) is left out."""
    from optuna.samplers import BruteForceSampler

    class PlannedBruteForceSampler(BruteForceSampler):
        def after_trial(self, study, trial, state, values) -> None:
            return None

    return PlannedBruteForceSampler
