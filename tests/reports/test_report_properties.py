"""No study a user can launch ends its report in a traceback: run tables generated for every
registered kind (NaN, missing columns, degenerate, failed, pruned, running, superseded-looking
duplicates, any tuned key, cells with no finished replicate) always build, and a second build from
the same runs agrees with the first line for line, as `orchestrator verify` checks."""

from __future__ import annotations

import itertools
import math
import os
import tempfile
from pathlib import Path

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reports.build import build_report
from reports.collect import StudyRuns
from reports.verify import compare_folders
from trainables.kinds import KINDS, load_kind

# the primary dev metric each kind's evaluators can name (STS tasks; MRPC's accuracy or F1)
METRICS = {"finetune": ["dev_spearman", "dev_accuracy", "dev_f1"], "cross_encoder": ["dev_spearman"]}
SUITE = ["sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sick", "suite_avg"]
AXES = {"layer": [0, 1, 3, 6, 12], "pooling": ["mean", "cls", "max"], "mode": ["self", "teacher", "mutual"],
        "language": ["de", "ko"]}
TUNED_NAMES = ["lr", "bi_lr", "warmup_ratio", "weight_decay", "cross_lr", "pooling_dim"]
OUTCOMES = ["completed", "completed", "completed", "failed", "diverged", "pruned", None]

values = st.one_of(st.floats(-100, 100, allow_nan=False), st.just(math.nan), st.none())
tuned_values = st.one_of(st.floats(1e-6, 1.0), st.integers(0, 512), st.sampled_from(["mean", "cls"]), st.none())


@st.composite
def study_runs(draw) -> StudyRuns:
    kind = draw(st.sampled_from(list(KINDS)))
    metric = draw(st.sampled_from(METRICS.get(kind, ["dev_spearman"])))
    test = metric.replace("dev_", "test_", 1)
    axes = draw(st.lists(st.sampled_from(list(AXES)), max_size=2, unique=True))
    levels = {a: draw(st.lists(st.sampled_from(AXES[a]), min_size=1, max_size=3, unique=True)) for a in axes}
    cells = [dict(zip(axes, combo, strict=True)) for combo in itertools.product(*levels.values())]
    tuned = draw(st.lists(st.sampled_from(TUNED_NAMES), max_size=2, unique=True))
    seeds = draw(st.integers(1, 4))
    rows = []
    for index, cell in enumerate(cells):
        key = " ".join(f"{k}={v}" for k, v in cell.items()) or "all"
        phases = draw(st.sampled_from([("replicate",), ("tune",), ("tune", "replicate"), ()]))
        for phase in phases:
            count = seeds if phase == "replicate" else draw(st.integers(1, 3))
            for n in range(count):
                seed = draw(st.sampled_from([n, n, 0])) if phase == "replicate" else 10_000  # duplicates too
                row = {"run_id": f"r{index}-{phase}-{n}", "trial_key": f"c{index}-{phase[0]}{n}", "cell": key,
                       "phase": phase, "seed": seed, "outcome": draw(st.sampled_from(OUTCOMES)),
                       "status": "FINISHED", "error": draw(st.sampled_from([None, "OSError: disk full", ""])),
                       **cell, **{name: draw(tuned_values) for name in tuned}}
                for name in (f"best_{metric}", test, "test_pearson", "params", "epoch", "best_epoch", "degenerate",
                             "stage_seed"):
                    if draw(st.booleans()):
                        row[name] = draw(values)
                if kind == "contrastive" and draw(st.booleans()):
                    row.update({f"test_{s}_spearman": draw(values) for s in SUITE})
                if kind == "distill" and draw(st.booleans()):
                    for cycle in (1, 2):
                        row[f"cycle{cycle}_dev_spearman"] = draw(values)
                        row[f"cycle{cycle}_{draw(st.sampled_from(['cross_', 'partner_']))}dev_spearman"] = draw(values)
                rows.append(row)
    columns = ["run_id", "trial_key", "cell", "phase", "seed", "outcome", "status", "error", *axes, *tuned]
    frame = pd.DataFrame(rows, columns=None if rows else columns)
    baseline_axis = "layer" if "layer" in axes else (axes[-1] if axes else None)
    report: dict = {"seed_test": draw(st.sampled_from(["t", "wilcoxon", "permutation"])),
                    "correction": draw(st.sampled_from(["holm", "bonferroni", "none"]))}
    if baseline_axis and draw(st.booleans()):
        report["baseline"] = {baseline_axis: draw(st.sampled_from(["last", *levels[baseline_axis]]))}
    planned = [(" ".join(f"{k}={v}" for k, v in c.items()) or "all", c) for c in cells]
    if draw(st.booleans()):  # a planned cell no run ever reached
        planned.append(("layer=99" if "layer" in axes else "extra", {a: AXES[a][-1] for a in axes}))
    return StudyRuns(f"prop_{kind}", frame, axes, metric, report, planned_seeds=seeds, tuned=tuned,
                     planned_cells=planned, round_name=load_kind(KINDS[kind]).round_name,
                     replicate=draw(st.sampled_from([{}, {"until": {"dev_ci95": 0.5}, "max_seeds": 6}])))


@settings(max_examples=int(os.environ.get("REPORT_EXAMPLES", "30")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(study_runs())
def test_any_run_table_builds_a_report_that_verify_agrees_with(runs):
    with tempfile.TemporaryDirectory() as folder:
        first, second = Path(folder) / "report", Path(folder) / "again"
        build_report(runs, first, ("markdown", "latex", "csv"))
        build_report(runs, second, ("markdown", "latex", "csv"))
        assert (first / "report.md").exists()
        assert compare_folders(first, second, runs.test_metric) == []
