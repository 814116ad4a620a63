"""`finetune` trials as one fused array (trainables.kinds.finetune.array): each member reports what its trial
alone reports.

A tiny random BERT (dropout 0.1, its masks drawn: each member its own) on synthetic STS pairs, two epochs of
batches of 8 pairs (16 short sentences: one chunk, as a batch on a GPU, so a member draws the masks its trial
alone draws). A member's losses, dev and test scores and final weights are compared with the same trial run
alone by the one loop: to fp32 rounding (the stacked matmuls and torch's fused AdamW on slices round
differently; bit equality is not claimed): the per-pair test predictions to 1e-5. The Spearman scores are
compared to 0.05 (the issue's tolerance): the synthetic pairs here leave out a sentence paired with itself,
whose cosine of 1 up to rounding ties it with its copies, so that a rounding of 1e-7 would reorder their
ranks (and could pick another best epoch)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from orchestrator.testing.fixtures import distinct_sts_data
from trainables.kinds import KINDS, load_kind
from trainables.training.checkpoints import PREDICTIONS, WEIGHTS

CLOSE = {"rtol": 1e-4, "atol": 1e-5}


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    """Tiny matmuls on one thread (conftest's `one_torch_thread`)."""


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """Synthetic STS-B (orchestrator.testing.fixtures' word-overlap pairs) without a sentence paired with itself."""
    return distinct_sts_data(tmp_path_factory.mktemp("distinct"))


@pytest.fixture(scope="module")
def kind():
    return load_kind(KINDS["finetune"])


def config(tiny_bert: str, data_dir: Path, **changes) -> dict:
    return {"model": tiny_bert, "data_dir": str(data_dir), "layer": 2, "epochs": 2, "batch_size": 8, "lr": 1e-3,
            "max_train_samples": 100, "max_eval_samples": 60, "device": "cpu", "num_threads": 1, "precision": "fp32",
            **changes}


class Reports:
    """What each trial reported, round by round, and a copy of its last checkpoint folder."""

    def __init__(self, root: Path):
        self.root, self.metrics = root, {}

    def __call__(self, label: str, metrics: dict, checkpoint_dir: str | None = None) -> None:
        self.metrics.setdefault(label, []).append(dict(metrics))
        if checkpoint_dir is not None:
            target = self.root / label / str(len(self.metrics[label]))
            shutil.copytree(checkpoint_dir, target)

    def folder(self, label: str, round_: int | None = None) -> Path:
        return self.root / label / str(round_ or len(self.metrics[label]))

    def weights(self, label: str) -> dict[str, torch.Tensor]:
        return load_file(self.folder(label) / WEIGHTS)


def alone(kind, configs: dict[str, dict], root: Path) -> Reports:
    reports = Reports(root)
    for label, cfg in configs.items():
        kind.run(cfg, lambda metrics, checkpoint_dir=None, label=label: reports(label, metrics, checkpoint_dir))
    return reports


def fused(kind, configs: dict[str, dict], root: Path, folders: dict[str, str] | None = None,
          report=None, probe: bool = False) -> Reports:
    reports = report or Reports(root)
    kind.run_array(list(configs.values()), list(configs), reports,
                   [(folders or {}).get(label) for label in configs], probe=probe)
    return reports


def assert_same_trials(one: Reports, other: Reports, labels) -> None:
    for label in labels:
        first, second = one.metrics[label], other.metrics[label]
        assert [m["epoch"] for m in first] == [m["epoch"] for m in second] == [1, 2]
        for a, b in zip(first, second, strict=True):
            assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4), label
            assert a["dev_spearman"] == pytest.approx(b["dev_spearman"], abs=0.05), label
        assert first[-1]["test_spearman"] == pytest.approx(second[-1]["test_spearman"], abs=0.05), label
        predictions = [pd.read_csv(reports.folder(label) / PREDICTIONS) for reports in (one, other)]
        assert len(predictions[0]) == 60
        pd.testing.assert_frame_equal(*predictions, check_exact=False, atol=1e-5, rtol=0)
        assert first[-1]["best_epoch"] == second[-1]["best_epoch"]
        mine, theirs = one.weights(label), other.weights(label)
        assert mine.keys() == theirs.keys()
        for name in mine:
            torch.testing.assert_close(mine[name], theirs[name], **CLOSE, msg=f"{label}: {name}")


def test_four_replicates_in_one_array_report_what_each_trial_alone_reports(kind, tiny_bert, data_dir,
                                                                            tmp_path):
    configs = {f"s{seed}": config(tiny_bert, data_dir, seed=seed) for seed in range(4)}
    together = fused(kind, configs, tmp_path / "fused")
    separate = alone(kind, configs, tmp_path / "alone")
    assert_same_trials(together, separate, configs)
    assert {m["fused_members"] for runs in together.metrics.values() for m in runs} == {4}
    losses = [together.metrics[label][0]["train_loss"] for label in configs]
    assert len(set(losses)) == 4  # each its own data order and masks: four trainings, not one copied


def test_tuning_members_keep_their_own_learning_rate_schedule_and_clipping(kind, tiny_bert, data_dir,
                                                                           tmp_path):
    changes = [{"lr": 3e-3, "warmup_ratio": 0.0}, {"lr": 1e-4, "weight_decay": 0.1},
               {"lr": 1e-3, "max_grad_norm": 0.05}, {"lr": 2e-3, "warmup_ratio": 0.5, "max_grad_norm": None}]
    configs = {f"t{i}": config(tiny_bert, data_dir, seed=10000, **c) for i, c in enumerate(changes)}
    together = fused(kind, configs, tmp_path / "fused")
    separate = alone(kind, configs, tmp_path / "alone")
    assert_same_trials(together, separate, configs)


class Interrupted(Exception):
    pass


def test_an_array_killed_after_its_first_epoch_resumes_each_member_and_loses_nothing(kind, tiny_bert,
                                                                                     data_dir, tmp_path):
    """Killed after every member's first checkpoint (and one member's checkpoint lost), the array resumes: the
    member without one starts again and catches up; each ends as an array that ran through."""
    configs = {f"s{seed}": config(tiny_bert, data_dir, seed=seed) for seed in range(3)}
    whole = fused(kind, configs, tmp_path / "whole")
    first = Reports(tmp_path / "first")

    def killed(label, metrics, checkpoint_dir=None):
        first(label, metrics, checkpoint_dir)
        if len(first.metrics) == 3 and label == "s2":
            raise Interrupted

    with pytest.raises(Interrupted):
        fused(kind, configs, tmp_path, report=killed)
    folders = {label: str(first.folder(label, 1)) for label in ("s0", "s2")}  # s1's checkpoint was lost
    resumed = fused(kind, configs, tmp_path / "resumed", folders)
    assert [m["epoch"] for m in resumed.metrics["s1"]] == [1, 2] and [m["epoch"] for m in resumed.metrics["s0"]] == [2]
    for label in configs:
        last, again = whole.metrics[label][-1], resumed.metrics[label][-1]
        assert again["test_spearman"] == pytest.approx(last["test_spearman"], abs=0.05)
        for name, tensor in whole.weights(label).items():
            torch.testing.assert_close(resumed.weights(label)[name], tensor, **CLOSE)


def test_a_member_that_diverges_leaves_the_array_and_the_others_train_as_alone(kind, tiny_bert, data_dir,
                                                                              tmp_path):
    configs = {f"s{seed}": config(tiny_bert, data_dir, seed=seed) for seed in range(3)}
    configs["s1"] = config(tiny_bert, data_dir, seed=1, lr=1e30, max_grad_norm=None)
    together = fused(kind, configs, tmp_path / "fused")
    last = together.metrics["s1"][-1]
    assert last["diverged"] == 1 and "loss became nan" in last["error"] and "lower the learning rate" in last["error"]
    with pytest.raises(Exception, match="loss became nan"):
        kind.run(configs["s1"], lambda metrics, checkpoint_dir=None: None)
    others = {k: v for k, v in configs.items() if k != "s1"}
    assert_same_trials(together, alone(kind, others, tmp_path / "alone"), others)
    assert all(math.isfinite(m["train_loss"]) for k in others for m in together.metrics[k])


def test_an_array_that_runs_out_of_device_memory_trains_its_members_alone_from_that_round(kind, tiny_bert, data_dir,
                                                                                         tmp_path, monkeypatch):
    """Out of memory in the second epoch's fifth step: that epoch starts again with each member alone, from what its
    learner holds (the first epoch's end), and the members end as their trials alone."""
    from trainables.training import fused as fused_module

    configs = {f"s{seed}": config(tiny_bert, data_dir, seed=seed) for seed in range(2)}
    real, calls = fused_module.FusedArray.step, []

    def step(self, batches):
        calls.append(len(batches))
        if len(calls) == 13 + 5:  # 13 steps an epoch (100 pairs in batches of 8, the last of 4)
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (a stand-in)")
        return real(self, batches)

    monkeypatch.setattr(fused_module.FusedArray, "step", step)
    together = fused(kind, configs, tmp_path / "fused")
    assert len(calls) == 18  # no array after the failure
    assert [m["fused_members"] for m in together.metrics["s0"]] == [2, 1]
    assert_same_trials(together, alone(kind, configs, tmp_path / "alone"), configs)


@pytest.mark.parametrize(("loss", "stacked"), [("cosine_bce", True), ("softmax", False)])
def test_pair_classification_members_fuse_or_train_one_after_another_with_the_trials_numbers(
        kind, tiny_bert, synthetic_data_dir, tmp_path, caplog, loss, stacked):
    """MRPC-like pairs: the cosine loss has no parameters and fuses; SBERT's softmax head is a parameter the array
    does not stack, so its members train one after another in the array's process, said in its log."""
    configs = {f"s{seed}": config(tiny_bert, synthetic_data_dir, seed=seed, task="mrpc", loss=loss, epochs=1,
                                  max_eval_samples=40) for seed in range(2)}
    with caplog.at_level("WARNING", logger="trainables"):
        together = fused(kind, configs, tmp_path / "fused")
    said = "train one after another" in caplog.text
    assert said != stacked, caplog.text
    assert [m.get("fused_members", 1) for m in together.metrics["s0"]] == [2 if stacked else 1]
    separate = alone(kind, configs, tmp_path / "alone")
    for label in configs:
        first, second = together.metrics[label][-1], separate.metrics[label][-1]
        assert first["train_loss"] == pytest.approx(second["train_loss"], rel=1e-4)
        # the same code path when not stacked; stacked, fp32 rounding may move one of the 40 pairs across the
        # threshold (100 / 40 points), so the per-pair scores carry the comparison
        assert first["test_accuracy"] == pytest.approx(second["test_accuracy"], abs=1e-9 if not stacked else 2.6)
        predictions = [pd.read_csv(reports.folder(label) / PREDICTIONS) for reports in (together, separate)]
        pd.testing.assert_frame_equal(*predictions, check_exact=False, atol=1e-5, rtol=0)
        for name, tensor in separate.weights(label).items():
            torch.testing.assert_close(together.weights(label)[name], tensor, **CLOSE)


def probed(measured: dict[int, object]):
    """A stand-in for `time_steps`: each array size's (seconds a step, peak memory share), or an error to raise."""
    def measure(members, k):
        found = measured[k]
        if isinstance(found, BaseException):
            raise found
        return found
    return measure


def test_the_probe_fuses_when_an_array_pays_and_fits():
    """`fuse: auto`'s probe: fused when K fused train >= 1.2x the pairs/s of K alone one after another; halved
    while the device runs out of memory or the peak passes 90 %; alone when nothing pays or fits."""
    from trainables.kinds.finetune.array import probe_width

    members = [object()] * 8
    oom = torch.cuda.OutOfMemoryError("CUDA out of memory (a stand-in)")
    pays = probe_width(members, probed({1: (0.10, 0.1), 8: (0.20, 0.5)}))
    assert (pays.width, pays.tried, pays.gain) == (8, 8, pytest.approx(4.0))
    assert "8 members fused trained 4.00x the pairs/s of the 8 one after another" in pays.why
    slow = probe_width(members, probed({1: (0.10, 0.1), 8: (0.70, 0.5)}))
    assert (slow.width, slow.gain) == (1, pytest.approx(8 * 0.1 / 0.7)) and "under 1.2x: each member alone" in slow.why
    halved = probe_width(members, probed({1: (0.10, 0.1), 8: oom, 4: (0.15, 0.95), 2: (0.12, 0.6)}))
    assert (halved.width, halved.tried) == (2, 2)
    full = probe_width(members, probed({1: (0.10, 0.1), 8: oom, 4: oom, 2: oom}))
    assert full.width == 1 and "did not fit" in full.why and full.gain == 0.0
    stack = probe_width(members[:3], probed({1: (0.1, 0.1), 3: TypeError("a Conv1D the array does not stack")}))
    assert stack.width == 1 and "Conv1D" in stack.why


def test_a_probed_array_trains_in_the_width_it_chose_and_each_member_is_its_trial(kind, tiny_bert, data_dir,
                                                                                 tmp_path, monkeypatch, caplog):
    """The probe (on this CPU, measured for real) leaves nothing behind: whatever it chose, each member ends as its
    trial alone; forced to 2 of 4, the members train as two arrays of 2 in each round."""
    from trainables.kinds.finetune import array as array_module

    configs = {f"s{seed}": config(tiny_bert, data_dir, seed=seed) for seed in range(4)}
    separate = alone(kind, configs, tmp_path / "alone")
    with caplog.at_level("WARNING", logger="trainables"):
        measured = fused(kind, configs, tmp_path / "measured", probe=True)
    assert "fuse auto: " in caplog.text
    assert_same_trials(measured, separate, configs)
    gains = {m["fuse_probe_gain"] for runs in measured.metrics.values() for m in runs}
    assert len(gains) == 1 and next(iter(gains)) > 0  # one probe for the array, a real ratio
    three = {label: configs[label] for label in ("s0", "s1", "s2")}
    oom = torch.cuda.OutOfMemoryError("CUDA out of memory (a stand-in)")
    monkeypatch.setattr(array_module, "time_steps", probed({1: (0.10, 0.0), 3: oom, 2: (0.05, 0.0)}))
    pairs = fused(kind, three, tmp_path / "pairs", probe=True)  # 3 did not fit: an array of 2, then one alone
    assert [[m["fused_members"] for m in pairs.metrics[label]] for label in three] == [[2, 2], [2, 2], [1, 1]]
    assert_same_trials(pairs, separate, three)
