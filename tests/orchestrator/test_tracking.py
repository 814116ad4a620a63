"""MLflow tracking without Ray: epochs are logged once per run and step, and each study folder has
a parent run of its own."""

from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

from orchestrator.run.tracking import StudyTracker
from orchestrator.study.journal import Outcome, TrialRecord
from reports.record import StudyRecord


def started(tmp_path) -> tuple[str, StudyTracker]:
    """A SQLite store with a study's parent run started."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    study = tmp_path / "study.yaml"
    study.write_text("name: s\n")
    tracker = StudyTracker(uri, "s", tmp_path / "artifacts")
    tracker.start_parent(study, StudyRecord.from_legacy({}, "s"), "0", "uid-1")
    return uri, tracker


@pytest.mark.parametrize(("key", "phase", "seed", "cell", "outcome", "name"), [
    ("c1-s1", "replicate", 1, "layer=2", None, "L2 · s1"),
    ("c1-t1", "tune", 10_000, "layer=2", Outcome.PRUNED, "L2 · tune 1 · pruned"),
    ("c3-t12", "tune", 10_000, "layer=6 pooling=cls", Outcome.COMPLETED, "L6 cls · tune 12"),
    ("c0-s4", "replicate", 4, "model=sentence-transformers/all-MiniLM-L6-v2 language=de", None,
     "all-MiniLM-L6-v2 de · s4"),
    ("c2-s0", "replicate", 0, "lr=3e-05 layer=12", None, "lr=3e-05 L12 · s0"),
    ("c0-s2", "replicate", 2, "all", None, "s2"),
])
def test_run_names_are_short_enough_for_the_runs_table(key, phase, seed, cell, outcome, name):
    from orchestrator.run.run_names import run_name

    record = TrialRecord(key, 0, phase, seed, {}, {})
    record.outcome = outcome
    assert run_name(record, cell) == name


@pytest.mark.parametrize(("cells", "constant", "groups"), [
    ([{"layer": 2, "pooling": "mean"}, {"layer": 4, "pooling": "mean"}], {"pooling"}, ["ablate.layer"]),
    ([{"layer": 2, "pooling": "mean"}, {"layer": 2, "pooling": "cls"}], {"layer"}, ["ablate.pooling"]),
    ([{"layer": 2, "pooling": "mean"}, {"layer": 4, "pooling": "cls"}], set(), ["ablate.layer", "ablate.pooling"]),
    ([{"layer": 2, "pooling": "mean"}], set(), ["ablate.layer", "ablate.pooling"]),  # one cell: its axes name it
])
def test_an_axis_with_one_value_takes_no_group_no_column_and_no_part_of_a_run_name(cells, constant, groups):
    """The quickstart's runs table grouped by layer and by `pooling: mean` (every group header cut off
    at `Group: ablate...`), and named every run `L2 mean · s1`: the tables put such an axis in the caption."""
    from orchestrator.run.run_names import constant_axes, run_name, shared_view

    assert constant_axes(cells) == constant
    view = shared_view({"cells": cells})
    assert [key["groupByData"] for key in view["groupBy"]["groupByKeys"]] == groups
    assert [c for c in view["selectedColumns"] if c.startswith("tags.`ablate.")] == [f"tags.`{g}`" for g in groups]
    record = TrialRecord("c0-s1", 0, "replicate", 1, {}, {})
    expected = {frozenset({"pooling"}): "L2 · s1", frozenset({"layer"}): "mean · s1"}.get(frozenset(constant),
                                                                                      "L2 mean · s1")
    assert run_name(record, "layer=2 pooling=mean", constant_axes(cells)) == expected


def test_a_launch_names_its_runs_without_the_axes_every_cell_shares(tmp_path):
    uri, tracker = started(tmp_path)
    tracker.start_parent(tmp_path / "study.yaml", StudyRecord.from_legacy(
        {"cells": [{"layer": 1, "pooling": "mean"}, {"layer": 2, "pooling": "mean"}]}, "s"), "0", "uid-1")
    record = TrialRecord("c1-s0", 1, "replicate", 0, {}, {"layer": 2, "pooling": "mean"})
    run_id = tracker.start_trial(record, "layer=2 pooling=mean", "ray1")
    assert tracker.client.get_run(run_id).info.run_name == "L2 · s0"


def test_an_epoch_reported_again_is_logged_once_per_run_and_step(tmp_path):
    uri, tracker = started(tmp_path)
    record = TrialRecord("c0-s0", 0, "replicate", 0, {}, {"layer": 1})
    run_id = tracker.start_trial(record, "layer=1", "ray1")
    for epoch in (1, 2, 2):  # the trial was killed after reporting epoch 2 and retried from epoch 1's checkpoint
        tracker.log_epoch("c0-s0", {"epoch": epoch, "dev_spearman": 50.0 + epoch})
    driver = StudyTracker(uri, "s", tmp_path / "artifacts")  # the driver restarted: a resume
    driver.start_parent(tmp_path / "study.yaml", StudyRecord.from_legacy({}, "s"), "0", "uid-1")
    driver.start_trial(record, "layer=1", "ray2")
    for epoch in (2, 3):
        driver.log_epoch("c0-s0", {"epoch": epoch, "dev_spearman": 50.0 + epoch})
    history = MlflowClient(uri).get_metric_history(run_id, "dev_spearman")
    assert sorted(m.step for m in history) == [1, 2, 3]


def test_an_epoch_whose_scores_got_in_but_whose_tags_did_not_is_not_logged_twice(tmp_path):
    """The server stores a batch's metrics and tags in separate transactions: one stopped between them
    held epoch 1's scores without its `epoch` tag, and `sync` (or a resumed driver) logged epoch 1
    again (a CI run saw dev_spearman at steps [1, 1, 2, 3, 4]). The replay now adds only the tags."""
    from mlflow.entities import Metric

    uri, tracker = started(tmp_path)
    record = TrialRecord("c0-s0", 0, "replicate", 0, {}, {"layer": 1})
    run_id = tracker.start_trial(record, "layer=1", "ray1")
    client = MlflowClient(uri)
    client.log_batch(run_id, metrics=[Metric("dev_spearman", 51.0, 0, 1), Metric("train_loss", 0.5, 0, 1)])
    record.results = [{"epoch": 1, "dev_spearman": 51.0, "train_loss": 0.5},
                      {"epoch": 2, "dev_spearman": 52.0, "train_loss": 0.4}]
    replay = StudyTracker(uri, "s", tmp_path / "artifacts")
    replay.attach_parent("uid-1")
    counts = replay.sync({"c0-s0": record}, {0: "layer=1"})
    assert counts["epochs"] == 2
    for key in ("dev_spearman", "train_loss"):
        assert sorted(m.step for m in client.get_metric_history(run_id, key)) == [1, 2]
    assert client.get_run(run_id).data.tags["epoch"] == "2"
    # the same through a resumed driver's first report of the half-logged epoch
    other = TrialRecord("c0-s1", 0, "replicate", 1, {}, {"layer": 1})
    other_id = tracker.start_trial(other, "layer=1", "ray1")
    client.log_batch(other_id, metrics=[Metric("dev_spearman", 61.0, 0, 1)])
    driver = StudyTracker(uri, "s", tmp_path / "artifacts")
    driver.attach_parent("uid-1")
    for epoch in (1, 2):
        driver.log_epoch("c0-s1", {"epoch": epoch, "dev_spearman": 60.0 + epoch})
    assert sorted(m.step for m in client.get_metric_history(other_id, "dev_spearman")) == [1, 2]
    assert client.get_run(other_id).data.tags["epoch"] == "2"


def test_bookkeeping_is_tagged_or_a_param_and_only_scores_are_charted(tmp_path):
    """`epoch`, `best_epoch`, `degenerate` and the parameter count (as a metric named `params`) were
    charted ahead of dev_spearman in MLflow's UI; the report still reads every one of them."""
    from reports.collect import collect

    uri, tracker = started(tmp_path)
    record = TrialRecord("c0-s0", 0, "replicate", 0, {}, {"layer": 1})
    run_id = tracker.start_trial(record, "layer=1", "ray1")
    for epoch in (1, 2):
        tracker.log_epoch("c0-s0", {"epoch": epoch, "dev_spearman": 50.0 + epoch, "train_loss": 1.0 / epoch,
                                    "best_epoch": epoch, "degenerate": 0, "params": 989472,
                                    **({"test_spearman": 49.5, "test_epoch": 2} if epoch == 2 else {})})
    run = MlflowClient(uri).get_run(run_id)
    assert set(run.data.metrics) == {"dev_spearman", "train_loss", "test_spearman"}
    assert {k: run.data.tags[k] for k in ("epoch", "best_epoch", "degenerate", "test_epoch")} == {
        "epoch": "2", "best_epoch": "2", "degenerate": "0", "test_epoch": "2"}
    assert run.data.params["params"] == "989472"
    record.outcome = Outcome.COMPLETED
    tracker.finish_trial(record)
    tracker.reconcile({}, finished=True)
    row = collect(uri, "s").runs.iloc[0]
    assert (row.epoch, row.best_epoch, row.degenerate, row.params, row.dev_spearman) == (2, 2, 0, 989472, 52.0)


def test_a_trial_retried_on_another_node_names_both_and_logs_each_epoch_once(tmp_path):
    """The node travels with the epoch's own request (one request per report, not three)."""
    uri, tracker = started(tmp_path)
    run_id = tracker.start_trial(TrialRecord("c0-s0", 0, "replicate", 0, {}, {"layer": 1}), "layer=1", "ray1")
    for epoch, node in ((1, "10.0.0.2"), (2, "10.0.0.2"), (2, "10.0.0.1"), (3, "10.0.0.1")):
        tracker.log_epoch("c0-s0", {"epoch": epoch, "dev_spearman": 50.0 + epoch}, node)
    run = MlflowClient(uri).get_run(run_id)
    assert run.data.tags["ray.node_ip"] == "10.0.0.1" and run.data.tags["ray.nodes"] == "10.0.0.2,10.0.0.1"
    assert sorted(m.step for m in MlflowClient(uri).get_metric_history(run_id, "dev_spearman")) == [1, 2, 3]


def test_a_new_study_folder_of_the_same_name_gets_its_own_parent(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    study = tmp_path / "study.yaml"
    study.write_text("name: s\n")
    record = TrialRecord("c0-s0", 0, "replicate", 0, {}, {"layer": 1})
    first = StudyTracker(uri, "s", tmp_path / "artifacts")
    old_parent = first.start_parent(study, StudyRecord.from_legacy({}, "s"), "0", "uid-old")
    old_run = first.start_trial(record, "layer=1", "ray1")
    first.log_epoch("c0-s0", {"epoch": 1, "dev_spearman": 40.0})
    again = StudyTracker(uri, "s", tmp_path / "artifacts")  # the journal was deleted: a fresh folder
    new_parent = again.start_parent(study, StudyRecord.from_legacy({}, "s"), "0", "uid-new")
    new_run = again.start_trial(record, "layer=1", "ray2")
    again.log_epoch("c0-s0", {"epoch": 1, "dev_spearman": 60.0})
    assert new_parent != old_parent and new_run != old_run
    client = MlflowClient(uri)
    assert [m.value for m in client.get_metric_history(old_run, "dev_spearman")] == [40.0]
    assert [m.value for m in client.get_metric_history(new_run, "dev_spearman")] == [60.0]
    resumed = StudyTracker(uri, "s", tmp_path / "artifacts")
    # a resume finds its own parent
    assert resumed.start_parent(study, StudyRecord.from_legacy({}, "s"), "0", "uid-old") == old_parent
    assert resumed.children == {"c0-s0": old_run}


def test_the_study_experiment_is_tagged_as_model_training(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    older = client.create_experiment("older")  # an experiment from before the tag
    StudyTracker(uri, "fresh", tmp_path / "artifacts")
    StudyTracker(uri, "older", tmp_path / "artifacts")
    for experiment in (client.get_experiment_by_name("fresh"), client.get_experiment(older)):
        assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"


def test_a_run_that_never_got_its_params_gets_them_from_the_journal(tmp_path, monkeypatch):
    """`sync` killed between creating a run and logging its params (or one failed request there) left
    a run without params or `ablate.*` tags forever, and every later report crashed on it."""
    import yaml

    from orchestrator.study.journal import Outcome
    from reports.aggregate import summarize
    from reports.collect import collect

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({"name": "s", "model": "m", "ablate": {"layer": [1]}}))
    tracker = StudyTracker(uri, "s", tmp_path / "artifacts")
    tracker.start_parent(study, StudyRecord.from_legacy({"cells": [{"layer": 1}], "metric": "dev_spearman",
                                                         "mode": "max", "seeds": [0], "tuned": {}}, "s"), "0", "uid-1")
    record = TrialRecord("c0-s0", 0, "replicate", 0, {}, {"layer": 1, "lr": 2e-5, "seed": 0}, cell_key="layer=1")

    def killed(*args, **kwargs):
        raise ConnectionError("killed right after the run was created")

    monkeypatch.setattr(StudyTracker, "fill_identity", killed)
    with pytest.raises(ConnectionError):
        tracker.start_trial(record, "layer=1", "ray1")
    monkeypatch.undo()
    run = MlflowClient(uri).search_runs([tracker.experiment_id], "tags.`orchestrator.trial_key` = 'c0-s0'")[0]
    assert run.data.params == {} and "ablate.layer" not in run.data.tags
    record.results = [{"epoch": 1, "best_dev_spearman": 80.0, "test_spearman": 77.0}]
    record.outcome = Outcome.COMPLETED
    replay = StudyTracker(uri, "s", tmp_path / "artifacts")
    replay.attach_parent("uid-1")
    counts = replay.sync({"c0-s0": record}, {0: "layer=1"})
    assert counts["filled"] == 5 and counts["runs"] == 0  # 3 params, the ablate tag and the config, on the same run
    again = replay.sync({"c0-s0": record}, {0: "layer=1"})
    assert again["filled"] == 0  # idempotent
    run = MlflowClient(uri).get_run(run.info.run_id)
    assert run.data.params == {"layer": "1", "lr": "2e-05", "seed": "0"} and run.data.tags["ablate.layer"] == "1"
    assert json.loads(run.data.tags["orchestrator.config"]) == record.config  # its types kept, for reproduce
    summary = summarize(collect(uri, "s", "uid-1"))
    assert summary.loc[0, "layer"] == 1 and summary.loc[0, "mean"] == 77.0


def test_every_run_is_read_however_many_pages_the_store_returns(tmp_path, monkeypatch):
    """One search_runs call stops at a page (50,000 at most, silently): stores are read page by page."""
    import reports.store
    from reports.store import search_all

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("e")
    made = {client.create_run(experiment, tags={"k": "v"}).info.run_id for _ in range(5)}
    monkeypatch.setattr(reports.store, "PAGE", 2)
    assert {r.info.run_id for r in search_all(client, [experiment], "tags.k = 'v'")} == made


def test_reconcile_closes_the_open_runs_and_tags_superseded_ones_without_reading_every_run(tmp_path):
    from orchestrator.study.journal import Outcome

    uri, tracker = started(tmp_path)
    records = {key: TrialRecord(key, 0, "replicate", seed, {}, {"layer": 1})
               for seed, key in enumerate(("c0-s0", "c0-s1", "c0-s2"))}
    runs = {key: tracker.start_trial(record, "layer=1", "ray") for key, record in records.items()}
    records["c0-s0"].outcome = Outcome.COMPLETED
    records["c0-s2"].outcome = Outcome.COMPLETED
    tracker.finish_trial(records["c0-s2"])  # closed already; then replaced by more tuning
    records["c0-s2"].superseded = True
    assert tracker.reconcile(records, finished=False) == {"closed": 1, "killed": 1}
    client = MlflowClient(uri)
    assert [client.get_run(runs[k]).info.status for k in records] == ["FINISHED", "KILLED", "FINISHED"]
    assert client.get_run(runs["c0-s0"]).data.tags["outcome"] == "completed"
    assert client.get_run(runs["c0-s2"]).data.tags["orchestrator.superseded"] == "1"
    assert tracker.reconcile(records, finished=False) == {"closed": 0, "killed": 0}  # nothing open is left


@pytest.mark.slow
def test_the_ui_link_opens_the_ablation_grouped_and_a_child_run_in_the_model_training_view(tmp_path):
    """In Debian's chromium, headless: the URL `ui` prints lands on the replicate runs grouped by the
    ablation axis with the scores as columns (it landed on one collapsed parent row with no metric
    column), and a child run's page opens in MLflow's model-training view, not the GenAI one
    (upstream mlflow/mlflow#24498): with `workflowType` in its URL, and through `ui`'s proxy with the
    plain URL a click in the runs table opens."""
    import shutil
    import subprocess
    import sys
    import tempfile
    import time
    import urllib.request

    from orchestrator.cli.ui import runs_path, system_port
    from orchestrator.run.ui_proxy import start_proxy

    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    uri, tracker = started(tmp_path)
    tracker.start_parent(tmp_path / "study.yaml", StudyRecord.from_legacy(
        {"cells": [{"layer": 1}, {"layer": 2}], "metric": "dev_spearman", "replicate_trials": 4}, "s"), "0", "uid-1")
    for layer in (1, 2):
        for seed in (0, 1):
            record = TrialRecord(f"c{layer}-s{seed}", layer - 1, "replicate", seed, {}, {"layer": layer})
            tracker.start_trial(record, f"layer={layer}", f"ray{layer}{seed}")
            tracker.log_epoch(record.key, {"epoch": 1, "dev_spearman": 70.0 + layer, "best_dev_spearman": 70.0 + layer,
                                           "test_spearman": 60.0 + 10 * layer + seed})
            record.outcome = Outcome.COMPLETED
            tracker.finish_trial(record)
    tracker.reconcile({}, finished=True)
    port = system_port()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1",
                               "--port", str(port), "--workers", "1"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)

    def page(path: str, at: int = port) -> str:  # a browser's first visit: a profile of its own each time
        profile = tempfile.mkdtemp(dir=tmp_path)
        done = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1600,1000",
                               f"--user-data-dir={profile}", "--virtual-time-budget=30000", "--dump-dom",
                               f"http://127.0.0.1:{at}/{path}"], capture_output=True, text=True, timeout=180)
        return done.stdout

    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "mlflow ui did not start"
                time.sleep(0.5)
        landing = page(runs_path(uri, "s"))
        assistant = "Ask questions about your experiments"  # MLflow's chat panel, opened on a first visit
        assert "viewStateShareKey=ablation" in runs_path(uri, "s")
        for text in ("Group by: ablate.layer", "Group: 1", "Group: 2", "L1 · s0", "L2 · s1",
                     "best_dev_spearman", "test_spearman"):
            assert text in landing, text
        child = tracker.children["c2-s1"]
        run_page = page(f"#/experiments/{tracker.experiment_id}/runs/{child}?workflowType=machine_learning")
        assert "L2 · s1" in run_page and "Evaluation runs" not in run_page
        plain = f"#/experiments/{tracker.experiment_id}/runs/{child}"  # what a click in the runs table opens
        assert "Evaluation runs" in page(plain)  # the flip, upstream: the mode lives in the browser's localStorage
        proxy = start_proxy(system_port(), port)  # what `orchestrator ui` serves: the mode set in the page's head
        try:
            through = page(plain, proxy.server_address[1])
            assert "L2 · s1" in through and "Evaluation runs" not in through
            assert assistant in landing and assistant not in through  # `ui` does not open the chat on the table
        finally:
            proxy.shutdown()
    finally:
        server.terminate()
        server.wait(timeout=30)
