"""The GPU, checked without one: tensors a trial creates are created on its device (or on the host by
design, then copied there), and bf16 autocast on CUDA is chosen by the device's compute capability."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from tests.trainables.test_contract import example_config
from trainables import runtime
from trainables.contract import collect
from trainables.kinds import KINDS, get_kind

TRAINABLES = Path(__file__).resolve().parents[2] / "trainables"
FACTORIES = {torch.empty, torch.zeros, torch.ones, torch.full, torch.arange, torch.rand, torch.randn, torch.randint,
             torch.randperm, torch.tensor, torch.as_tensor, torch.eye, torch.linspace, torch.empty_strided,
             torch.from_numpy}

# Tensors trainables creates on the host on purpose, each copied to the trial's device where it meets
# the model (or never leaving the host); a new creation without `device=` fails the test below
# until it is placed on the device or added here with its reason.
HOST_SIDE = {
    ("models/batching.py", "pad"): "padded ids and mask built on the host, one copy to the device per chunk",
    ("models/batching.py", "encode_tokens"): "the row order, copied to the outputs' device",
    ("evaluation/evaluators.py", "__call__"): "the row order of vectors already copied to the host",
    ("evaluation/probe.py", "embed"): "the row order of the layer table, held on the host",
    ("training/bi_encoder.py", "epoch_batches"): "the epoch's batch order (Python lists)",
    ("training/bi_encoder.py", "fit_bi_encoder"): "the labels, indexed per batch and copied by train_step",
    ("training/cross_encoder.py", "fit_cross_encoder"): "the labels, indexed per batch and copied by the step",
    ("kinds/finetune/learner.py", "__init__"): "the labels, indexed per batch and copied by train_step",
    ("kinds/cross_encoder/learner.py", "__init__"): "the labels, indexed per batch and copied by the step",
    ("kinds/contrastive/learner.py", "__init__"): "the corpus sample (indices)",
    ("objectives/classification.py", "__init__"): "a loss's parameters, moved with the module by .to(device)",
    ("objectives/contrastive.py", "step_batches"): "the epoch's sentence order (Python lists)",
    ("stages/pretrain.py", "pretrain"): "the pretraining order (Python lists)",
}


class FactoryCalls(TorchFunctionMode):
    """Every tensor factory that code in trainables/ calls without a device: (file, function) of the
    caller. (Modules built by torch's own code, e.g. nn.Linear, are moved whole by `.to(device)`.)"""

    def __init__(self):
        super().__init__()
        self.sites: dict[tuple[str, str], str] = {}
        self.seen = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES:
            self.seen += 1
            if kwargs.get("device") is None:
                frame = sys._getframe(1)
                while frame is not None and frame.f_code.co_name.startswith("<"):  # a comprehension's frame
                    frame = frame.f_back
                path = Path(frame.f_code.co_filename) if frame is not None else None
                if path is not None and TRAINABLES in path.parents:
                    site = (path.relative_to(TRAINABLES).as_posix(), frame.f_code.co_name)
                    self.sites[site] = f"torch.{func.__name__} at line {frame.f_lineno}"
        return func(*args, **kwargs)


def trial_config(case: str, tiny_bert: str, data_dir, stages) -> tuple[str, dict]:
    """Each registered kind's example, a pretraining stage before finetune, and finetune on a pair
    classification task with the objective that has parameters."""
    name = case.split("+")[0]
    config = example_config(get_kind(name), tiny_bert, data_dir, stages)
    if case == "finetune+mlm":
        config.update(layer=1, epochs=1, max_train_samples=64, pretrain="mlm", pretrain_corpus="task",
                      pretrain_steps=2, pretrain_batch_size=8, pretrain_max_seq_length=16)
    if case == "finetune+mrpc":
        config.update(task="mrpc", loss="cosine_bce_affine", epochs=1)
    return name, config


@pytest.mark.parametrize("case", [*KINDS, "finetune+mlm", "finetune+mrpc"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_every_kind_creates_its_tensors_on_the_device_or_on_the_host_by_design(case, precision, tiny_bert,
                                                                                synthetic_data_dir, tmp_path):
    """Each kind's example trial, traced: a creation without `device=` from trainables/ is one a
    CUDA trial would make on the host, and the step would then mix devices (the fast dropout's
    attention added a host scalar masked by the device's mask). ~1 s a case."""
    name, config = trial_config(case, tiny_bert, synthetic_data_dir, tmp_path / "stages")
    with FactoryCalls() as calls:
        get_kind(name).run({**config, "precision": precision}, collect([]))
    assert calls.seen > 0  # the trace sees the trial's factories (padding at least)
    unexpected = {site: where for site, where in calls.sites.items() if site not in HOST_SIDE}
    assert not unexpected, f"created without device= (place it on the device, or list it in HOST_SIDE): {unexpected}"


def fake_cuda(monkeypatch, capability: tuple[int, int]) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)  # emulation counts


@pytest.mark.parametrize(("capability", "expected"), [((6, 0), torch.float32), ((7, 0), torch.float32),
                                                      ((7, 5), torch.float32), ((8, 0), torch.bfloat16),
                                                      ((8, 9), torch.bfloat16), ((9, 0), torch.bfloat16)])
def test_auto_precision_on_cuda_is_bf16_from_ampere_on(monkeypatch, capability, expected):
    """Pascal, Volta and Turing (P100, V100, T4) emulate bf16, which torch reports as supported:
    `auto` must pick fp32 there, bf16 autocast on Ampere and later (A100, L4, H100)."""
    fake_cuda(monkeypatch, capability)
    device = runtime.resolve_device("auto")
    assert device.type == "cuda"
    assert runtime.resolve_precision("auto", device) == expected
    assert runtime.resolve_precision("bf16", device) == torch.bfloat16  # asked for, it is what runs
    assert runtime.resolve_precision("fp32", device) == torch.float32


PACK = """import sys
import ray
from trainables.kinds import KINDS
KINDS["toy_packed"] = "tests.toy_kind:PackedToyKind"
ray.init(num_cpus=4, num_gpus=2, include_dashboard=False, log_to_driver=False)  # two GPUs that are not there
from orchestrator.run.launcher import launch
result = launch(sys.argv[1], storage=sys.argv[2], progress=False)
print(result.counts)
"""


@pytest.mark.slow
def test_a_fractional_gpu_packs_several_trials_on_each_device(tiny_bert, synthetic_data_dir, tmp_path):
    """`resources.gpu: 0.5` on a local Ray that declares two GPUs (Ray's `num_gpus`; none exists):
    four trials run at the same time (each waits for the others to start, so a trial given a whole
    GPU would leave two waiting forever), two on each device, each trial seeing one GPU (Ray's
    CUDA_VISIBLE_DEVICES) and planned on `cuda`. ~30 s."""
    import json
    import os
    import subprocess

    import yaml

    study = tmp_path / "packed.yaml"
    study.write_text(yaml.safe_dump({
        "name": "packed", "trainable": "toy_packed", "model": tiny_bert, "data_dir": str(synthetic_data_dir),
        "replicate": {"seeds": [0, 1, 2, 3]}, "train": {"epochs": 1}, "resources": {"cpu": 1, "gpu": 0.5},
        "tracking": {"mlflow_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}}))
    notes = tmp_path / "notes"
    notes.mkdir()
    env = {**os.environ, "TOY_PACKING": str(notes), "TOY_PACKING_TRIALS": "4"}
    done = subprocess.run([sys.executable, "-c", PACK, str(study), str(tmp_path / "studies")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "'completed': 4" in done.stdout, done.stdout + done.stderr[-3000:]
    seen = [json.loads(path.read_text()) for path in sorted(notes.glob("*.json"))]
    assert sorted(note["seed"] for note in seen) == [0, 1, 2, 3]
    assert all(note["device"] == "cuda" for note in seen)
    devices = sorted(note["visible"] for note in seen)
    assert devices == ["0", "0", "1", "1"], devices
