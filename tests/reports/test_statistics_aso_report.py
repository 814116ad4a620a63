"""Almost Stochastic Order in the report (`report.aso: true`): each comparison against the baseline gets ε_min
both ways from the two cells' seeds (reports.aso, checked against deepsig in test_aso.py), in stats.csv and its
own table, with the table's comparisons as one Bonferroni family; the direction follows the study's mode."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest

from reports.aso import aso
from reports.build import build_report
from reports.collect import StudyRuns

# layer 1 lies below the baseline (layer 3) in every seed; layer 2 interleaves with it
TEST = {1: [70.0, 71.0, 70.5, 70.2], 2: [75.1, 75.4, 76.1, 75.3], 3: [75.0, 75.5, 76.0, 75.2]}


def aso_runs(report: dict, seeds: dict[int, int] | None = None, mode: str = "max") -> StudyRuns:
    rows = [{"run_id": f"r{layer}{seed}", "trial_key": f"c{layer}-s{seed}", "cell": f"layer={layer}",
             "phase": "replicate", "seed": seed, "outcome": "completed", "status": "FINISHED", "error": None,
             "layer": layer, "test_spearman": value, "best_dev_spearman": 80.0 + layer, "epoch": 2, "best_epoch": 1}
            for layer, values in TEST.items() for seed, value in enumerate(values)
            if seed < (seeds or {}).get(layer, 4)]
    runs = StudyRuns("aso", pd.DataFrame(rows), ["layer"], "dev_spearman", {"baseline": {"layer": "last"}, **report},
                     planned_seeds=4)
    if mode == "min":
        runs = StudyRuns(**{**runs.__dict__, "mode": mode})
    return runs


def test_each_comparison_gets_eps_min_both_ways_with_the_tables_family(tmp_path):
    build_report(aso_runs({"aso": True}), tmp_path, ("markdown", "latex", "csv"))
    stats = pd.read_csv(tmp_path / "stats.csv").set_index("cell")
    assert (stats.aso_comparisons == 2).all()  # holm (the default): one family of the table's two comparisons
    below = stats.loc["layer=1"]
    # every quantile of layer 1 below the baseline's: the violation is total one way (but for the grid's first
    # point, which deepsig leaves out of the violation and keeps in W2: 1 - 0.005 at most) and absent the other
    assert 0.99 < below.aso_eps_min <= 1.0 and below.aso_eps_min_reverse == 0.0
    assert (below.aso_n_cell, below.aso_n_baseline) == (4, 4)
    close = stats.loc["layer=2"]
    expected = aso(TEST[2], TEST[3], num_comparisons=2)
    assert close.aso_eps_min == pytest.approx(expected.eps_min, abs=1e-12)
    assert close.aso_eps_min > 0.2 and close.aso_eps_min_reverse > 0.2  # neither dominates
    assert 0.5 < expected.violation_ratio + aso(TEST[3], TEST[2]).violation_ratio <= 1.0
    report = (tmp_path / "report.md").read_text()
    table = report.split("**Almost Stochastic Order against the baseline")[1].split("\n\n")[1]
    assert f"| 1 | 3 | 4/4 | {below.aso_eps_min:.2f} | 0.00≻ |" in table
    assert f"| 2 | 3 | 4/4 | {close.aso_eps_min:.2f} | {close.aso_eps_min_reverse:.2f} |" in table
    assert "confidence 0.975 for each of the 2 comparisons" in report
    tex = (tmp_path / "aso.tex").read_text()
    assert r"0.00$^{\succ}$" in tex and r"$\varepsilon$\_min" in tex


def test_without_a_correction_each_comparison_is_at_095_and_fewer_seeds_get_none(tmp_path):
    build_report(aso_runs({"aso": True, "correction": "none"}, seeds={1: 2}), tmp_path, ("markdown", "csv"))
    stats = pd.read_csv(tmp_path / "stats.csv").set_index("cell")
    assert (stats.aso_comparisons == 1).all()
    assert math.isnan(stats.loc["layer=1", "aso_eps_min"]) and stats.loc["layer=1", "aso_n_cell"] == 2
    assert stats.loc["layer=2", "aso_eps_min"] == pytest.approx(aso(TEST[2], TEST[3]).eps_min, abs=1e-12)
    report = (tmp_path / "report.md").read_text()
    assert "| 1 | 3 | 2/4 | — | — |" in report and "—: a side with fewer than 3 completed seeds" in report


def test_a_study_that_minimises_compares_the_negated_scores(tmp_path):
    """Lower is better: layer 1's lower scores make it the larger side."""
    build_report(aso_runs({"aso": True}, mode="min"), tmp_path, ("csv",))
    stats = pd.read_csv(tmp_path / "stats.csv").set_index("cell")
    assert stats.loc["layer=1", "aso_eps_min"] == 0.0 and stats.loc["layer=1", "aso_eps_min_reverse"] > 0.99
    expected = aso(-np.array(TEST[2]), -np.array(TEST[3]), num_comparisons=2).eps_min
    assert stats.loc["layer=2", "aso_eps_min"] == pytest.approx(expected, abs=1e-12)


def test_without_the_option_nothing_changes(tmp_path):
    build_report(aso_runs({}), tmp_path, ("markdown", "csv"))
    assert "aso_eps_min" not in pd.read_csv(tmp_path / "stats.csv")
    assert "Almost Stochastic Order" not in (tmp_path / "report.md").read_text()
    assert not (tmp_path / "aso.tex").exists()


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is not installed (CI installs texlive)")
def test_the_aso_table_compiles(tmp_path):
    from tests.reports.test_report_layout import compile_alone

    runs = aso_runs({"aso": True, "notes": "full"})
    build_report(runs, tmp_path, ("latex",))
    log, _ = compile_alone(tmp_path, "aso", "11pt")
    assert "Overfull \\hbox" not in log and "! " not in log


def test_report_aso_in_a_study_file_is_checked(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from orchestrator.cli import app

    path = tmp_path / "aso.yaml"
    path.write_text(yaml.safe_dump({"name": "aso", "model": "m", "ablate": {"layer": [1, 3]},
                                    "report": {"aso": "often"}}))
    refused = CliRunner().invoke(app, ["validate", str(path)])
    assert refused.exit_code == 2 and "report.aso: 'often' is not valid" in refused.stderr, refused.output


def checklist_tests(folder) -> dict:
    return {item["key"]: item for item in json.loads((folder / "reproducibility.json").read_text())}["tests"]


def test_the_reproducibility_section_names_equivalence_and_aso_when_the_study_asked_for_them(tmp_path):
    build_report(aso_runs({"aso": True, "rope": 1.0}), tmp_path / "both", ("markdown",))
    tests = checklist_tests(tmp_path / "both")
    assert tests["facts"]["rope"] == 1.0 and tests["facts"]["aso_comparisons"] == 2
    assert "Practical equivalence within ±1 points (report.rope)" in tests["answer"]
    assert "ε_min both ways at confidence 0.975 for each of 2 comparisons" in tests["answer"]
    build_report(aso_runs({}), tmp_path / "plain", ("markdown",))
    tests = checklist_tests(tmp_path / "plain")
    assert tests["facts"]["rope"] is None and tests["facts"]["aso_comparisons"] is None
    assert "Almost Stochastic Order" not in tests["answer"] and "Practical equivalence" not in tests["answer"]


def test_the_code_item_says_whether_a_rerun_of_the_same_seed_gives_the_same_numbers(tmp_path):
    """CPUs: a rerun gives the same numbers; GPUs: it may differ, and `verify --rerun` measures by how much."""
    build_report(aso_runs({}), tmp_path / "cpu", ("markdown",))
    items = {item["key"]: item for item in json.loads((tmp_path / "cpu" / "reproducibility.json").read_text())}
    assert "The trials ran on CPUs, where a rerun of the same seed gives the same numbers" in items["code"]["answer"]
    assert items["code"]["facts"]["same_seed_variation"] == "none on CPUs"
    runs = aso_runs({})
    on_gpu = StudyRuns(**{**runs.__dict__, "study_file": {"resources": {"cpu": 4, "gpu": 1}}})
    build_report(on_gpu, tmp_path / "gpu", ("markdown",))
    items = {item["key"]: item for item in json.loads((tmp_path / "gpu" / "reproducibility.json").read_text())}
    assert "The trials held GPUs, whose kernels are not all deterministic" in items["code"]["answer"]
    assert "`orchestrator verify REPORT --rerun N` reruns N replicates" in items["code"]["answer"]
