"""`results()`: a study's trials and their learning curves as tidy DataFrames, from the study folder's
journal and its MLflow store, agreeing with what MLflow (and so the report) holds."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from benchmarks.instant import instant_executor
from orchestrator.run.launcher import launch
from orchestrator.run.tune_adapters import trial_metrics
from orchestrator.study.frames import results
from reports.collect import collect
from trainables.errors import UserInputError

EPOCHS = 3


def score(config: dict, seed: int, epoch: int) -> float:
    """Dev peaks at epoch 2; deeper layers and a warmup near 0.1 score higher."""
    return 40 + 10 * config["layer"] + seed - (epoch - 2) ** 2 - 50 * (config.get("warmup_ratio", 0.1) - 0.1) ** 2


def write_study(folder, tiny_bert, data_dir, name="r", **changes):
    spec = {"name": name, "model": tiny_bert, "ablate": {"layer": [1, 2]},
            "tune": {"params": {"warmup_ratio": {"uniform": [0.0, 0.2]}}, "trials": 3, "startup_trials": 1},
            "replicate": {"seeds": [0, 1]}, "train": {"epochs": EPOCHS}, "data_dir": str(data_dir),
            "tracking": {"mlflow_uri": f"sqlite:///{folder / 'mlflow.db'}"}, **changes}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture(scope="module")
def launched(tmp_path_factory, tiny_bert, synthetic_data_dir):
    folder = tmp_path_factory.mktemp("results")
    result = launch(write_study(folder, tiny_bert, synthetic_data_dir), storage=folder / "studies", progress=False,
                    executor=instant_executor(score))
    assert result.finished
    return folder


def test_one_row_per_trial_with_the_scores_mlflow_and_the_report_hold(launched):
    runs = results("r", launched / "studies")
    assert list(runs.columns) == ["study", "cell", "layer", "phase", "seed", "trial_key", "outcome",
                                  "best_dev_spearman", "best_epoch", "test_spearman", "epochs", "warmup_ratio",
                                  "params", "duration_s", "error", "run_id"]
    assert len(runs) == 10 and list(runs.phase) == ["tune"] * 3 + ["replicate"] * 2 + ["tune"] * 3 + ["replicate"] * 2
    assert list(runs.layer) == [1] * 5 + [2] * 5 and set(runs.study) == {"r"}
    journal = {}
    for line in (launched / "studies" / "r" / "journal.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "issued":
            journal[event["key"]] = event
    for row in runs.itertuples():
        config = journal[row.trial_key]["config"]
        curve = {epoch: score(config, config["seed"], epoch) for epoch in range(1, row.epochs + 1)}
        assert row.best_dev_spearman == pytest.approx(max(curve.values()))
        assert row.best_epoch == max(curve, key=curve.get) == (2 if row.epochs >= 2 else 1)
        assert row.warmup_ratio == journal[row.trial_key]["tuned"]["warmup_ratio"]
        assert row.params == 1000 * (1 + row.layer) and row.duration_s >= 0
    replicates = runs[runs.phase == "replicate"]
    assert (replicates.outcome == "completed").all() and (replicates.epochs == EPOCHS).all()
    assert list(replicates.seed) == [0, 1, 0, 1]
    # selection looks at dev: each cell's replicates rerun its best fully trained tuning config
    for layer, cell in runs.groupby("layer"):
        tuned = cell[(cell.phase == "tune") & (cell.epochs == EPOCHS)]
        chosen = tuned.loc[tuned.best_dev_spearman.idxmax(), "warmup_ratio"]
        assert (cell[cell.phase == "replicate"].warmup_ratio == chosen).all(), layer
    # what the report reads from MLflow: the same runs, the same test scores
    uri = f"sqlite:///{launched / 'mlflow.db'}"
    reported = collect(uri, "r").runs.set_index("trial_key")
    assert set(reported.index) == set(runs.trial_key)
    for row in runs.itertuples():
        assert reported.loc[row.trial_key, "run_id"] == row.run_id
        if row.phase == "replicate":
            assert reported.loc[row.trial_key, "test_spearman"] == pytest.approx(row.test_spearman)
        else:
            assert row.test_spearman != row.test_spearman  # NaN: test is scored once per replicate only
    assert (reported.loc[list(runs.trial_key), "best_dev_spearman"].to_numpy()
            == pytest.approx(runs.best_dev_spearman.to_numpy()))


def test_phase_and_cell_filters(launched):
    storage = launched / "studies"
    assert set(results("r", storage, phase="replicate").phase) == {"replicate"}
    by_values = results("r", storage, cell={"layer": 2})
    assert set(by_values.layer) == {2} and len(by_values) == 5
    assert by_values.equals(results("r", storage, cell="layer=2"))
    both = results("r", storage, phase="tune", cell={"layer": 1})
    assert list(both.trial_key) == ["c0-t0", "c0-t1", "c0-t2"]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"phase": "replicates"}, "phase: 'replicates' is not valid; use tune or replicate (or None for both)"),
    ({"cell": {"layer": 7}}, "cell: {'layer': 7} is not valid; no cell of the study has those values; its cells: "
                             "layer=1, layer=2"),
    ({"cell": "layer=7"}, "cell: 'layer=7' is not valid; no cell of the study has those values; its cells: "
                          "layer=1, layer=2"),
    ({"cell": {"pooling": "cls"}}, "cell: {'pooling': 'cls'} is not valid; the study's axes are layer; pooling "
                                   "is not one of them"),
])
def test_a_bad_filter_is_one_line(launched, kwargs, message):
    with pytest.raises(UserInputError) as refused:
        results("r", launched / "studies", **kwargs)
    assert str(refused.value) == message


def test_curves_have_one_row_per_trial_and_epoch(launched):
    runs = results("r", launched / "studies")
    curves = results("r", launched / "studies", curves=True)
    assert list(curves.columns) == ["study", "cell", "layer", "phase", "seed", "trial_key", "run_id", "epoch",
                                    "train_loss", "dev_spearman"]
    assert len(curves) == runs.epochs.sum()  # pruned tuning trials stop early: fewer rows
    per_trial = curves.groupby("trial_key").epoch.apply(list)
    for row in runs.itertuples():
        assert per_trial[row.trial_key] == list(range(1, row.epochs + 1))
    assert (curves.train_loss == 1.0 / curves.epoch).all()
    best = curves.groupby("trial_key").dev_spearman.max()
    assert best[list(runs.trial_key)].to_numpy() == pytest.approx(runs.best_dev_spearman.to_numpy())
    assert dict(zip(curves.trial_key, curves.run_id, strict=True)) == dict(zip(runs.trial_key, runs.run_id,
                                                                                strict=True))
    replicate = results("r", launched / "studies", curves=True, phase="replicate", cell={"layer": 1})
    assert len(replicate) == 2 * EPOCHS and set(replicate.seed) == {0, 1}


def test_results_need_neither_torch_nor_ray_and_stand_without_the_store(launched, tmp_path):
    """Like `status`: a laptop with the study folder and no GPU stack, and a store gone missing."""
    probe = ("import sys; from orchestrator.study.frames import results; "
             f"frame = results('r', {str(launched / 'studies')!r}); "
             "print(len(frame), sorted(m for m in ('torch', 'transformers', 'ray', 'sentence_transformers') "
             "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "10 []", done.stderr[-2000:]

    moved = tmp_path / "copy"
    import shutil

    shutil.copytree(launched / "studies", moved)  # the folder without its store (a copy on a laptop)
    meta = json.loads((moved / "r" / "launch.json").read_text())
    meta["tracking_uri"] = f"sqlite:///{tmp_path / 'gone.db'}"
    (moved / "r" / "launch.json").write_text(json.dumps(meta))
    alone = results("r", moved)
    assert len(alone) == 10 and alone.run_id.isna().all() and not (tmp_path / "gone.db").exists()
    assert alone.drop(columns="run_id").equals(results("r", launched / "studies").drop(columns="run_id"))


def test_an_interrupted_study_shows_what_finished_and_what_did_not(tmp_path, tiny_bert, synthetic_data_dir):
    def stop(finished: int) -> None:
        if finished == 3:
            raise KeyboardInterrupt

    study = write_study(tmp_path, tiny_bert, synthetic_data_dir, name="cut", tune=None,
                        replicate={"seeds": [0, 1, 2]})
    with pytest.raises(KeyboardInterrupt):  # 4 trials at a time: the 4th is in its 2nd epoch, 2 not started
        launch(study, storage=tmp_path / "studies", progress=False,
               executor=instant_executor(score, slots=4, on_finished=stop))
    runs = results("cut", tmp_path / "studies")
    assert sorted(runs.outcome) == ["completed"] * 3 + ["interrupted"]
    unfinished = runs[runs.outcome == "interrupted"].iloc[0]
    assert unfinished.epochs == 2 and unfinished.test_spearman != unfinished.test_spearman  # NaN: no test yet
    assert unfinished.best_dev_spearman == pytest.approx(score({"layer": unfinished.layer}, unfinished.seed, 2))


def test_the_journal_keeps_what_a_trial_reported_not_its_flattened_config():
    """Tune's scheduler sees the trial's config flattened into `config/...` keys: 2 kB per epoch in the
    journal, already in the trial's `issued` line."""
    result = {"epoch": 1, "dev_spearman": 71.5, "config/trial/lr": 2e-5, "config/cell": "layer=1",
              "config": {"trial": {}}, "time_total_s": 3.0, "trial_id": "x"}
    assert trial_metrics(result) == {"epoch": 1, "dev_spearman": 71.5}


def test_run_ids_read_from_sqlite_are_the_runs_mlflow_returns(launched):
    """The SQLite shortcut (10,000 runs: 17 s through `search_runs`, 0.1 s through sqlite3) must return the
    runs MLflow's own search does: the study's parent's children, not deleted ones, not stage runs."""
    from mlflow.tracking import MlflowClient

    from reports.store import search_all, sqlite_child_run_ids, study_parent

    uri = f"sqlite:///{launched / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment, parent = study_parent(client, "r")
    children = search_all(client, [experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    stage = client.create_run(experiment.experiment_id, tags={"mlflow.parentRunId": parent.info.run_id,
                                                               "orchestrator.role": "stage",
                                                               "orchestrator.trial_key": "stage"})
    deleted = children[0]
    client.delete_run(deleted.info.run_id)
    try:
        expected = {r.data.tags["orchestrator.trial_key"]: r.info.run_id for r in search_all(
            client, [experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
            if r.data.tags.get("orchestrator.role") != "stage"}
        found = sqlite_child_run_ids(launched / "mlflow.db", "r", parent.data.tags["orchestrator.study_uid"])
        assert found == expected and len(found) == 9 and deleted.info.run_id not in found.values()
        assert sqlite_child_run_ids(launched / "mlflow.db", "r", None) == expected  # the newest parent
        assert sqlite_child_run_ids(launched / "mlflow.db", "r", "another-folder") == {}
        assert sqlite_child_run_ids(launched / "mlflow.db", "nothing", None) == {}
    finally:
        client.restore_run(deleted.info.run_id)
        client.delete_run(stage.info.run_id)
