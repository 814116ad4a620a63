"""A probe study's label-free diagnostics in the report: every trial scores every layer and logs each layer's
diagnostics (`layer{k}_dev_rankme`, ...); for each cell, the layer each diagnostic picks from its mean over seeds
and its Spearman with the mean dev scores over the layers, beside the layer dev picks (computed here by hand:
argmax / argmin and scipy's spearmanr)."""

from __future__ import annotations

import pandas as pd
from scipy.stats import spearmanr

from reports.build import build_report
from reports.collect import StudyRuns

DEV = {"mean": [60.0, 72.0, 75.0, 71.0], "cls": [40.0, 50.0, 65.0, 70.0]}  # per pooling, layers 0..3
RANKME = {"mean": [10.0, 30.0, 25.0, 20.0], "cls": [5.0, 8.0, 12.0, 15.0]}
ANISOTROPY = {"mean": [0.9, 0.5, 0.4, 0.6], "cls": [0.99, 0.8, 0.6, 0.3]}
SHOWN = {"mean": "mean", "cls": "CLS"}  # how the report labels the poolings


def probe_runs(with_diagnostics: bool = True) -> StudyRuns:
    rows = []
    for pooling in DEV:
        for seed in (0, 1):
            shift = 0.1 * seed - 0.05  # two seeds whose means are the values above
            best = max(range(4), key=lambda k: DEV[pooling][k])
            row = {"run_id": f"{pooling}{seed}", "trial_key": f"{pooling}-s{seed}", "cell": f"pooling={pooling}",
                   "phase": "replicate", "seed": seed, "outcome": "completed", "status": "FINISHED", "error": None,
                   "pooling": pooling, "dev_spearman": DEV[pooling][best] + shift,
                   "test_spearman": DEV[pooling][best] - 1.0 + shift, "best_layer": best}
            for layer in range(4):
                row[f"layer{layer}_dev_spearman"] = DEV[pooling][layer] + shift
                if with_diagnostics:
                    row[f"layer{layer}_dev_rankme"] = RANKME[pooling][layer] + shift
                    row[f"layer{layer}_dev_anisotropy"] = ANISOTROPY[pooling][layer]
            rows.append(row)
    return StudyRuns("probe", pd.DataFrame(rows), ["pooling"], "dev_spearman", {}, planned_seeds=2)


def test_each_cell_gets_each_diagnostics_pick_and_its_agreement_with_dev(tmp_path):
    build_report(probe_runs(), tmp_path, ("markdown", "latex", "csv"))
    report = (tmp_path / "report.md").read_text()
    table = report.split("**Label-free layer diagnostics on dev")[1].split("\n\n")[1]
    for pooling in DEV:
        dev_pick = max(range(4), key=lambda k: DEV[pooling][k])
        rankme_pick = max(range(4), key=lambda k: RANKME[pooling][k])
        anisotropy_pick = min(range(4), key=lambda k: ANISOTROPY[pooling][k])
        rho_rankme = spearmanr(RANKME[pooling], DEV[pooling]).statistic
        rho_anisotropy = spearmanr([-a for a in ANISOTROPY[pooling]], DEV[pooling]).statistic
        assert (f"| {SHOWN[pooling]} | {dev_pick} | {rankme_pick} ({rho_rankme:+.2f}) | "
                f"{anisotropy_pick} ({rho_anisotropy:+.2f}) |") in table, table
    assert "| mean | 2 | 1 (+0.80) | 2 (+1.00) |" in table  # the numbers above, written out once
    assert (tmp_path / "diagnostics.tex").is_file()


def test_a_study_without_diagnostics_has_no_such_table(tmp_path):
    build_report(probe_runs(with_diagnostics=False), tmp_path, ("markdown", "latex"))
    assert "Label-free layer diagnostics" not in (tmp_path / "report.md").read_text()
    assert not (tmp_path / "diagnostics.tex").exists()
