"""The SentEval-style STS suite: aggregation, the probe command, and a real MiniLM table."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import spearmanr
from typer.testing import CliRunner

from orchestrator.cli import app
from trainables.evaluation.sts_suite import score_suite, suite_metrics

runner = CliRunner()


def _frame(pairs, subsets=None):
    frame = pd.DataFrame(pairs, columns=["sentence1", "sentence2", "score"])
    return frame.assign(subset=subsets) if subsets is not None else frame


def test_years_pool_their_subsets_and_the_average_is_over_sets():
    rng = np.random.default_rng(0)
    vectors = {f"s{i}": torch.tensor(rng.normal(size=4), dtype=torch.float32) for i in range(40)}

    def embed(sentences):
        return torch.stack([vectors[s] for s in sentences])

    year = _frame([(f"s{i}", f"s{i + 20}", rng.uniform()) for i in range(20)], ["a"] * 8 + ["b"] * 12)
    other = _frame([(f"s{i}", f"s{39 - i}", rng.uniform()) for i in range(12)])
    scores = score_suite(embed, {"sts12": year, "stsb": other})
    cos = torch.nn.functional.cosine_similarity(embed(list(year.sentence1)), embed(list(year.sentence2))).numpy()
    assert scores["sts12"] == pytest.approx(100 * spearmanr(cos, year.score).statistic)
    by_subset = [100 * spearmanr(cos[:8], year.score[:8]).statistic, 100 * spearmanr(cos[8:], year.score[8:]).statistic]
    assert scores["sts12_subset_mean"] == pytest.approx(np.mean(by_subset))
    assert scores["avg"] == pytest.approx((scores["sts12"] + scores["stsb"]) / 2)
    assert suite_metrics(scores)["test_suite_avg_spearman"] == scores["avg"]
    assert "test_sts12_spearman" in suite_metrics(scores)


def test_probe_suite_prints_one_row_per_layer(tiny_bert, data_dir):
    result = runner.invoke(app, ["probe", "--model", tiny_bert, "--suite", "sts", "--layers", "0,2",
                                 "--max-eval-samples", "60", "--data-dir", str(data_dir), "--json"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["layer"] for r in rows] == [0, 2]
    sets = ["sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sick"]
    from trainables.evaluation.probe import probe_layers
    from trainables.kinds.probe import ProbeConfig

    single = probe_layers(ProbeConfig(model=tiny_bert, task="stsb", layers=[0, 2], splits=["test"],
                                      max_eval_samples=60, data_dir=str(data_dir)))
    for row, alone in zip(rows, single, strict=True):
        assert row["avg"] == pytest.approx(np.mean([row[s] for s in sets]))
        assert row["stsb"] == pytest.approx(alone["test_spearman"], abs=0.01)  # the suite's STS-B is the task's
        assert len({round(row[s], 6) for s in sets}) == len(sets)  # each set scored on its own pairs


def test_an_unknown_suite_is_one_line_and_exit_2(tiny_bert):
    result = runner.invoke(app, ["probe", "--model", tiny_bert, "--suite", "senteval"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: suite: 'senteval' is not valid; use one of: sts"


@pytest.mark.slow
def test_minilm_suite_table_at_the_last_layer(data_dir, minilm_path):
    result = runner.invoke(app, ["probe", "--model", "sentence-transformers/all-MiniLM-L6-v2", "--suite", "sts",
                                 "--layers", "6", "--data-dir", str(data_dir), "--json"])
    assert result.exit_code == 0, result.output
    (row,) = [json.loads(line) for line in result.stdout.splitlines()]
    from trainables.evaluation.probe import probe_layers
    from trainables.kinds.probe import ProbeConfig

    (alone,) = probe_layers(ProbeConfig(model="sentence-transformers/all-MiniLM-L6-v2", task="stsb", layers=[6],
                                        splits=["test"], data_dir=str(data_dir)))
    # the single-task probe's figure (other chunks of the same sentences: float rounding apart)
    assert row["stsb"] == pytest.approx(alone["test_spearman"], abs=0.01)
    assert row["stsb"] == pytest.approx(82.0, abs=1.0)  # SBERT publishes ~82 for all-MiniLM-L6-v2 on STS-B test
    assert all(70 < row[s] < 90 for s in ("sts12", "sts13", "sts14", "sts15", "sts16", "sick"))
