"""The contract every trainable kind passes, importable by a plugin's own tests.

Each check is a function of the kind and a trial config (a kind's `example` with a model, a data folder
and a seed filled in: `example_config`) that raises AssertionError naming what broke; `KindContract`
runs them all as pytest tests for a subclass that gives the `kind` and `config` fixtures:

    from orchestrator.testing.kind_contract import KindContract

    class TestMyKind(KindContract):
        @pytest.fixture()
        def kind(self):
            return MyKind()

        @pytest.fixture()
        def config(self, tmp_path):
            ...  # example_config(MyKind(), model, data_dir, tmp_path / "stages")

The project's own kinds are checked by these same functions (tests/trainables/test_contract.py).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainables.contract import collect
from trainables.kinds.base import TrainableKind, TrainingKind


def example_config(kind: TrainableKind, model: str | Path, data_dir: str | Path, cache_dir: str | Path,
                   seed: int = 3) -> dict[str, Any]:
    """The kind's own `example`, with what only a test knows filled in (for the fields the kind has):
    the model, the data folder, a stage cache, CPU in fp32 on one thread, and the seed."""
    assert kind.example, f"{type(kind).__name__} declares no example config: add `example = {{...}}` to its class"
    filled = {"model": str(model), "data_dir": str(data_dir), "device": "cpu", "precision": "fp32",
              "num_threads": 1, "seed": seed, "cache_dir": str(cache_dir)}
    fields = kind.Config.model_fields
    return {**{k: v for k, v in filled.items() if k in fields}, **kind.example}


def run(kind: TrainableKind, config: dict, checkpoint_dir: str | None = None) -> list[dict]:
    """Every report of one run."""
    reports: list[dict] = []
    kind.run(config, collect(reports), checkpoint_dir)
    return reports


def numbers(reports: list[dict]) -> list[dict]:
    """The scores of each report, without timings (they differ between runs)."""
    return [{k: v for k, v in r.items() if isinstance(v, float) and "second" not in k} for r in reports]


def check_example(kind: TrainableKind, config: dict) -> list[dict]:
    """The config parses, the run reports, and it reports the metric the kind declares (which the
    orchestrator reads without running a trial); a training kind's learner selects on that metric."""
    import torch

    cfg = kind.parse(config)
    reports = run(kind, config)
    assert reports and all(isinstance(r, dict) for r in reports), "the kind reported nothing"
    metric, mode = kind.metric(cfg)
    assert metric in reports[-1], f"the kind declares {metric} but its last report has {sorted(reports[-1])}"
    assert mode in ("max", "min"), f"mode must be max or min, but got {mode!r}"
    if isinstance(kind, TrainingKind):
        learner = kind.build(cfg, torch.device("cpu"), torch.float32)
        assert learner.metric == metric, f"its learner selects on {learner.metric}, the kind declares {metric}"
    return reports


def check_same_seed_same_numbers(kind: TrainableKind, config: dict) -> None:
    """Two runs with one seed report the same numbers; another seed reports others."""
    first, second, other = run(kind, config), run(kind, config), run(kind, {**config, "seed": config["seed"] + 1})
    assert numbers(first) == numbers(second), "the same seed gave other numbers"
    assert numbers(first) != numbers(other), "another seed gave the same numbers: is the seed used?"


def run_keeping_checkpoints(kind: TrainableKind, config: dict, folder: Path) -> tuple[list[dict], list[Path]]:
    """An uninterrupted run: every round's metrics and a copy of every round's checkpoint."""
    reports: list[dict] = []
    saved: list[Path] = []

    def keep(metrics, checkpoint_dir=None):
        reports.append(metrics)
        assert checkpoint_dir is not None, f"round {len(reports)} reported without a checkpoint"
        saved.append(shutil.copytree(checkpoint_dir, Path(folder) / f"round{len(saved) + 1}"))

    kind.run(config, keep)
    return reports, saved


def _same(ours: list[dict], theirs: list[dict], what: str, abs_tol: float = 1e-6) -> None:
    import pytest

    assert [r.get("epoch") for r in ours] == [r.get("epoch") for r in theirs], f"{what}: other rounds"
    for a, b in zip(numbers(ours), numbers(theirs), strict=True):
        assert a.keys() == b.keys() and a == pytest.approx(b, abs=abs_tol), f"{what}: other numbers"


def check_resume(kind: TrainableKind, config: dict, folder: Path) -> None:
    """A run resumed from its first round's checkpoint reports what the uninterrupted run did after it."""
    uninterrupted, saved = run_keeping_checkpoints(kind, config, folder)
    assert len(saved) >= 2, "the example config needs at least two rounds to test a resume"
    _same(run(kind, config, str(saved[0])), uninterrupted[1:], "resumed from round 1")


def check_damaged_checkpoint(kind: TrainableKind, config: dict, folder: Path) -> None:
    """A checkpoint cut short (a crash or a full disk mid-write) is discarded: the trial starts again
    from round 1 and, seeded the same, reaches the uninterrupted numbers."""
    from trainables.training.checkpoints import WEIGHTS

    uninterrupted, saved = run_keeping_checkpoints(kind, config, folder)
    weights = saved[0] / WEIGHTS
    assert weights.exists(), f"no {WEIGHTS} in the checkpoint: does the kind save through trainables.training.loop?"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    _same(run(kind, config, str(saved[0])), uninterrupted, "restarted from a damaged checkpoint")


def check_test_scored_once(kind: TrainingKind, config: dict) -> None:
    """Test is scored once, after the last round, with the weights of the best dev round; a config
    with `score_test: false` (a tuning trial) never scores it."""
    splits: list[str] = []
    build: Callable = kind.build

    def counting_build(cfg, device, dtype):
        learner = build(cfg, device, dtype)
        evaluate = learner.evaluate
        learner.evaluate = lambda split: splits.append(split) or evaluate(split)
        return learner

    kind.build = counting_build  # this instance only, put back below
    try:
        reports = []
        final = kind.run(config, collect(reports))
        assert splits.count("test") == 1 and splits[-1] == "test", f"test scored {splits.count('test')} times"
        assert all(not any(k.startswith("test_") for k in r) for r in reports[:-1]), "a round before the last has test"
        metric, mode = kind.metric(kind.parse(config))
        dev = [r[metric] for r in reports]
        best = dev.index(max(dev) if mode == "max" else min(dev))
        assert final["test_epoch"] == final["best_epoch"] == 1 + best, "test was not scored with the best dev round"
        without = run(kind, {**config, "score_test": False})
        assert splits.count("test") == 1 and not any(k.startswith("test_") for k in without[-1]), \
            "score_test: false scored test"
    finally:
        del kind.build


def check_selection_ignores_test(kind: TrainableKind, config: dict, other_test_config: dict) -> None:
    """The same train and dev with another test split (`other_test_config`): every dev number and the
    chosen round agree, and the test score differs (so test was read at all)."""
    first, second = run(kind, config), run(kind, other_test_config)
    dev = lambda rows: [{k: v for k, v in r.items() if k.startswith(("dev_", "best_"))} for r in rows]  # noqa: E731
    assert dev(first) == dev(second), "dev numbers or the chosen round changed with the test split"
    assert first[-1]["test_epoch"] == second[-1]["test_epoch"]
    tests = [k for k in first[-1] if k.startswith("test_") and isinstance(first[-1][k], float) and k != "test_epoch"]
    assert any(first[-1][k] != second[-1][k] for k in tests), "another test split gave the same test scores"


def with_other_test(data_dir: str | Path, folder: str | Path) -> Path:
    """A copy of a data folder in the built-in layout whose `stsb` test split is other pairs (the first
    40, reversed): for `check_selection_ignores_test`."""
    other = Path(folder)
    shutil.copytree(data_dir, other)
    lines = (other / "stsb" / "sts-test.csv").read_text().splitlines()
    (other / "stsb" / "sts-test.csv").write_text("\n".join(reversed(lines[:40])) + "\n")
    return other


class KindContract:
    """The contract as pytest tests: subclass it and give the fixtures `kind` (an instance) and
    `config` (a trial config, e.g. `example_config(...)`); `other_test_config` (the same config on a data
    folder with another test split, `with_other_test`) enables the selection test."""

    def test_the_example_runs_and_reports_the_declared_metric(self, kind, config):
        check_example(kind, config)

    def test_same_seed_same_numbers_other_seed_other_numbers(self, kind, config):
        check_same_seed_same_numbers(kind, config)

    def test_resume_reproduces_the_uninterrupted_run(self, kind, config, tmp_path):
        _training_only(kind)
        check_resume(kind, config, tmp_path)

    def test_a_damaged_checkpoint_restarts_to_the_same_numbers(self, kind, config, tmp_path):
        _training_only(kind)
        check_damaged_checkpoint(kind, config, tmp_path)

    def test_test_is_scored_once_with_the_best_dev_weights(self, kind, config):
        _training_only(kind)
        check_test_scored_once(kind, config)

    def test_selection_never_looks_at_test(self, kind, config, request):
        import pytest

        _training_only(kind)
        try:
            other = request.getfixturevalue("other_test_config")
        except pytest.FixtureLookupError:
            pytest.skip("give an other_test_config fixture to check selection against another test split")
        check_selection_ignores_test(kind, config, other)


def _training_only(kind: TrainableKind) -> None:
    if not isinstance(kind, TrainingKind):
        import pytest

        pytest.skip(f"{type(kind).__name__} trains nothing: no rounds, checkpoints or selection")
