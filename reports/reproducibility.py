"""The paper's reproducibility section: every item of ACL's Responsible NLP checklist (B1, B2, B6,
C1-C4) and of the NeurIPS paper checklist (4-8, 12) that a study can answer, answered from its record
(plan, data and model hashes, versions, the search), its MLflow runs (parameters, chosen values,
seeds, scores, wall time and machines) and the report's own statistics. Nothing is typed by hand: an
answer the record cannot give says so (`not recorded`), naming what would record it.

`items()` returns the answers as data (`reproducibility.json`, which the tests check against the
study); `to_markdown` and `to_latex` render them for report.md, reproducibility.md and an appendix."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

import pandas as pd

from reports.compute import hardware, hours, spent, study_resources, study_trials
from reports.environment import KEY_PACKAGES
from reports.evp import NAMES as ESTIMATORS
from reports.evp import tuning_budget
from search_spaces.optuna_samplers import OBJECTIVES, SAMPLER_CLASSES, STARTUP_SAMPLERS, hyperband_brackets

NOT_RECORDED = "not recorded"
UNICODE_LATEX = {"…": r"\ldots{}", "α": r"$\alpha$", "≤": r"$\leq$", "≥": r"$\geq$", "∞": r"$\infty$", "σ": r"$\sigma$"}
SOFTWARE = ("python", *KEY_PACKAGES)
DISTRIBUTIONS = {"LogUniform": "log-uniform on [{low}, {high}]", "Uniform": "uniform on [{low}, {high}]",
                 "IntRange": "integers in [{low}, {high}]", "Choice": "one of {values}",
                 "Grid": "every one of {values}", "Fixed": "fixed at {value}"}


@dataclass(frozen=True)
class Item:
    """One checklist answer: which items it answers, the question, the answer as a sentence or two,
    the facts behind it (checked by the tests) and an optional detail table (header row first)."""

    key: str
    checklists: tuple[str, ...]
    question: str
    answer: str
    facts: dict = field(default_factory=dict)
    tables: list[list[list[str]]] = field(default_factory=list)  # detail tables, each header row first


def items(runs, summary: pd.DataFrame, stats: pd.DataFrame) -> list[Item]:
    record = runs.record
    return [models_item(runs, summary), data_item(record), search_item(runs), budget_item(runs),
            seeds_item(runs, summary), tests_item(runs, stats), software_item(record), hardware_item(runs),
            compute_item(runs), code_item(runs)]


def _missing(what: str) -> str:
    return f"{NOT_RECORDED}: the study ran before the orchestrator recorded {what}; a launch with this version does"


def models_item(runs, summary: pd.DataFrame) -> Item:
    record = runs.record
    models = [m.model_dump() for m in record.models] if record is not None else []
    params = {}
    if not summary.empty and "params" in summary:
        params = {row.cell: int(row.params) for row in summary.itertuples() if not math.isnan(row.params)}
    if not models:
        return Item("models", ("ACL B1", "ACL B2", "ACL C1", "NeurIPS 12"), "Which models, from where, under which "
                    "license, and how many parameters?", _missing("the models' sources and hashes"),
                    {"params": params})
    described = "; ".join(f"{m['name']} ({m['source']}, {m['architecture'] or 'transformers'} with {m['depth']} "
                          f"layers, license: {m['license'] or 'none stated in the model folder'})" for m in models)
    counted = ", ".join(f"{cell}: {count / 1e6:.2f} M" for cell, count in params.items())
    table = [["Model", "Source", "License", "Layers", "Weights (sha256)"]] + [
        [m["name"], m["source"], m["license"] or "none stated", str(m["depth"]),
         "; ".join(f"{f['path']} {f['sha256']}" for f in m["files"]) or "—"] for m in models]
    counts = [["Cell", "Parameters"]] + [[cell, f"{count:,}"] for cell, count in params.items()]
    return Item("models", ("ACL B1", "ACL B2", "ACL C1", "NeurIPS 12"),
                "Which models, from where, under which license, and how many parameters?",
                f"{described}. Parameters of the truncated encoder per cell: {counted or 'no completed run'}.",
                {"models": models, "params": params}, [table, counts])


def used_rows(record, split: str, rows: int) -> int:
    """A split's rows the trials read: the study's cap (`data.max_train_samples` for train,
    `data.max_eval_samples` for dev and test), else all of them."""
    cap = record.base.get("max_train_samples" if split == "train" else "max_eval_samples")
    return min(rows, int(cap)) if cap else rows


def data_item(record) -> Item:
    data = [d.model_dump() for d in record.data] if record is not None else []
    question = "Which data sets, from where, under which license, with which splits and sizes?"
    checklists = ("ACL B1", "ACL B2", "ACL B6", "NeurIPS 5", "NeurIPS 12")
    if not data:
        return Item("data", checklists, question, _missing("data hashes"))
    parts, table = [], [["Data set", "Split", "Rows", "Used", "sha256 of its rows", "Read from"]]
    files = [["Data set", "File", "Bytes", "sha256"]]
    for d in data:
        name = d["name"] + (f"/{d['language']}" if d["language"] else "")
        used = {split: used_rows(record, split, s["rows"]) for split, s in d["splits"].items()}
        for split, s in d["splits"].items():
            s["used"] = used[split]
        sizes = ", ".join(f"{split} {used[split]:,} of {s['rows']:,}" for split, s in d["splits"].items())
        license_line = _first_line(d["license"]) or "none stated beside the data"
        checked = {True: "; every file matches the sha256 its PROVENANCE.md lists",
                   False: "; a file differs from the sha256 its PROVENANCE.md lists", None: ""}[d["provenance_match"]]
        title = f" ({d['title']})" if d["title"] else ""
        parts.append(f"{name}{title}, read from {d['origin']}; license: {license_line}{checked}; pairs used: {sizes}")
        table += [[name, split, f"{s['rows']:,}", f"{used[split]:,}", s["sha256"], s["source"]]
                  for split, s in d["splits"].items()]
        files += [[name, f["path"], f"{f['bytes']:,}", f["sha256"]] for f in d["files"]]
    return Item("data", checklists, question, ". ".join(parts) + ".", {"data": data},
                [table] + ([files] if len(files) > 1 else []))


def _first_line(text: str) -> str:
    line = next((line.strip(" -*") for line in text.splitlines() if line.strip(" -*")), "")
    return line.replace("**", "").rstrip(".")  # the sentence it goes into punctuates it


def describe_space(written: str) -> str:
    """`LogUniform(low=2e-05, high=0.0002)` (the record's form) as `log-uniform on [2e-05, 0.0002]`."""
    found = re.fullmatch(r"(\w+)\((.*)\)", written)
    if not found or found.group(1) not in DISTRIBUTIONS:
        return written
    fields = dict(re.findall(r"(\w+)=(\([^)]*\)|[^,]+)", found.group(2)))
    try:
        return DISTRIBUTIONS[found.group(1)].format(**{k: v.strip() for k, v in fields.items()})
    except KeyError:
        return written


def in_effect(defaults: dict) -> dict:
    """The defaults a reader needs to rerun the study: not those left unset (None), nor the settings of a
    feature the study left off (`pretrain_steps` while `pretrain` is None or False): they change nothing."""
    off = [name for name, value in defaults.items() if value is None or value is False]
    return {name: value for name, value in defaults.items()
            if value is not None and not any(name.startswith(f"{feature}_") for feature in off)}


def chosen_values(runs) -> dict[str, dict]:
    """Each cell's tuned values as its replicates ran them (the config its tuning selected on dev)."""
    replicates = runs.replicates()
    out = {}
    for cell, group in replicates.groupby("cell", sort=False):
        done = group[group.outcome == "completed"]
        first = (done if len(done) else group).iloc[0]
        out[cell] = {name: _plain(first[name]) for name in runs.tuned if name in group}
    return out


def _plain(value):
    return value.item() if hasattr(value, "item") else value


def search_item(runs) -> Item:
    record = runs.record
    question = "How were hyperparameters searched (method, space, trials) and which values were chosen?"
    checklists = ("ACL C2", "NeurIPS 6")
    fixed = {k: v for k, v in (record.base if record is not None else {}).items()
             if k not in ("task", "model", "language", "data_dir", "num_threads", "device", "cache_dir")}
    defaults = dict(record.defaults) if record is not None else {}
    shown = in_effect(defaults)
    fixed_text = ", ".join(f"{k} {v}" for k, v in fixed.items()) + (
        "; the trainable's defaults for the rest: " + ", ".join(f"{k} {v}" for k, v in shown.items()) +
        (f" ({len(defaults) - len(shown)} more that are off or unused, in reproducibility.json)"
         if len(shown) < len(defaults) else "") if defaults else "")
    if record is None or not record.tuned:
        return Item("search", checklists, question, f"No search: every cell ran the study's fixed configuration "
                    f"({fixed_text}); cells differ only in their ablated values.", {"tuned": {}, "fixed": fixed})
    search = record.search
    if not search:
        return Item("search", checklists, question, _missing("the search settings"),
                    {"tuned": dict(record.tuned), "fixed": fixed})
    space = "; ".join(f"{name} {describe_space(text)}" for name, text in record.tuned.items())
    sampler = sampler_text(search, any(text.startswith(("Choice", "Fixed")) for text in record.tuned.values()))
    pruner = pruner_text(search, runs.round_name, record.cell_reports or [record.epochs])
    chosen = chosen_values(runs)
    picked = "; ".join(f"{cell}: " + ", ".join(f"{k} {_short(v)}" for k, v in values.items())
                       for cell, values in chosen.items())
    several = search.get("objectives") or []
    choice = (objectives_text(several, runs.metric, runs.mode) if len(several) > 1 else
              f"The cell's trial with the best {runs.metric} among the fully trained ones was chosen")
    answer = (f"Per ablation cell, {search['trials']} trials of {sampler} over {space}, with {pruner}; every "
              f"tuning trial trained with seed {search['seed']}, never a replicate seed. {choice} (dev only; test "
              f"is never seen by the search). Fixed for every trial: {fixed_text}. Chosen: "
              f"{picked or 'no cell finished its tuning'}.")
    table = [["Cell", *runs.tuned]] + [[cell, *(_short(values.get(k)) for k in runs.tuned)]
                                        for cell, values in chosen.items()]
    return Item("search", checklists, question, answer,
                {"tuned": dict(record.tuned), "search": dict(search), "chosen": chosen, "fixed": fixed,
                 "defaults": defaults}, [table])


SAMPLER_NAMES = {"tpe": "TPE", "random": "random search", "gp": "Gaussian-process Bayesian "
                 "optimisation", "cmaes": "CMA-ES", "qmc": "quasi-Monte Carlo search", "bruteforce": "brute force",
                 "nsga2": "NSGA-II"}


def objectives_text(objectives: list[str], metric: str, mode: str = "max") -> str:
    """How a multi-objective cell chose its replicated trial, naming each objective and its direction."""
    dev = f"{metric} ({'maximised' if mode == 'max' else 'minimised'})"
    named = [dev if name == "dev" else f"{OBJECTIVES[name][0]} (minimised)" if name in OBJECTIVES else name
             for name in objectives]
    return (f"Each cell's Optuna study optimised {len(objectives)} objectives, {', '.join(named)}, and kept its "
            f"Pareto set (the report's frontier table); the cell's Pareto trial with the best {metric} was chosen, "
            f"a tie going to the better value of the next objective, then to the trial asked first")


def sampler_text(search: dict, has_choices: bool = False) -> str:
    """The sampler by its name, Optuna's class and every setting it was built with."""
    name = search["sampler"]
    settings = [f"seed {search['sampler_seed']} plus the cell's index"]
    if name in STARTUP_SAMPLERS:
        settings.append(f"the first {search['startup_trials']} trials random")
    if name == "cmaes" and has_choices:
        settings.append("lists of values drawn at random")
    if name == "qmc":
        settings.append(f"a scrambled {search.get('qmc_type', 'sobol').capitalize()} sequence")
    if name == "bruteforce":
        settings.append("each configuration at most once, in an order the seed shuffles")
    if name == "nsga2":
        settings.append(f"population {search.get('population_size', 50)} per generation, the first drawn at random")
    return f"{SAMPLER_NAMES.get(name, name)} (Optuna's `{SAMPLER_CLASSES.get(name, name)}`, {', '.join(settings)})"


def pruner_text(search: dict, round_name: str, cell_reports: list[int]) -> str:
    """The pruner by its name, Optuna's class and its settings (Hyperband: its brackets per cell length)."""
    name, grace, eta = search["scheduler"], search["grace_epochs"], search["reduction_factor"]
    rounds = f"{grace} {round_name}{'s' if grace != 1 else ''}"
    if name == "asha":
        return (f"asynchronous successive halving inside each cell (Optuna's `SuccessiveHalvingPruner`, first rung "
                f"after {rounds}, reduction factor {eta})")
    if name == "hyperband":
        brackets = ", ".join(f"{len(hyperband_brackets(full, grace, eta))} for {full} {round_name}s"
                             for full in sorted(set(cell_reports)))
        return (f"Hyperband inside each cell (Optuna's `HyperbandPruner`, min_resource {rounds}, max_resource the "
                f"cell's {round_name}s, reduction factor {eta}; brackets: {brackets}; a trial's bracket follows from "
                f"its cell's Optuna study name and its number)")
    return "no pruning"


def _short(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if value != 0 and (abs(value) < 1e-2 or abs(value) >= 1e4) else f"{value:g}"
    return str(value)


def budget_item(runs) -> Item:
    budget = tuning_budget(runs)
    question = "What tuning budget did each arm get, and what does more tuning buy (Dodge et al. 2019)?"
    if budget.empty:
        return Item("budget", ("ACL C2",), question, "No tuning: the cells ran without a search.", {"budget": {}})
    per_cell = {row.cell: {"trials": int(row.trials), "trial_epochs": float(row.trial_epochs),
                           "expected_best": float(row.expected_best)} for row in budget.itertuples()}
    estimator = runs.report.get("expected_max", "with_replacement")
    listed = "; ".join(f"{cell}: {v['trials']} trial{'s' if v['trials'] != 1 else ''}, {v['trial_epochs']:g} "
                       f"trial-{runs.round_name}s, " + (f"expected best dev {v['expected_best']:.2f}"
                                                        if math.isfinite(v["expected_best"]) else "none completed")
                       for cell, v in per_cell.items())
    rising = list(budget.cell[budget.rising])
    few = list(budget.cell[budget.too_few])
    return Item("budget", ("ACL C2",), question,
                f"{listed} (expected best dev at the trials that completed, {ESTIMATORS[estimator]}; the tuning "
                f"budget table and expected_dev_by_trials.png give every n)" +
                (f"; still rising at the budget spent: {', '.join(rising)}" if rising else "") +
                (f"; too few completed trials to tell whether still rising: {', '.join(few)}" if few else "") + ".",
                {"budget": per_cell, "estimator": estimator, "rising": rising, "too_few": few})


def seeds_item(runs, summary: pd.DataFrame) -> Item:
    record = runs.record
    seeds = list(record.seeds) if record is not None else []
    n = {row.cell: int(row.n) for row in summary.itertuples()} if not summary.empty else {}
    counts = sorted(set(n.values()))
    tuning_seed = (record.search or {}).get("seed") if record is not None else None
    listed = ", ".join(map(str, seeds))
    answer = (f"Each cell's chosen configuration was trained again with each replicate seed ({listed}"
              f"; n = {', '.join(map(str, counts)) or '0'} completed per cell); the seed sets every random stream "
              "of training (initialisation of new weights, data order, dropout). Tables report the mean ± the sample "
              "standard deviation (ddof = 1) of the test score over those seeds: a spread of runs, not a standard "
              "error or a confidence interval; test is scored once per run, with its best-dev epoch's weights."
              + (f" Tuning trials used seed {tuning_seed}." if tuning_seed is not None else ""))
    return Item("seeds", ("ACL C3", "NeurIPS 7"), "How many runs does each number average, and what is the ±?",
                answer, {"seeds": seeds, "n": n, "spread": "sample standard deviation (ddof=1)",
                         "tuning_seed": tuning_seed})


def tests_item(runs, stats: pd.DataFrame) -> Item:
    from reports.bootstrap import BOOTSTRAP_SAMPLES
    from reports.power import CONFIDENCE, _range, _span, tested
    from reports.significance import CORRECTIONS, LEVEL, MIN_SEEDS, SEED_TESTS

    question = "Which statistical tests, at which level, corrected how?"
    baseline = runs.report.get("baseline")
    if not baseline or stats.empty:
        return Item("tests", ("ACL C3", "NeurIPS 7"), question, "No significance test: the study names no "
                    "report.baseline to compare against.", {"test": None})
    test = runs.report.get("seed_test", "t")
    alpha = float(runs.report.get("alpha", LEVEL))
    correction = runs.report.get("correction", "holm")
    paired = int(stats.paired_p.notna().sum())
    known = tested(stats)
    power = (f" With the observed spread, the paired t-test at this n detects differences of "
             f"{_range(known.detectable_80)} points with 80 % power, "
             f"{_span(known.detectable_80_low, known.detectable_80_high)} over σ's {CONFIDENCE * 100:g} % confidence "
             "interval (stats.csv)." if len(known) else "")
    family = (f"over the table's {paired} paired comparisons" if paired else
              f"(no comparison had the {MIN_SEEDS} paired seeds a test over seeds needs, so none is marked)")
    answer = (f"Each cell against the baseline of its row ({', '.join(f'{k}={v}' for k, v in baseline.items())}): "
              f"the {SEED_TESTS[test]} over seeds (pairs: the same seed in both cells"
              + ("; it assumes roughly normal paired differences" if test == "t" else "") +
              f") and a paired bootstrap over test pairs ({BOOTSTRAP_SAMPLES} resamples), two-sided, at α = "
              f"{alpha:g}, p-values " + (f"{CORRECTIONS[correction]}-corrected " if correction != "none" else
                                          "uncorrected ") + family + "." + power + beyond_tests(stats))
    return Item("tests", ("ACL C3", "NeurIPS 7"), question, answer,
                {"test": SEED_TESTS[test], "alpha": alpha, "correction": correction, "comparisons": paired,
                 "bootstrap": BOOTSTRAP_SAMPLES,
                 "rope": float(stats.rope.iloc[0]) if "rope" in stats else None,
                 "aso_comparisons": int(stats.aso_comparisons.iloc[0]) if "aso_comparisons" in stats else None})


def beyond_tests(stats) -> str:
    """The report's other answers to "is this cell better?" where the study asked for them (`report.rope`,
    `report.aso`), in a sentence each."""
    from reports.bootstrap import BOOTSTRAP_SAMPLES
    from reports.equivalence import EQUIVALENT
    from reports.stochastic_order import LEVEL as ASO_LEVEL

    sentences = []
    if "multibootstrap_p" in stats and stats.multibootstrap_p.notna().any():
        sentences.append("The Multi-Bootstrap's p (Sellam et al. 2022: seeds and test pairs resampled jointly, "
                         f"{BOOTSTRAP_SAMPLES} resamples) is in stats.csv for "
                         f"{int(stats.multibootstrap_p.notna().sum())} comparisons, not marked.")
    if "rope" in stats:
        sentences.append(f"Practical equivalence within ±{float(stats.rope.iloc[0]):g} points (report.rope): the "
                         "Bayesian correlated t-test over the paired seeds (Benavoli et al. 2017, ρ = 0), ≈ where "
                         f"P(equivalent) ≥ {EQUIVALENT:g}.")
    if "aso_comparisons" in stats:
        m = int(stats.aso_comparisons.iloc[0])
        confidence = ASO_LEVEL + (1 - ASO_LEVEL) / m if m > 1 else ASO_LEVEL
        sentences.append(f"Almost Stochastic Order (report.aso; Dror et al. 2019, deepsig's computation): ε_min "
                         f"both ways at confidence {confidence:.4g} for each of {m} comparison"
                         f"{'s' if m != 1 else ''} from 1,000 bootstrap resamples, ≻ where ε_min < 0.2.")
    return "".join(f" {sentence}" for sentence in sentences)


def software_item(record) -> Item:
    found = dict(record.provenance) if record is not None else {}
    versions = {name: found[name] for name in SOFTWARE if name in found}
    question = "Which software, at which versions, and which code?"
    if not versions or "commit" not in found:
        return Item("software", ("ACL C4", "NeurIPS 4"), question, _missing("package versions and the commit"),
                    {"versions": versions})
    dirty = {"yes": " with uncommitted changes", "no": "", "unknown": ""}.get(found.get("dirty", "unknown"), "")
    listed = ", ".join(f"{name} {version}" for name, version in versions.items())
    answer = (f"{listed}; ablation-orchestrator at commit {found['commit']}{dirty}. environment.txt (in the study "
              "folder, on the MLflow parent run and in the bundle) pins every installed distribution.")
    return Item("software", ("ACL C4", "NeurIPS 4"), question, answer,
                {"versions": versions, "commit": found["commit"], "dirty": found.get("dirty")},
                [[["Package", "Version"]] + [[name, version] for name, version in versions.items()]])


def hardware_item(runs) -> Item:
    trials = study_trials(runs)
    machines = hardware(trials) if not trials.empty else {}
    resources = study_resources(runs)
    held = f"{resources.get('cpu', 1):g} CPU(s)" + (f" and {resources.get('gpu'):g} GPU(s)"
                                                    if resources.get("gpu") else ", no GPU")
    question = "On what hardware did the trials run?"
    fused = fusion_text(runs.record.fusion if runs.record is not None else [], trials)
    figures = {"resources": resources, **({"fusion": runs.record.fusion} if fused else {})}
    if not machines:
        return Item("hardware", ("ACL C1", "NeurIPS 8"), question,
                    f"Each trial held {held}; " + _missing("the trials' machines") + fused, figures)
    shown = "; ".join(f"{k.replace('_', ' ')}: {', '.join(v)}" for k, v in machines.items())
    return Item("hardware", ("ACL C1", "NeurIPS 8"), question,
                f"Each trial held {held} (resources). The trials' workers reported {shown}.{fused}",
                {**figures, "machines": machines})


def fusion_text(fusion: list[dict], trials: pd.DataFrame | None = None) -> str:
    """How the replicates trained when some trained as fused arrays (`resources.fuse`); empty when none did. With
    `auto`'s probe, what it measured (the members' `fuse_probe_gain`) and how many members trained fused."""
    fused = [f for f in fusion if int(f.get("members", 1)) > 1]
    if not fused:
        return ""
    measured = ""
    if trials is not None and "fuse_probe_gain" in trials:
        gains = pd.to_numeric(trials.fuse_probe_gain, errors="coerce").dropna()
        members = trials["fused_members"] if "fused_members" in trials else pd.Series(1, index=trials.index)
        together = pd.to_numeric(members, errors="coerce").fillna(1) > 1
        if len(gains):
            measured = (f" Each array first measured its members fused against one alone (auto's probe): "
                        f"{gains.min():.2f}–{gains.max():.2f}× the pairs/s of the same members one after another "
                        f"(fused at 1.2× or more); {int(together.sum())} of {len(trials)} trials ended their last "
                        "round fused.")
    largest = max(int(f["members"]) for f in fused)
    why = "; ".join(dict.fromkeys(str(f["why"]) for f in fused))
    cells = "every cell" if len(fused) == len(fusion) else f"{len(fused)} of {len(fusion)} cells"
    which = "replicates and tuning trials" if all(f.get("tuning") for f in fused) else "replicates"
    return (f" The {which} of {cells} trained in fused arrays of up to {largest} members ({why}): one stacked "
            "model in one process holding one trial's resources, each member its own data order, dropout masks, "
            f"optimizer and checkpoint; a member's wall time is its share of its array's.{measured}")


def compute_item(runs) -> Item:
    trials = study_trials(runs)
    resources = study_resources(runs)
    question = "How much compute did the study take, in all and per phase, and how much went to pruned trials?"
    if trials.empty or "wall_s" not in trials or pd.to_numeric(trials.wall_s, errors="coerce").isna().all():
        return Item("compute", ("ACL C1", "NeurIPS 8"), question, _missing("the trials' wall times"), {})
    table = spent(trials, resources).set_index(["cell", "phase"])
    total, tune, rep = (table.loc[("total", p)] for p in ("all", "tune", "replicate"))
    figures = {"cpu_hours": float(total.cpu_hours), "gpu_hours": float(total.gpu_hours),
               "tune_cpu_hours": float(tune.cpu_hours), "replicate_cpu_hours": float(rep.cpu_hours),
               "pruned_cpu_hours": float(total.pruned_cpu_hours), "trials": int(total.trials)}
    gpu = f", {hours(total.gpu_hours)} GPU-hours" if resources.get("gpu") else ""
    answer = (f"{hours(total.cpu_hours)} CPU-hours{gpu} over {int(total.trials)} trials, every trial counted "
              f"(failed and pruned ones included): tuning {hours(tune.cpu_hours)}, replicates {hours(rep.cpu_hours)}; "
              f"{hours(total.pruned_cpu_hours)} CPU-hours went to pruned trials. Per cell: the compute table and "
              "compute.csv.")
    estimate = runs.record.estimate if runs.record is not None else None
    if estimate:
        answer += (f" Estimated before the launch: {hours(estimate['trial_hours'])} trial-hours; spent "
                   f"{hours(total.wall_hours)}.")
        figures["estimated_trial_hours"] = float(estimate["trial_hours"])
    return Item("compute", ("ACL C1", "NeurIPS 8"), question, answer, figures)


def code_item(runs) -> Item:
    on_gpu = bool(study_resources(runs).get("gpu"))
    same_seed = (" The trials held GPUs, whose kernels are not all deterministic: a rerun of the same seed may "
                 "differ a little, and `orchestrator verify REPORT --rerun N` reruns N replicates and sets each "
                 "difference against the cell's seed-to-seed spread (on an H200, a MiniLM epoch in bf16 differed "
                 "by up to 4 % of that spread, in fp32 not at all: docs, reproducibility)." if on_gpu else
                 " The trials ran on CPUs, where a rerun of the same seed gives the same numbers (same-seed "
                 "variation 0; `orchestrator verify REPORT --rerun N` checks N replicates).")
    return Item("code", ("NeurIPS 4", "NeurIPS 5"), "How can a reader rerun a reported number?",
                "`orchestrator report NAME --bundle` writes the study file, its record, this report, the locked "
                "environment and the data hashes into one archive; `orchestrator reproduce REPORT --cell CELL "
                "--seed SEED` reruns one replicate from it (the data hashes checked first) and prints the reported "
                "and the recomputed dev and test scores side by side. The bundle's README says how for every "
                "cell." + same_seed,
                {"command": "orchestrator reproduce", "same_seed_variation": "measured by verify --rerun" if on_gpu
                 else "none on CPUs"})


def to_json(found: list[Item]) -> list[dict]:
    return [asdict(item) for item in found]


def to_markdown(found: list[Item], name: str) -> list[str]:
    """The `## Reproducibility` section: one row per checklist answer, then the detail tables."""
    lines = ["## Reproducibility", "",
             f"Answers to the ACL Responsible NLP and NeurIPS checklists, read from the record, the journal and the "
             f"MLflow runs of {name} (nothing typed by hand; `reproducibility.json` holds the facts).", "",
             "| Checklist | Question | Answer |", "|---|---|---|"]
    lines += [f"| {', '.join(i.checklists)} | {i.question} | {_cell(i.answer)} |" for i in found]
    for item in found:
        for number, (header, *rows) in enumerate(item.tables):
            title = f"**{item.key.capitalize()}**" if number == 0 else ""
            lines += ["", *([title, ""] if title else []), "| " + " | ".join(header) + " |",
                      "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    data = next((i for i in found if i.key == "data"), None)
    for d in (data.facts.get("data", []) if data else []):
        if d["license"]:
            lines += ["", f"**License of {d['name']}** (from {d['provenance_file']})", "",
                      *[f"> {line}" for line in d["license"].splitlines()]]
    return lines + [""]


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def to_latex(found: list[Item]) -> str:
    """An appendix section: one paragraph per answer (hashes shortened; the bundle has them in full)."""
    from reports.latex import prose

    lines = [r"\section*{Reproducibility}"]
    for item in found:
        answer = re.sub(r"\b([0-9a-f]{12})[0-9a-f]{28,}\b", r"\1…", item.answer)
        text = prose(answer).replace("`", "")
        for character, command in UNICODE_LATEX.items():
            text = text.replace(character, command)
        lines.append(rf"\paragraph{{{prose(item.question)}}} ({prose(', '.join(item.checklists))}) " + text)
    return "\n".join(lines) + "\n"
