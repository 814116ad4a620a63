"""Practical equivalence (`report.rope`): the posterior probabilities of the Bayesian correlated t-test over
seeds, checked by sampling the posterior from its definition and against baycomp where it is installed, and
the table and marks the report shows."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pandas as pd
import pytest

from reports.build import build_report
from reports.collect import StudyRuns
from reports.equivalence import posterior_probabilities

TEST = {1: [70.0, 71.0, 70.5, 70.2], 2: [75.1, 75.4, 76.1, 75.3], 3: [75.0, 75.5, 76.0, 75.2]}


def sampled_posterior(differences: np.ndarray, rope: float, draws: int = 400_000) -> tuple[float, float, float]:
    """The flat prior p(mu, sigma^2) ∝ 1/sigma^2 with normal differences: sigma^2 | data is (n-1) s^2 / chi^2 with
    n - 1 degrees of freedom and mu | sigma^2, data is normal(mean, sigma^2 / n); sampled, not integrated."""
    rng = np.random.default_rng(0)
    n, mean, variance = len(differences), differences.mean(), differences.var(ddof=1)
    sigma2 = (n - 1) * variance / rng.chisquare(n - 1, draws)
    mu = rng.normal(mean, np.sqrt(sigma2 / n))
    return float(np.mean(mu < -rope)), float(np.mean(np.abs(mu) <= rope)), float(np.mean(mu > rope))


@pytest.mark.parametrize(("differences", "rope"), [
    ([0.3, -0.2, 0.5, 0.1, 0.0], 0.5),  # close to 0: mostly equivalent
    ([1.2, 0.4, 2.0], 1.0),  # 3 seeds, a Student posterior with 2 degrees of freedom: wide
    ([-2.0, -1.1, -1.7, -2.5, -0.9, -1.4], 0.5),  # worse
])
def test_the_probabilities_are_those_of_the_posterior_sampled_from_its_definition(differences, rope):
    values = np.array(differences)
    ours = posterior_probabilities(values, rope)
    sampled = sampled_posterior(values, rope)
    assert sum(ours) == pytest.approx(1.0)
    for mine, theirs in zip(ours, sampled, strict=True):
        assert mine == pytest.approx(theirs, abs=4 * math.sqrt(0.25 / 400_000) + 1e-4)


def test_the_probabilities_match_baycomps_correlated_t_test():
    """baycomp's CorrelatedTTest corrects for cross-validation folds (rho = 1/n with one run); with that rho
    ours gives its probabilities; the report's rho = 0 is the same test for independent seeds."""
    baycomp = pytest.importorskip("baycomp")
    rng = np.random.default_rng(4)
    for n, rope in ((3, 0.5), (5, 1.0), (10, 0.2)):
        x, y = rng.normal(80, 1, n), rng.normal(80.3, 1, n)
        left, within, right = baycomp.CorrelatedTTest.probs(x, y, rope=rope)
        assert posterior_probabilities(y - x, rope, rho=1 / n) == pytest.approx((left, within, right), abs=1e-12)


def test_the_posterior_without_spread_and_the_arguments_it_refuses():
    assert posterior_probabilities([0.2, 0.2, 0.2], 0.5) == (0.0, 1.0, 0.0)
    assert posterior_probabilities([0.9, 0.9, 0.9], 0.5) == (0.0, 0.0, 1.0)
    assert all(math.isnan(p) for p in posterior_probabilities([0.1], 0.5))
    with pytest.raises(ValueError, match=r"rope must be at least 0, but got rope=-1"):
        posterior_probabilities([0.1, 0.2], -1)
    with pytest.raises(ValueError, match=r"rho must be in \[0, 1\), but got rho=1"):
        posterior_probabilities([0.1, 0.2], 0.5, rho=1)


def rope_runs(rope: float | None, seeds: dict[int, int] | None = None) -> StudyRuns:
    rows = [{"run_id": f"r{layer}{seed}", "trial_key": f"c{layer}-s{seed}", "cell": f"layer={layer}",
             "phase": "replicate", "seed": seed, "outcome": "completed", "status": "FINISHED", "error": None,
             "layer": layer, "test_spearman": value, "best_dev_spearman": 80.0 + layer, "epoch": 2, "best_epoch": 1}
            for layer, values in TEST.items() for seed, value in enumerate(values)
            if seed < (seeds or {}).get(layer, 4)]
    report = {"baseline": {"layer": "last"}, **({"rope": rope} if rope is not None else {})}
    return StudyRuns("rope", pd.DataFrame(rows), ["layer"], "dev_spearman", report, planned_seeds=4)


def test_a_cell_within_the_rope_is_marked_and_every_cell_gets_its_probabilities(tmp_path):
    build_report(rope_runs(1.0), tmp_path, ("markdown", "latex", "csv"))
    stats = pd.read_csv(tmp_path / "stats.csv").set_index("cell")
    for layer in (1, 2):
        differences = np.subtract(TEST[layer], TEST[3])
        expected = sampled_posterior(differences, 1.0)
        row = stats.loc[f"layer={layer}"]
        assert (row.p_worse, row.p_equivalent, row.p_better) == pytest.approx(expected, abs=5e-3)
        assert row.rope == 1.0
    assert stats.loc["layer=2", "p_equivalent"] > 0.95 > stats.loc["layer=1", "p_equivalent"]
    report = (tmp_path / "report.md").read_text()
    ablation = next(line for line in report.splitlines() if line.startswith("| Spearman |"))
    assert "**75.47 ± 0.43**≈" in ablation and "70.42 ± 0.43† " in ablation  # worse, not equivalent
    assert "≈ P(within ±1 of last layer)\u00a0≥\u00a00.95" in report  # the short note, kept on one line
    table = report.split("**Practical equivalence against the baseline")[1].split("\n\n")[1]
    assert "| 2 | 3 | 4 | +0.05 | 0.00 | 1.00≈ | 0.00 |" in table
    assert "| 1 | 3 | 4 | -5.00 | 0.00 | 0.00 | 1.00 |" in table  # differences -5, -4.5, -5.5, -5
    tex = (tmp_path / "equivalence.tex").read_text()
    assert r"1.00$^{\approx}$" in tex and "P(equivalent)" in tex


def test_without_a_rope_nothing_changes_and_under_3_seeds_there_is_no_posterior(tmp_path):
    build_report(rope_runs(None), tmp_path / "plain", ("markdown", "csv"))
    assert "p_equivalent" not in pd.read_csv(tmp_path / "plain" / "stats.csv")
    assert "Practical equivalence" not in (tmp_path / "plain" / "report.md").read_text()
    build_report(rope_runs(1.0, seeds={1: 2}), tmp_path / "few", ("markdown", "csv"))
    stats = pd.read_csv(tmp_path / "few" / "stats.csv").set_index("cell")
    assert math.isnan(stats.loc["layer=1", "p_equivalent"]) and stats.loc["layer=2", "p_equivalent"] > 0.95
    report = (tmp_path / "few" / "report.md").read_text()
    assert "| 1 | 3 | 2 | -4.75 | — | — | — |" in report and "—: under 3 paired seeds" in report


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is not installed (CI installs texlive)")
def test_the_equivalence_tables_compile(tmp_path):
    from tests.reports.test_report_layout import compile_alone

    runs = rope_runs(1.0)
    build_report(StudyRuns(**{**runs.__dict__, "report": {**runs.report, "notes": "full"}}), tmp_path, ("latex",))
    for table in ("ablation", "equivalence"):
        log, _ = compile_alone(tmp_path, table, "11pt")
        assert "Overfull \\hbox" not in log, table


def test_report_rope_in_a_study_file_reaches_the_report(tmp_path, tiny_bert, synthetic_data_dir, monkeypatch):
    """`report.rope` in the study file: validated (a non-positive value is one line), and the report of the
    launched study carries each cell's three probabilities against the baseline."""
    import yaml
    from typer.testing import CliRunner

    from benchmarks.instant import instant_executor
    from orchestrator.cli import app
    from orchestrator.run.launcher import launch

    monkeypatch.chdir(tmp_path)
    study = {"name": "rope", "model": tiny_bert, "data_dir": str(synthetic_data_dir), "ablate": {"layer": [1, 3]},
             "replicate": {"seeds": [0, 1, 2, 3]}, "train": {"epochs": 1},
             "tracking": {"mlflow_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}, "report": {"rope": -1}}
    path = tmp_path / "rope.yaml"
    path.write_text(yaml.safe_dump(study))
    refused = CliRunner().invoke(app, ["validate", str(path)])
    assert refused.exit_code == 2 and refused.stderr.startswith("error: report.rope: -1 is not valid; input should be "
                                                                "greater than 0"), refused.output
    study["report"] = {"rope": 1.0, "baseline": {"layer": 3}}
    path.write_text(yaml.safe_dump(study))
    launch(path, storage=tmp_path / "studies", progress=False,
           executor=instant_executor(lambda config, seed, epoch: 40.0 + config["layer"] + 0.1 * seed))
    result = CliRunner().invoke(app, ["report", "rope", "--storage", str(tmp_path / "studies"), "--out",
                                      str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    stats = pd.read_csv(tmp_path / "r" / "stats.csv").set_index("cell")
    # layer 1 is 2 points below layer 3 in every seed: no doubt it is worse, by more than the rope of 1
    assert stats.loc["layer=1", ["p_better", "p_equivalent", "p_worse", "rope"]].tolist() == pytest.approx(
        [0.0, 0.0, 1.0, 1.0], abs=1e-9)
    assert "P(equivalent)" in (tmp_path / "r" / "report.md").read_text()
