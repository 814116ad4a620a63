"""A study tracked on an MLflow server (a real `mlflow server` on SQLite, instant trials, no Ray): MLflow
prints two "View run/experiment at" lines for every run it closes on a server, after a request that reads
the run back; a launch turns them off, unless the user asked for them."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from tests.orchestrator.test_cluster import write_study
from tests.services import MlflowServer


@pytest.fixture()
def server(tmp_path):
    folder = tmp_path / "server"
    folder.mkdir()
    server = MlflowServer(folder).start()
    try:
        yield server
    finally:
        server.stop()


def launch_instant(folder, model, data_dir, uri):
    from benchmarks.instant import instant_executor
    from orchestrator.run.launcher import launch

    folder.mkdir()
    study = write_study(folder, model, data_dir, uri, name=folder.name)
    return launch(study, storage=folder / "studies", progress=False,
                  executor=instant_executor(lambda config, seed, epoch: 50.0 + epoch + config["layer"], slots=2))


@pytest.mark.slow  # starting an mlflow server takes 10 to 30 s
def test_a_launch_on_a_server_prints_no_run_links_unless_asked(server, tiny_bert, synthetic_data_dir, tmp_path,
                                                             capfd, monkeypatch):
    monkeypatch.delenv("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", raising=False)
    result = launch_instant(tmp_path / "quiet", tiny_bert, synthetic_data_dir, server.uri)
    assert result.finished and result.counts["completed"] == 4
    assert "View run" not in capfd.readouterr().out
    client = MlflowClient(server.uri)
    runs = client.search_runs([client.get_experiment_by_name("quiet").experiment_id])
    assert len(runs) == 5 and {r.info.status for r in runs} == {"FINISHED"}  # the study's run and its 4 trials

    monkeypatch.setenv("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "false")  # the user's own setting wins
    launch_instant(tmp_path / "links", tiny_bert, synthetic_data_dir, server.uri)
    assert capfd.readouterr().out.count("🏃 View run ") >= 4
