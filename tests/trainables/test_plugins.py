"""Plugins through entry points: a distribution on the path that declares a kind, an objective and a
pooling under the project's entry-point groups makes their names valid in the study file exactly like
the built-in ones; an unknown name lists the installed ones with their package; a name two
distributions register is refused naming both; a plugin that cannot be imported is one line; the study
file cannot name a dotted path; the study record keeps each plugin's distribution and version; and
`status`, `report` and `verify` of a study that used a plugin work once it is uninstalled."""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from benchmarks.instant import instant_executor
from orchestrator.cli import app
from trainables import registry

runner = CliRunner()

PLUGIN = '''
from trainables.objectives.base import Objective
from trainables.poolings.base import Pooling

SQUARED = Objective("sts", "fake_plugin.modules:SquaredCosineLoss", "MSE of cos(u, v) squared")
LAST = Pooling("fake_plugin.modules:LastTokenPooling", None, "the last real token's state")
'''
MODULES = '''
import torch
from torch import nn


class SquaredCosineLoss(nn.Module):
    def __init__(self, dim=None):
        super().__init__()

    def forward(self, u, v, target):
        return (nn.functional.cosine_similarity(u, v).square() - target.to(u.dtype)).square().mean()


class LastTokenPooling(nn.Module):
    def __init__(self, dim=None):
        super().__init__()

    def forward(self, hidden, mask):
        last = mask.sum(dim=1).long().clamp(min=1) - 1
        return hidden[torch.arange(len(hidden)), last]
'''
KIND = '''
from tests.toy_kind import ToyKind


class PluginToyKind(ToyKind):
    """The test suite's toy kind, as a plugin registers it."""
'''


def install(site: Path, name: str, version: str, entry_points: dict[str, dict[str, str]],
            files: dict[str, str] | None = None) -> None:
    """A distribution as pip leaves it: its modules and a dist-info with METADATA and entry_points.txt."""
    package = name.replace("-", "_")
    for path, text in (files or {}).items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text(textwrap.dedent(text))
    info = site / f"{package}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text("".join(
        f"[ablation_orchestrator.{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()) + "\n"
        for group, entries in entry_points.items()))


@pytest.fixture()
def site(tmp_path, monkeypatch, installed_plugins):
    """A folder on the path, as site-packages: what is installed there is registered (and nothing the
    environment running the suite has installed)."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    installed_plugins.append(str(folder))
    registry.refresh()
    yield folder
    registry.refresh()
    for module in [m for m in sys.modules if m.startswith(("fake_plugin", "other_plugin", "broken_plugin",
                                                            "wrong_plugin", "shape_plugin"))]:
        del sys.modules[module]


@pytest.fixture()
def fake_plugin(site):
    install(site, "fake-plugin", "1.2.3", {
        "objectives": {"squared": "fake_plugin:SQUARED"}, "poolings": {"last": "fake_plugin:LAST"},
        "kinds": {"plugin_toy": "fake_plugin.kind:PluginToyKind"}},
        {"fake_plugin/__init__.py": PLUGIN, "fake_plugin/modules.py": MODULES, "fake_plugin/kind.py": KIND})
    registry.refresh()
    return site


def study(folder: Path, model: str, data_dir: Path, **changes) -> Path:
    raw = {"name": "plugged", "model": model, "data_dir": str(data_dir), "ablate": {"layer": [1, 2]},
           "train": {"epochs": 1, "batch_size": 16}, "data": {"max_train_samples": 32, "max_eval_samples": 16},
           "tracking": {"mlflow_uri": "sqlite:///mlflow.db"}, **changes}
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_a_plugins_names_are_valid_like_the_built_in_ones(fake_plugin, tiny_bert, synthetic_data_dir, tmp_path):
    from orchestrator.study.config import load_study
    from orchestrator.study.plan import build_plan

    path = study(tmp_path, tiny_bert, synthetic_data_dir, ablate={"layer": [1], "pooling": ["mean", "last"]},
                 train={"epochs": 1, "loss": "squared"})
    assert runner.invoke(app, ["validate", str(path)]).exit_code == 0
    plan = build_plan(load_study(path), tmp_path)
    assert [(p.group, p.name, p.distribution, p.version, p.target) for p in plan.plugins] == [
        ("objectives", "squared", "fake-plugin", "1.2.3", "fake_plugin:SQUARED"),
        ("poolings", "last", "fake-plugin", "1.2.3", "fake_plugin:LAST")]
    assert "torch" not in sys.modules or "fake_plugin.modules" not in sys.modules  # validate read declarations only


def test_an_unknown_name_lists_the_installed_ones_with_their_package(fake_plugin, tiny_bert, synthetic_data_dir,
                                                                      tmp_path):
    path = study(tmp_path, tiny_bert, synthetic_data_dir, train={"epochs": 1, "loss": "squaredd"})
    assert error_line(runner.invoke(app, ["validate", str(path)])) == (
        "error: train.loss: 'squaredd' is not valid; use one of: angle, cached_mnrl, cosent, cosine_bce, "
        "cosine_bce_affine, cosine_mse, gist, gte, mnrl, mnrl_symmetric, softmax, softmax_nli, squared "
        "(fake-plugin 1.2.3)")
    path = study(tmp_path, tiny_bert, synthetic_data_dir, ablate={"pooling": ["mean", "first"]})
    assert error_line(runner.invoke(app, ["validate", str(path)])) == (
        "error: ablate.pooling: 'first' is not valid; use all or names from: mean, cls, max, mean_sqrt_len, "
        "last_token, last (fake-plugin 1.2.3)")
    path = study(tmp_path, tiny_bert, synthetic_data_dir, trainable="plugin_toi")
    assert error_line(runner.invoke(app, ["validate", str(path)])) == (
        "error: trainable: 'plugin_toi' is not valid; use one of: contrastive, cross_encoder, distill, finetune, "
        "plugin_toy (fake-plugin 1.2.3), probe")


def test_a_plugins_objective_must_fit_the_task_like_a_built_in_one(fake_plugin, tiny_bert, synthetic_data_dir,
                                                                    tmp_path):
    path = study(tmp_path, tiny_bert, synthetic_data_dir, task="mrpc", train={"epochs": 1, "loss": "squared"})
    assert error_line(runner.invoke(app, ["validate", str(path)])) == (
        "error: train.loss: 'squared' is not valid; it trains sts tasks; task mrpc needs one of: softmax, cosine_bce, "
        "cosine_bce_affine")


def test_a_name_two_distributions_register_is_refused_naming_both(fake_plugin, tiny_bert, synthetic_data_dir,
                                                                   tmp_path):
    install(fake_plugin, "other-plugin", "0.2.0", {"poolings": {"last": "fake_plugin:LAST",
                                                                "mean": "fake_plugin:LAST"}})
    registry.refresh()
    path = study(tmp_path, tiny_bert, synthetic_data_dir, ablate={"pooling": ["last"]})
    assert error_line(runner.invoke(app, ["validate", str(path)])) == (
        "error: ablate.pooling: 'last' is not valid; pooling last is registered by fake-plugin 1.2.3 and by "
        "other-plugin 0.2.0 (ablation_orchestrator.poolings): uninstall one of them")
    path = study(tmp_path, tiny_bert, synthetic_data_dir)  # the default pooling, mean, is taken twice too
    assert error_line(runner.invoke(app, ["validate", str(path)])) == (
        "error: train.pooling: 'mean' is not valid; pooling mean is registered by ablation-orchestrator and by "
        "other-plugin 0.2.0 (ablation_orchestrator.poolings): uninstall one of them")


def test_a_plugin_that_cannot_be_imported_is_one_line(site, tiny_bert, synthetic_data_dir, tmp_path):
    install(site, "broken-plugin", "0.0.1", {"objectives": {"broken": "broken_plugin:NOTHING"}},
            {"broken_plugin/__init__.py": "import not_a_module_anywhere\n"})
    registry.refresh()
    path = study(tmp_path, tiny_bert, synthetic_data_dir, train={"epochs": 1, "loss": "broken"})
    assert error_line(runner.invoke(app, ["validate", str(path)])) == (
        "error: train.loss: 'broken' is not valid; broken_plugin:NOTHING (broken-plugin 0.0.1) cannot be imported: "
        "ModuleNotFoundError: No module named 'not_a_module_anywhere'")
    path = study(tmp_path, tiny_bert, synthetic_data_dir)  # a study that does not name it is not affected
    assert runner.invoke(app, ["validate", str(path)]).exit_code == 0


def test_the_study_file_cannot_name_a_dotted_path(site, tiny_bert, synthetic_data_dir, tmp_path):
    (site / "sneaky.py").write_text("import pathlib\npathlib.Path(__file__).with_name('ran').write_text('1')\n"
                                    "from trainables.objectives.builtin import COSINE_MSE as LOSS\n")
    for loss in ("sneaky:LOSS", "sneaky.LOSS", "trainables.objectives.builtin:COSINE_MSE"):
        path = study(tmp_path, tiny_bert, synthetic_data_dir, train={"epochs": 1, "loss": loss})
        assert error_line(runner.invoke(app, ["validate", str(path)])).startswith(
            f"error: train.loss: '{loss}' is not valid; use one of: angle, cached_mnrl, cosent")
    assert not (site / "ran").exists() and "sneaky" not in sys.modules


def test_status_report_and_verify_work_once_the_plugin_is_uninstalled(fake_plugin, tiny_bert, synthetic_data_dir,
                                                                      tmp_path, monkeypatch):
    """A study of a plugin's kind with a plugin's objective and pooling, run (its trials by the instant
    executor), then the plugin removed: the study record names it, and nothing that reads the study
    needs its code."""
    import shutil

    from orchestrator.run.launcher import launch

    monkeypatch.chdir(tmp_path)
    path = study(tmp_path, tiny_bert, synthetic_data_dir, trainable="plugin_toy", ablate={"lr": [0.1, 1.0]},
                 train={"epochs": 2}, data={})
    storage = tmp_path / "studies"
    launch(path, storage=storage, progress=False, executor=instant_executor(lambda config, seed, epoch: 40.0 + epoch))
    record = json.loads((storage / "plugged" / "study_record.json").read_text())
    assert record["plugins"] == [{"group": "kinds", "name": "plugin_toy", "distribution": "fake-plugin",
                                  "version": "1.2.3", "target": "fake_plugin.kind:PluginToyKind"}]
    shutil.rmtree(fake_plugin / "fake_plugin")
    shutil.rmtree(fake_plugin / "fake_plugin-1.2.3.dist-info")
    for module in [m for m in sys.modules if m.startswith("fake_plugin")]:
        del sys.modules[module]
    registry.refresh()
    from trainables import kinds

    kinds._built.clear()
    status = runner.invoke(app, ["status", "plugged", "--storage", str(storage)])
    assert status.exit_code == 0, status.output
    assert "plugged" in status.stdout and "2" in status.stdout
    report = runner.invoke(app, ["report", "plugged", "--storage", str(storage), "--out", str(tmp_path / "r")])
    assert report.exit_code == 0, report.output
    assert "Plugins: plugin_toy (kinds, fake-plugin 1.2.3)." in (tmp_path / "r" / "report.md").read_text()
    verify = runner.invoke(app, ["verify", str(tmp_path / "r")])
    assert verify.exit_code == 0 and verify.stdout.startswith("ok: every number"), verify.output
    resumed = runner.invoke(app, ["resume", "plugged", "--storage", str(storage)])  # running it again needs it
    assert error_line(resumed) == ("error: kind: 'plugin_toy' is not valid; study plugged was launched with it from "
                                   "fake-plugin 1.2.3, which is not installed now: pip install "
                                   "'fake-plugin==1.2.3', then resume it")
    assert "fake_plugin" not in sys.modules


def test_the_walkthrough_builds_exactly_examples_plugin():
    """docs/how-to/plugin.md writes the plugin file by file (its bash blocks run in the docs test); what it
    writes is examples/plugin, whose tests and end-to-end study run here."""
    import re

    repo = Path(__file__).resolve().parents[2]
    page = (repo / "docs" / "how-to" / "plugin.md").read_text()
    written = dict(re.findall(r"^cat > (\S+) <<'EOF'\n(.*?)^EOF$", page, re.MULTILINE | re.DOTALL))
    plugin = repo / "examples" / "plugin"
    shipped = {str(p.relative_to(plugin)) for p in plugin.rglob("*") if p.is_file() and p.suffix in (".py", ".toml")
               and "egg-info" not in str(p) and "__pycache__" not in str(p)}
    assert set(written) == shipped
    assert all(written[name] == (plugin / name).read_text() for name in shipped)


def test_whatever_the_environment_has_installed_the_built_ins_stay_valid(monkeypatch, tiny_bert, synthetic_data_dir,
                                                                         tmp_path):
    """The registries as a user's process reads them (every installed distribution, the example plugin in CI's
    second run): the built-in names are all there, each plugin's name is listed with its package, and a study
    of built-in names validates."""
    from trainables.kinds import KINDS
    from trainables.objectives import OBJECTIVES
    from trainables.poolings import POOLINGS

    monkeypatch.setattr(registry, "PLUGIN_PATH", None)
    registry.refresh()
    for table in (KINDS, OBJECTIVES, POOLINGS):
        assert set(table.builtins) <= set(table)
        for entry in table.plugins():
            assert f"{entry.name} ({entry.package})" in table.listing()
    assert runner.invoke(app, ["validate", str(study(tmp_path, tiny_bert, synthetic_data_dir))]).exit_code == 0


WRONG = '''
import torch
from torch import nn

from trainables.objectives.base import Objective


class PerPairLoss(nn.Module):  # forgets to reduce: one loss per pair
    def __init__(self, dim=None):
        super().__init__()

    def forward(self, u, v, target):
        return (nn.functional.cosine_similarity(u, v) - target.to(u.dtype)).square()


def not_a_module(dim):
    return lambda u, v, target: torch.zeros(())


PER_PAIR = Objective("sts", "wrong_plugin:PerPairLoss")
FUNCTION = Objective("sts", "wrong_plugin:not_a_module")
'''


@pytest.mark.parametrize(("loss", "said"), [
    ("per_pair", "its module wrong_plugin:PerPairLoss returned a torch.float32 tensor of shape (16,) for a batch of "
                 "16 pairs; a PairLoss returns the batch's loss as one number (a 0-dim floating tensor, e.g. its "
                 ".mean())"),
    ("function", "its module wrong_plugin:not_a_module(32) is a function, not a torch module; a PairLoss is an "
                 "nn.Module (trainables.objectives.base)"),
])
def test_a_plugin_loss_of_the_wrong_shape_fails_its_trial_in_one_line(site, tiny_bert, synthetic_data_dir, tmp_path,
                                                                      loss, said):
    """A plugin's loss that returns one number per pair (or is no module at all) would train on something
    else or fail deep inside autograd: the trial stops at its first batch with one line naming the loss."""
    from trainables.errors import UserInputError
    from trainables.kinds import get_kind

    install(site, "wrong-plugin", "0.1", {"objectives": {"per_pair": "wrong_plugin:PER_PAIR",
                                                         "function": "wrong_plugin:FUNCTION"}},
            {"wrong_plugin/__init__.py": WRONG})
    registry.refresh()
    config = {"task": "stsb", "model": tiny_bert, "data_dir": str(synthetic_data_dir), "epochs": 1, "batch_size": 16,
              "max_seq_length": 32, "num_threads": 1, "cache_dir": str(tmp_path), "device": "cpu", "layer": 2,
              "seed": 0, "score_test": False, "export_model": False, "loss": loss, "max_train_samples": 32,
              "max_eval_samples": 16}
    with pytest.raises(UserInputError) as failed:
        get_kind("finetune").run(config, lambda metrics, checkpoint_dir=None: None)
    assert str(failed.value) == f"train.loss: '{loss}' is not valid; {said}"


SHAPES = '''
from torch import nn

from trainables.poolings.base import Pooling


class Unpooled(nn.Module):  # forgets to pool: the token states themselves
    def __init__(self, dim):
        super().__init__()

    def forward(self, hidden, mask):
        return hidden


def not_a_module(dim):
    return lambda hidden, mask: hidden[:, 0]


UNPOOLED = Pooling("shape_plugin:Unpooled")
FUNCTION = Pooling("shape_plugin:not_a_module")
'''


@pytest.mark.parametrize(("name", "said"), [
    ("unpooled", r"its module shape_plugin:Unpooled returned a torch\.float32 tensor of shape \((\d+), \d+, 32\) "
                 r"for \1 sentences of size 32; a pooling returns one vector of the hidden size per sentence, shape "
                 r"\(\1, 32\)"),
    ("function", r"its module shape_plugin:not_a_module\(32\) is a function, not a torch module; a pooling is an "
                 r"nn\.Module \(trainables\.poolings\.base\)"),
])
def test_a_plugin_pooling_of_the_wrong_shape_fails_its_trial_in_one_line(site, tiny_bert, synthetic_data_dir,
                                                                         tmp_path, name, said):
    """A plugin's pooling that returns the token states (or is no module) would meet a loss or a cosine that
    broadcasts, or fail deep inside one: the trial stops at its first batch with one line naming the pooling."""
    from trainables.errors import UserInputError
    from trainables.kinds import get_kind

    install(site, "shape-plugin", "0.1", {"poolings": {"unpooled": "shape_plugin:UNPOOLED",
                                                       "function": "shape_plugin:FUNCTION"}},
            {"shape_plugin/__init__.py": SHAPES})
    registry.refresh()
    config = {"task": "stsb", "model": tiny_bert, "data_dir": str(synthetic_data_dir), "epochs": 1, "batch_size": 16,
              "max_seq_length": 32, "num_threads": 1, "cache_dir": str(tmp_path), "device": "cpu", "layer": 2,
              "seed": 0, "score_test": False, "export_model": False, "pooling": name, "max_train_samples": 32,
              "max_eval_samples": 16}
    with pytest.raises(UserInputError) as failed:
        get_kind("finetune").run(config, lambda metrics, checkpoint_dir=None: None)
    assert re.fullmatch(f"pooling: '{name}' is not valid; {said}", str(failed.value)), str(failed.value)

