"""The tracking setup recommended at scale, for real: an `mlflow server` on a private PostgreSQL cluster
(Debian's `postgresql`, `initdb` into a temp folder, 127.0.0.1 only) with a proxied artifact store. The
database restarts mid-study; the launch rides it out, replays what the outage missed, and the report
that `verify` recomputes from the server is the study's."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from orchestrator.study.journal import Journal
from tests.orchestrator.test_cluster import assert_fully_tracked, orchestrator, wait_for, write_study
from tests.services import MlflowServer, PostgresCluster, postgres_bin

pytestmark = [pytest.mark.slow, pytest.mark.skipif(postgres_bin() is None, reason="PostgreSQL is not installed "
                                                   "(Debian: apt-get install postgresql)")]


@pytest.fixture()
def postgres():
    pytest.importorskip("psycopg", reason="the extra ablation-orchestrator[postgres] is not installed")
    cluster = PostgresCluster().start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture()
def server(postgres, tmp_path):
    folder = tmp_path / "server"
    folder.mkdir()
    server = MlflowServer(folder, backend=postgres.uri).start()
    try:
        yield server
    finally:
        server.stop()


def test_doctor_checks_the_server_its_database_its_artifact_store_and_its_latency(server, postgres, tmp_path):
    env = {k: v for k, v in {**os.environ, "HF_HUB_OFFLINE": "1"}.items() if k != "RAY_AUTH_MODE"}
    doctor = orchestrator("doctor", "--tracking-uri", server.uri, "--storage", str(tmp_path / "studies"), env=env,
                          cwd=tmp_path, timeout=300)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr[-2000:]
    print(doctor.stdout)
    lines = doctor.stdout.splitlines()
    assert f"ok    tracking server: {server.uri} answers in " in doctor.stdout
    assert "ok    tracking backend: a run created, 10 writes read back" in lines
    latency = next(line for line in lines if line.startswith("ok    tracking latency: "))
    assert re.fullmatch(r"ok    tracking latency: a write median \d+ ms, max \d+ ms; a read median \d+ ms, max \d+ ms "
                        r"\(10 requests each\)", latency)
    assert "ok    tracking artifacts: the artifact store (mlflow-artifacts:/1) " \
        "written by every node (1) and read back" in lines
    assert not [p for p in (server.folder / "artifacts").rglob("*") if p.is_file()]  # the probe's files are gone

    postgres.halt()  # the server still answers /health, its database does not
    down = orchestrator("doctor", "--tracking-uri", server.uri, "--storage", str(tmp_path / "studies"), env=env,
                        cwd=tmp_path, timeout=300)
    assert down.returncode == 1
    failed = [line for line in down.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1 and failed[0].startswith("FAIL  tracking backend: ") and "is the database up" in failed[0]
    postgres.run()


def test_a_database_restart_mid_study_loses_nothing_and_verify_agrees_with_the_report(
        server, postgres, tiny_bert, synthetic_data_dir, tmp_path):
    study = write_study(tmp_path, tiny_bert, synthetic_data_dir, server.uri, replicate={"seeds": [0, 1, 2, 3]},
                        train={"epochs": 4, "batch_size": 8, "max_seq_length": 32}, data={})
    env = {k: v for k, v in {**os.environ, "HF_HUB_OFFLINE": "1"}.items() if k != "RAY_AUTH_MODE"}
    driver = orchestrator("launch", str(study), "--storage", str(tmp_path / "studies"), env=env, cwd=tmp_path,
                          background=True)
    journal = Journal(tmp_path / "studies" / "cluster" / "journal.jsonl")
    wait_for(journal, lambda events: any(e["event"] == "result" for e in events), driver)
    before = len([e for e in journal.events() if e["event"] == "result"])
    started = time.monotonic()
    postgres.restart(outage_s=5)
    outage_s = time.monotonic() - started
    during = len([e for e in journal.events() if e["event"] == "result"])
    out, err = driver.communicate(timeout=900)
    assert driver.returncode == 0, err[-3000:]
    assert during > before  # training went on while the database was down
    assert "training goes on" in err and "is back: replayed" in err, err[-3000:]
    print(f"database down {outage_s:.1f} s during {during - before} results; "
          + re.search(r"is back: replayed \{[^}]*\}", err)[0])
    assert "report: reports/cluster/report.md" in out
    assert "View run" not in out  # MLflow's two lines per closed run on a server (and their request) are off
    assert_fully_tracked(server.uri, trials=8)

    report = orchestrator("report", "cluster", "--storage", str(tmp_path / "studies"), "--out", str(tmp_path / "r"),
                          env=env, cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-2000:]
    verified = orchestrator("verify", str(tmp_path / "r"), env=env, cwd=tmp_path)
    assert verified.returncode == 0, verified.stderr[-2000:]
    assert verified.stdout.startswith(f"ok: every number of {tmp_path / 'r'} (2 cells) matches MLflow")
    assert (tmp_path / "r" / "report.md").read_text() == (tmp_path / "reports" / "cluster" / "report.md").read_text()
    assert Path(tmp_path / "r" / "runs.csv").read_text().count("\n") == 9  # a header and 8 runs
