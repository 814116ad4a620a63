"""What the report's figures claim, pinned: a resampled p is never 0, a capped test split is not called
the test score, and the short note names how many comparisons the correction is over."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from reports.bootstrap import BOOTSTRAP_SAMPLES, paired_bootstrap, resampled_p
from reports.build import build_report
from reports.collect import StudyRuns
from reports.record import DataRecord, KindRecord, SplitRecord, StudyRecord

TEST = {1: [74.0, 77.0, 75.0], 2: [80.0, 82.0, 84.0], 3: [75.0, 75.5, 76.0]}


def test_a_resampled_p_counts_the_observed_sample_and_is_never_zero():
    """(1 + count) / (1 + B) per tail, twice the smaller: 1,000 resamples all on one side give 2/1001."""
    assert resampled_p(np.full(1000, 0.5)) == pytest.approx(2 / 1001)
    assert resampled_p(np.full(1000, -0.5)) == pytest.approx(2 / 1001)
    differences = np.concatenate([np.full(30, -1.0), np.full(970, 1.0)])  # 30 resamples below 0
    assert resampled_p(differences) == pytest.approx(2 * 31 / 1001)
    assert resampled_p(np.zeros(1000)) == 1.0


def test_the_pair_bootstrap_of_a_clearly_better_cell_gives_the_smallest_p_it_can():
    gold = np.random.default_rng(0).uniform(0, 1, 200)
    rng = np.random.default_rng(1)
    frame = [pd.DataFrame({"pair": np.arange(200), "score": gold, "prediction": gold + rng.normal(0, noise, 200)})
             for noise in (0.01, 0.01, 2.0, 2.0)]
    difference, p = paired_bootstrap(frame[:2], frame[2:])
    assert difference > 50 and p == pytest.approx(2 / (BOOTSTRAP_SAMPLES + 1)) and p > 0


def capped_runs(cap: int | None, test_rows: int = 1379, labels: dict | None = None, name: str = "capped") -> StudyRuns:
    record = StudyRecord(name=name, kind=KindRecord(name="finetune"), metric="dev_spearman",
                         cells=[{"layer": k} for k in (1, 2, 3)], seeds=[0, 1, 2],
                         base={"max_eval_samples": cap} if cap else {},
                         data=[DataRecord(name="stsb", splits={"test": SplitRecord(rows=test_rows, sha256="0" * 64)})])
    rows = [{"run_id": f"r{layer}{seed}", "trial_key": f"c{layer}-s{seed}", "cell": f"layer={layer}",
             "phase": "replicate", "seed": seed, "outcome": "completed", "status": "FINISHED", "error": None,
             "layer": layer, "test_spearman": value, "best_dev_spearman": 80.0 + layer, "epoch": 2, "best_epoch": 1}
            for layer, values in TEST.items() for seed, value in enumerate(values)]
    report = {"baseline": {"layer": "last"}, **({"labels": labels} if labels else {})}
    return StudyRuns(name, pd.DataFrame(rows), ["layer"], "dev_spearman", report, planned_seeds=3, record=record)


@pytest.mark.parametrize(("cap", "rows", "caption"), [
    (300, 1379, "**Spearman ×100 on 300 of the 1,379 test pairs (capped: data.max_eval_samples) by layer, mean ± std "
                "over 3 seeds.**"),
    (None, 1379, "**Test Spearman ×100 by layer, mean ± std over 3 seeds.**"),
    (2000, 1379, "**Test Spearman ×100 by layer, mean ± std over 3 seeds.**"),  # a cap above the split: whole
])
def test_a_caption_says_test_spearman_only_of_a_whole_test_split(tmp_path, cap, rows, caption):
    build_report(capped_runs(cap, rows), tmp_path, ("markdown",))
    report = (tmp_path / "report.md").read_text()
    assert caption in report
    if cap and cap < rows:
        assert "Test Spearman" not in report.split("## Reproducibility")[0]
        headline = ("(its parameters in millions, Spearman and Pearson ×100 on 300 of the 1,379 test pairs (capped: "
                    "data.max_eval_samples)) against the last layer (Spearman on the same pairs; Δ: k minus last)")
        assert headline in report


@pytest.mark.parametrize(("caps", "caption"), [
    ((300, 300), "**Spearman ×100 on 300 of the 1,379 test pairs (capped: data.max_eval_samples) by layer, mean"),
    ((300, None), "**Spearman ×100 on test splits capped at 300 pairs in 1 of its 2 studies (data.max_eval_samples; "
                  "the others scored whole) by layer, mean"),
    ((None, None), "**Test Spearman ×100 by layer, mean"),
])
def test_a_combined_reports_caption_says_test_spearman_only_where_no_study_capped_its_test_split(tmp_path, caps,
                                                                                                 caption):
    """A report over several studies (`orchestrator report a b`) has no study record of its own: it keeps
    each study's cap, so a capped study is not called the test score there either."""
    from reports.collect import combine

    build_report(combine([capped_runs(cap, name=f"s{i}") for i, cap in enumerate(caps)]), tmp_path, ("markdown",))
    report = (tmp_path / "report.md").read_text()
    assert caption in report, report[:1500]
    if any(caps):
        assert "Test Spearman" not in report.split("## Reproducibility")[0]


def test_a_capped_caption_in_latex_and_the_figure_caption(tmp_path):
    build_report(capped_runs(300), tmp_path, ("latex",))
    assert r"\caption{Spearman $\times$100 on 300 of the 1,379 test pairs" in (tmp_path / "ablation.tex").read_text()
    assert (r"\caption{Spearman $\times$100 on 300 of the 1,379 test pairs (capped: data.max\_eval\_samples) by "
            "layer, mean") in (tmp_path / "report.tex").read_text()  # the figure's


def test_the_short_note_names_the_comparisons_the_correction_is_over(tmp_path):
    """Two cells against the last layer: Holm over m = 2 (layer 2's t-test p is 0.031 raw, 0.062 after Holm:
    no † here, and the line says so with the family's size)."""
    build_report(capped_runs(None), tmp_path, ("markdown", "latex"))
    tex = (tmp_path / "ablation.tex").read_text()
    report = (tmp_path / "report.md").read_text()
    stats = pd.read_csv(tmp_path / "stats.csv").set_index("cell")
    from scipy.stats import ttest_rel

    raw = [ttest_rel(TEST[k], TEST[3]).pvalue for k in (1, 2)]
    assert stats.loc["layer=2", "paired_p_adj"] == pytest.approx(min(1.0, 2 * min(raw)))
    if stats.paired_p_adj.min() < 0.05:
        assert "(seed t-test, Holm, m~=~2)" in tex
    else:
        assert "no cell differs from the last layer at p~$<$~0.05 (Holm, m~=~2)" in tex
    assert "Holm–Bonferroni-corrected over the table's m comparisons (2 paired, 0 bootstrap)" in report
