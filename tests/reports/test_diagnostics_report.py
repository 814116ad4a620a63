"""A probe study's label-free diagnostics in the report: every trial scores every layer and logs, per diagnostic,
the layer it picks and its Spearman with the trial's dev ranking of the layers (the probe's own computation,
checked in tests/trainables/test_diagnostics.py); the report shows them per cell over the seeds: the pick most
of them made and the mean Spearman, beside the layer dev picked."""

from __future__ import annotations

import math

import pandas as pd

from reports.build import build_report
from reports.collect import StudyRuns

# per pooling and seed: best_layer, rankme's pick and rho, anisotropy's pick and rho
LOGGED = {"mean": [(2, 1, 0.8, 2, 1.0), (2, 1, 0.6, 3, 0.9), (2, 3, 0.4, 2, 0.8)],
          "cls": [(3, 3, 1.0, 3, 0.5), (3, 3, 1.0, 3, math.nan), (1, 0, 0.2, 3, 0.7)]}
SHOWN = {"mean": "mean", "cls": "CLS"}  # how the report labels the poolings


def probe_runs(with_diagnostics: bool = True) -> StudyRuns:
    rows = []
    for pooling, seeds in LOGGED.items():
        for seed, (best, rankme, rankme_rho, anisotropy, anisotropy_rho) in enumerate(seeds):
            row = {"run_id": f"{pooling}{seed}", "trial_key": f"{pooling}-s{seed}", "cell": f"pooling={pooling}",
                   "phase": "replicate", "seed": seed, "outcome": "completed", "status": "FINISHED", "error": None,
                   "pooling": pooling, "dev_spearman": 70.0 + seed, "test_spearman": 69.0 + seed,
                   "best_layer": best}
            if with_diagnostics:
                row.update({"dev_rankme_pick": rankme, "dev_rankme_rho": rankme_rho,
                            "dev_anisotropy_pick": anisotropy, "dev_anisotropy_rho": anisotropy_rho})
            rows.append(row)
    return StudyRuns("probe", pd.DataFrame(rows), ["pooling"], "dev_spearman", {}, planned_seeds=3)


def test_each_cell_gets_the_pick_most_seeds_made_and_their_mean_agreement(tmp_path):
    build_report(probe_runs(), tmp_path, ("markdown", "latex", "csv"))
    report = (tmp_path / "report.md").read_text()
    table = report.split("**Label-free layer diagnostics on dev")[1].split("\n\n")[1]
    assert "| mean | 2 | 1 (+0.60) | 2 (+0.90) |" in table, table  # picks 1, 1, 3: 1; rho (0.8 + 0.6 + 0.4) / 3
    assert "| CLS | 3 | 3 (+0.73) | 3 (+0.60) |" in table, table  # a seed's NaN rho is left out of the mean
    assert (tmp_path / "diagnostics.tex").is_file()


def test_a_study_without_diagnostics_has_no_such_table(tmp_path):
    build_report(probe_runs(with_diagnostics=False), tmp_path, ("markdown", "latex"))
    assert "Label-free layer diagnostics" not in (tmp_path / "report.md").read_text()
    assert not (tmp_path / "diagnostics.tex").exists()
