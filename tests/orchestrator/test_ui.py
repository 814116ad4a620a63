"""`orchestrator ui`: the proxy in front of MLflow lets in only requests of its own page (no foreign
Host: DNS rebinding; no foreign Origin or Referer on a write: cross-site requests), answers a client
that hung up without a traceback, and the UI starts as three quiet processes."""

from __future__ import annotations

import http.client
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.run.ui_proxy import refusal, start_proxy

PORT = 5123
OWN = {f"http://127.0.0.1:{PORT}", f"http://localhost:{PORT}"}


def headers(**values: str) -> dict:
    return {k.replace("_", "-").title(): v for k, v in values.items()}


@pytest.mark.parametrize(("method", "given_headers", "verdict"), [
    ("GET", headers(host=f"127.0.0.1:{PORT}"), None),
    ("GET", headers(host=f"localhost:{PORT}"), None),
    ("GET", headers(host=f"evil.example:{PORT}"), "Host 'evil.example:5123' is not"),
    ("GET", headers(host="127.0.0.1:80"), "Host '127.0.0.1:80' is not"),
    ("GET", {}, "Host '(none)' is not"),
    ("POST", headers(host=f"127.0.0.1:{PORT}", origin=f"http://127.0.0.1:{PORT}"), None),
    ("DELETE", headers(host=f"127.0.0.1:{PORT}", referer=f"http://127.0.0.1:{PORT}/#/experiments/1"), None),
    ("POST", headers(host=f"127.0.0.1:{PORT}", origin="http://evil.example"), "Origin 'http://evil.example' is not"),
    ("POST", headers(host=f"127.0.0.1:{PORT}", origin="null"), "Origin 'null' is not"),
    ("PATCH", headers(host=f"127.0.0.1:{PORT}", origin=f"https://127.0.0.1:{PORT}"), "Origin"),
    ("PUT", headers(host=f"127.0.0.1:{PORT}", referer=f"http://127.0.0.1:{PORT}.evil.example/"), "Referer"),
    ("DELETE", headers(host=f"127.0.0.1:{PORT}"), "neither Origin nor Referer"),
    ("POST", headers(host=f"127.0.0.1:{PORT}", origin="http://evil.example", referer=f"http://127.0.0.1:{PORT}/"),
     "Origin 'http://evil.example' is not"),  # the browser's Origin decides, not a Referer it may forge
])
def test_the_proxy_lets_in_only_its_own_pages_requests(method, given_headers, verdict):
    why = refusal(method, given_headers, PORT)
    assert (why is None) if verdict is None else (why is not None and why.startswith(verdict)), why


HOSTS = st.one_of(st.text(max_size=40), st.sampled_from([f"127.0.0.1:{PORT}", f"localhost:{PORT}"]).flatmap(
    lambda own: st.sampled_from([own, own.upper(), own + ".", "x" + own, own + "0", own.replace(":", "")])))


@settings(max_examples=300, deadline=None)
@given(method=st.sampled_from(["GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE"]), host=HOSTS,
       origin=st.one_of(st.none(), st.text(max_size=40), st.sampled_from(sorted(OWN))),
       referer=st.one_of(st.none(), st.text(max_size=60), st.sampled_from([f"{o}/x" for o in sorted(OWN)])))
def test_no_foreign_host_and_no_foreign_write_gets_through(method, host, origin, referer):
    given_headers = {"Host": host, **({"Origin": origin} if origin is not None else {}),
                     **({"Referer": referer} if referer is not None else {})}
    why = refusal(method, given_headers, PORT)
    own_host = host.strip().lower() in {f"127.0.0.1:{PORT}", f"localhost:{PORT}"}
    if not own_host:
        assert why is not None and why.startswith("Host")
    elif method in ("GET", "HEAD", "OPTIONS"):
        assert why is None
    elif origin is not None:
        assert (why is None) == (origin.strip().lower() in OWN)
    else:
        assert (why is None) == (referer is not None and any(
            referer.strip().lower().startswith(o + "/") or referer.strip().lower() == o for o in OWN))
    assert why is None or "\n" not in why  # one log line


def test_a_client_that_hangs_up_is_no_error_and_a_refusal_is_one_log_line():
    """The UI polled its own proxy with a 2 s timeout while MLflow was starting: the proxy then wrote
    into a closed connection and socketserver printed a 20-line BrokenPipeError traceback."""

    class SlowUpstream(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            time.sleep(1.0)  # MLflow still starting
            body = b"<html><head></head><body>" + b"x" * 2_000_000 + b"</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowUpstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    lines: list[str] = []
    proxy = start_proxy(0, upstream.server_address[1], log=lines.append)
    port = proxy.server_address[1]
    try:
        for _ in range(3):  # ask, then hang up before the answer comes
            with socket.create_connection(("127.0.0.1", port)) as client:
                client.sendall(f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        time.sleep(2.5)
        assert lines == []  # nothing reported, not even a line
        refused = urllib.request.Request(f"http://127.0.0.1:{port}/ajax-api/2.0/mlflow/runs/delete", method="POST",
                                         data=b'{"run_id": "r"}', headers={"Origin": "http://evil.example"})
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(refused, timeout=10)
        assert answer.value.code == 403
        assert lines == ["ui: refused POST /ajax-api/2.0/mlflow/runs/delete: Origin 'http://evil.example' is not "
                         "this UI's (403)"]
    finally:
        proxy.shutdown()
        upstream.shutdown()


def make_study(folder: Path, model: str, data_dir: Path) -> Path:
    from benchmarks.instant import instant_executor
    from orchestrator.run.launcher import launch

    study = folder / "s.yaml"
    study.write_text(yaml.safe_dump({"name": "s", "model": model, "ablate": {"layer": [1, 2]},
                                     "replicate": {"seeds": [0, 1]}, "train": {"epochs": 1},
                                     "data_dir": str(data_dir),
                                     "tracking": {"mlflow_uri": f"sqlite:///{folder / 'mlflow.db'}"}}))
    launch(study, storage=folder / "studies", progress=False,
           executor=instant_executor(lambda config, seed, epoch: 50.0 + config.get("layer", 0)))
    return folder / "studies"


def call(port: int, method: str, path: str, body: dict | None = None, **extra: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        sent = {"Host": f"127.0.0.1:{port}", "Content-Type": "application/json", **extra}
        connection.request(method, path, body=json.dumps(body).encode() if body is not None else None,
                           headers=sent)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


@pytest.mark.slow
def test_a_running_ui_refuses_foreign_hosts_and_cross_origin_writes_and_serves_its_own_page(
        tiny_bert, synthetic_data_dir, tmp_path):
    """Against a running `orchestrator ui`: a cross-origin POST (delete a run) and DELETE are refused and
    the run is still there; a foreign Host is refused; the page's own requests (same origin) pass, writes
    included; a client hanging up mid-answer costs nothing; three processes, no traceback."""
    import psutil

    storage = make_study(tmp_path, tiny_bert, synthetic_data_dir)
    ui = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "ui", "s", "--storage", str(storage),
                           "--port", str(PORT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          cwd=tmp_path, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        started = time.monotonic()
        line = ui.stdout.readline()
        assert "MLflow UI for s: http://127.0.0.1:" in line, (line, ui.stderr.read() if ui.poll() is not None else "")
        print(f"URL after {time.monotonic() - started:.1f} s")
        port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
        assert [p.name() for p in psutil.Process(ui.pid).children(recursive=True)].__len__() == 2  # mlflow, uvicorn
        status, found = call(port, "POST", "/ajax-api/2.0/mlflow/runs/search", {"experiment_ids": ["1"]},
                             Origin=f"http://127.0.0.1:{port}")
        assert status == 200, found
        runs = json.loads(found)["runs"]
        child = next(r for r in runs if r["data"].get("tags") and any(
            t["key"] == "mlflow.parentRunId" for t in r["data"]["tags"]))["info"]["run_id"]
        assert call(port, "POST", "/ajax-api/2.0/mlflow/runs/delete", {"run_id": child},
                    Origin="http://evil.example")[0] == 403
        assert call(port, "POST", "/ajax-api/2.0/mlflow/runs/delete", {"run_id": child},
                    Referer="http://evil.example/page")[0] == 403
        assert call(port, "DELETE", f"/ajax-api/2.0/mlflow/runs/delete?run_id={child}",
                    Origin="http://evil.example")[0] == 403
        assert call(port, "GET", "/ajax-api/2.0/mlflow/experiments/search?max_results=5",
                    Host=f"rebound.example:{port}")[0] == 403
        status, shown = call(port, "GET", f"/ajax-api/2.0/mlflow/runs/get?run_id={child}")
        assert status == 200 and json.loads(shown)["run"]["info"]["lifecycle_stage"] == "active"  # still there
        assert call(port, "POST", "/ajax-api/2.0/mlflow/runs/set-tag", {"run_id": child, "key": "note",
                                                                        "value": "kept"},
                    Origin=f"http://127.0.0.1:{port}")[0] == 200  # the page's own write passes
        status, page = call(port, "GET", "/")
        assert status == 200 and b"mlflow.workflowType_v1" in page
        with socket.create_connection(("127.0.0.1", port)) as client:  # ask for the page and hang up
            client.sendall(f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        time.sleep(1.0)
    finally:
        ui.send_signal(signal.SIGINT)
        out, err = ui.communicate(timeout=60)
    assert ui.returncode == 0, err
    refused = [x for x in err.splitlines() if x.strip()]
    assert len(refused) == 4 and all(x.startswith("ui: refused ") and x.endswith("(403)") for x in refused), err
    from mlflow.tracking import MlflowClient

    run = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(child)
    assert run.info.lifecycle_stage == "active" and run.data.tags["note"] == "kept"


@pytest.mark.slow
def test_optuna_dashboard_serves_at_the_url_it_prints_behind_the_uis_checks_while_another_ui_holds_the_port(tmp_path):
    """With the MLflow UI already on the asked port, `ui NAME --optuna` used to print a URL that opened
    MLflow, fail to start, and exit 0; and it looked for optuna-dashboard only on PATH."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import urllib.request

    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    folder = tmp_path / "studies" / "s"
    folder.mkdir(parents=True)
    storage = JournalStorage(JournalFileBackend(str(folder / "optuna.log")))
    study = optuna.create_study(storage=storage, study_name="s layer=1")
    study.optimize(lambda trial: trial.suggest_float("lr", 1e-5, 1e-3, log=True), n_trials=2)
    env = {**os.environ, "PATH": "/usr/bin:/bin"}  # the venv is not activated, as in the README
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        ui = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "ui", "s", "--optuna", "--storage",
                               str(tmp_path / "studies"), "--port", str(taken)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env,
                              # as a background job of a script starts it: SIGINT ignored (it was not stopped)
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        try:
            line = ui.stdout.readline()
            assert line.startswith("optuna-dashboard for s (one Optuna study per cell): http://127.0.0.1:"), (
                line, ui.stderr.read() if ui.poll() is not None else "")
            url = line.split()[-4]
            assert f":{taken}/" not in url
            with urllib.request.urlopen(url, timeout=10) as page:
                assert page.status == 200 and "optuna" in page.read().decode().lower()
            # optuna-dashboard checks neither Host nor Origin: a foreign page deleted a cell's study, a rebound
            # name read them all; behind the UI's proxy both are refused, and the page's own requests pass
            port = int(url.split("http://127.0.0.1:")[1].split("/")[0])
            assert call(port, "DELETE", "/api/studies/0", Origin="http://evil.example")[0] == 403
            assert call(port, "GET", "/api/studies", Host=f"rebound.example:{port}")[0] == 403
            status, listed = call(port, "GET", "/api/studies")
            assert status == 200 and [s["study_name"] for s in json.loads(listed)["study_summaries"]] == ["s layer=1"]
        finally:
            ui.send_signal(signal.SIGINT)
            ui.wait(timeout=90)  # it stops its server (10 s at most, then a kill); a loaded CI machine is slow
        said = ui.stderr.read()
        assert f"port {taken} is busy" in said
        refused = [line for line in said.splitlines() if line.startswith("ui: refused ")]
        assert len(refused) == 2 and all(line.endswith("(403)") for line in refused), said
    assert [s.study_name for s in optuna.get_all_study_summaries(storage)] == ["s layer=1"]  # nothing deleted
