"""The SentEval-style STS suite: STS12-16, STS-B and SICK-R, scored as SimCSE and miCSE report them.

Each set is scored by the Spearman correlation (x100) of cosine similarity with the gold scores.
For STS12-16 the subsets of a year are pooled before the correlation is taken (SentEval's "all",
the figure SimCSE's and miCSE's tables give); STS-B and SICK-R use their test splits. The mean of
each year's per-subset correlations is kept beside it (`_subset_mean`) for papers that use it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from trainables.data.tasks import load_task
from trainables.errors import one_of
from trainables.evaluation.evaluators import Embed, pair_cosines

SUITES = {"sts": ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sick")}
LABELS = {"sts12": "STS12", "sts13": "STS13", "sts14": "STS14", "sts15": "STS15", "sts16": "STS16",
          "stsb": "STS-B", "sick": "SICK-R"}
AVERAGE = "avg"


def suite_tasks(name: str) -> tuple[str, ...]:
    if name not in SUITES:
        raise one_of("suite", name, SUITES)
    return SUITES[name]


def load_suite(name: str, data_dir: str | None = None, max_eval_samples: int | None = None) -> dict[str, pd.DataFrame]:
    """The test pairs of every set of the suite (the same capped rows for every caller)."""
    return {task: load_task(task, None, data_dir, max_eval_samples=max_eval_samples).test
            for task in suite_tasks(name)}


def suite_sentences(frames: dict[str, pd.DataFrame]) -> list[str]:
    """Every distinct sentence of the suite, so one pass can embed them all."""
    return list(dict.fromkeys(s for frame in frames.values() for column in ("sentence1", "sentence2")
                              for s in frame[column]))


def _spearman(scores: np.ndarray, gold: np.ndarray) -> float:
    return 100 * float(spearmanr(scores, gold).statistic)


def score_suite(embed: Embed, frames: dict[str, pd.DataFrame]) -> dict[str, float]:
    """`{task: Spearman x100}` for every set, `avg` over them, and `{year}_subset_mean` for the
    STS years (the unweighted mean over that year's subsets)."""
    out: dict[str, float] = {}
    for task, frame in frames.items():
        cosines = pair_cosines(embed, frame)
        gold = frame["score"].to_numpy(dtype=np.float64)
        out[task] = _spearman(cosines, gold)
        if "subset" in frame:
            per_subset = [_spearman(cosines[(frame["subset"] == s).to_numpy()], gold[(frame["subset"] == s).to_numpy()])
                          for s in frame["subset"].unique()]
            out[f"{task}_subset_mean"] = float(np.mean(per_subset))
    out[AVERAGE] = float(np.mean([out[task] for task in frames]))
    return out


def suite_metrics(scores: dict[str, float], prefix: str = "test") -> dict[str, float]:
    """MLflow metric names: `test_sts12_spearman`, ..., `test_suite_avg_spearman`."""
    return {f"{prefix}_{'suite_' if k == AVERAGE else ''}{k}_spearman": v for k, v in scores.items()}


def suite_columns(tasks: Sequence[str]) -> list[str]:
    return [LABELS[t] for t in tasks] + ["Avg."]
