from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app

runner = CliRunner()


def test_probe_json_prints_one_object_per_layer(tiny_bert, synthetic_data_dir):
    result = runner.invoke(app, ["probe", "--model", tiny_bert, "--data-dir", str(synthetic_data_dir), "--json",
                                 "--split", "dev", "--pooling", "cls"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["layer"] for r in rows] == [0, 1, 2, 3]
    assert {"layer", "spearman", "pearson", "params", "pooling"} <= set(rows[0])
    assert rows[0]["pooling"] == "cls" and rows[0]["split"] == "dev"
    # CLS at layer 0 is the same vector for every sentence: no correlation. A random tiny BERT's CLS above it
    # has collapsed (every cosine within 1e-4) but still differs per sentence: scored, with its spread
    assert rows[0]["spearman"] is None and rows[0]["pearson"] is None and rows[0]["cosine_spread"] == 0.0
    assert all(isinstance(r["spearman"], float) and 0 < r["cosine_spread"] < 1e-4 for r in rows[1:])
    table = runner.invoke(app, ["probe", "--model", tiny_bert, "--data-dir", str(synthetic_data_dir), "--split",
                                "dev", "--pooling", "cls"])
    assert "° collapsed (every cosine within 1e-4 of the others), cosine spread: layer 1 " in table.stdout
    layer_1 = next(line for line in table.stdout.splitlines() if line.strip("│ ").startswith("1 "))
    assert "°" in layer_1 and "—" not in layer_1
    assert "—" in next(line for line in table.stdout.splitlines() if line.strip("│ ").startswith("0 "))
    result = runner.invoke(app, ["probe", "--model", tiny_bert, "--data-dir", str(synthetic_data_dir), "--json",
                                 "--split", "dev", "--pooling", "mean"])
    assert all(isinstance(json.loads(line)["spearman"], float) for line in result.stdout.splitlines())


def test_probe_table_marks_only_the_layers_that_collapsed(capsys):
    """A probe's rows as api.probe's DataFrame gives them: every row carries `cosine_spread`, NaN where the
    layer did not collapse. Only the collapsed layer gets its ° and its spread under the table."""
    import pandas as pd

    from orchestrator.cli.probe import print_layer_table

    rows = pd.DataFrame([{"layer": 4, "spearman": 73.5, "pearson": 72.0, "params": 1e6},
                         {"layer": 5, "spearman": 60.0, "pearson": 61.0, "params": 2e6, "cosine_spread": 3e-5},
                         {"layer": 6, "spearman": 70.0, "pearson": 69.0, "params": 3e6}]).to_dict("records")
    assert all("cosine_spread" in r for r in rows)  # NaN, not absent
    print_layer_table(rows, "t")
    out = capsys.readouterr().out
    marked = [line for line in out.splitlines() if "°" in line and "│" in line]
    assert len(marked) == 1 and marked[0].strip("│ ").startswith("5 ")
    assert out.splitlines()[-1] == "° collapsed (every cosine within 1e-4 of the others), cosine spread: layer 5 3.0e-5"
    assert "nan" not in out


def test_probe_table_marks_the_best_layer(tiny_bert, synthetic_data_dir):
    result = runner.invoke(app, ["probe", "--model", tiny_bert, "--data-dir", str(synthetic_data_dir),
                                 "--layers", "1,3"])
    assert result.exit_code == 0, result.output
    assert "spearman ×100" in result.stdout and "params (M)" in result.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--task", "stsbb"], "error: task: 'stsbb' is not valid; use one of: korsts, mrpc"),
    (["--task", "stsb_multi_mt", "--language", "xx"], "error: language: 'xx' is not valid; task stsb_multi_mt has"),
    (["--pooling", "sum"], "error: pooling: 'sum' is not valid; use one of: cls, last_token, max, mean, mean_sqrt_len"),
    (["--layers", "0,9"], "error: layers: [0, 9] is not valid; this model has 3 layers: use values in 0..3"),
    (["--layers", "last"], "error: --layers: 'last' is not valid; use `all` or layer numbers such as 0,3,6"),
    (["--split", "train"], "error: --split: 'train' is not valid; use dev or test"),
    (["--precision", "fp8"], "error: precision: 'fp8' is not valid; use one of: auto, bf16, fp32"),
])
def test_bad_arguments_end_in_one_line_and_exit_2(tiny_bert, synthetic_data_dir, args, message):
    result = runner.invoke(app, ["probe", "--model", tiny_bert, "--data-dir", str(synthetic_data_dir), *args])
    assert result.exit_code == 2
    assert result.stderr.strip().startswith(message) and len(result.stderr.strip().splitlines()) == 1
    assert result.stdout == ""


def test_missing_data_offline_is_exit_2_from_the_console_script(tiny_bert, tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-m", "orchestrator.cli", "probe", "--model", tiny_bert,
                             "--data-dir", str(tmp_path)], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: task: 'stsb' has no data here; put stsb/sts-train.csv, stsb/sts-dev.csv, stsb/sts-test.csv under the "
        f"data folder {tmp_path}, or go online: the hub copy sentence-transformers/stsb cannot be reached from here"]


@pytest.mark.slow
def test_minilm_probe_from_the_command_line(data_dir, minilm_path):
    result = runner.invoke(app, ["probe", "--model", "sentence-transformers/all-MiniLM-L6-v2", "--task", "stsb",
                                 "--split", "test", "--layers", "all", "--json", "--data-dir", str(data_dir)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == 7 and 81.7 <= rows[6]["spearman"] <= 82.1


def test_a_server_that_cannot_start_is_one_line_and_exit_1(capsys):
    import sys

    import typer

    from orchestrator.cli.ui import free_port, serve

    port = free_port(5999)
    with pytest.raises(typer.Exit) as ended:
        serve([sys.executable, "-c", "import sys; sys.exit('address already in use')"], port, "", "a UI")
    assert ended.value.exit_code == 1
    assert capsys.readouterr().err == "error: a UI could not start (exit 1): address already in use\n"


def test_a_busy_port_is_replaced_by_a_free_one(capsys):
    import socket

    from orchestrator.cli.ui import free_port

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        chosen = free_port(taken)
        assert chosen != taken and capsys.readouterr().err == f"port {taken} is busy: using {chosen}\n"


def test_the_ui_proxy_passes_everything_through_and_sets_the_model_training_mode_in_pages():
    """`orchestrator ui` serves MLflow through a proxy: pages get one script that sets MLflow's mode
    to model training unless the browser chose one; requests, bodies and statuses pass unchanged."""
    import http.server
    import json
    import threading
    import urllib.error
    import urllib.request

    from orchestrator.cli.ui import system_port
    from orchestrator.run.ui_proxy import MODE_KEY, start_proxy

    seen = []

    class Upstream(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/missing":
                self.send_error(404)
                return
            page = b'<!doctype html><html lang="en"><head><meta charset="utf-8"/></head><body>app</body></html>'
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen.append((self.path, body, self.headers.get("Origin")))
            answer = json.dumps({"runs": [], "echo": json.loads(body)}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", system_port()), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    port = system_port()
    proxy = start_proxy(port, upstream.server_address[1])
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/") as page:
            html = page.read().decode()
        assert html.startswith(f'<!doctype html><html lang="en"><head><script>try{{if(!localStorage.getItem('
                               f'"{MODE_KEY}"))')
        assert html.endswith('</script><meta charset="utf-8"/></head><body>app</body></html>')
        request = urllib.request.Request(f"http://127.0.0.1:{port}/ajax-api/2.0/mlflow/runs/search",
                                         data=b'{"max_results": 3}', method="POST",
                                         headers={"Content-Type": "application/json", "Origin": f"http://127.0.0.1:{port}"})
        with urllib.request.urlopen(request) as answer:
            assert json.loads(answer.read()) == {"runs": [], "echo": {"max_results": 3}}
        assert seen == [("/ajax-api/2.0/mlflow/runs/search", b'{"max_results": 3}', None)]  # no foreign origin
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/missing")
        assert missing.value.code == 404
    finally:
        proxy.shutdown()
        upstream.shutdown()
    down = start_proxy(system_port(), system_port())  # nothing upstream: 502, not a hang
    try:
        with pytest.raises(urllib.error.HTTPError) as bad:
            urllib.request.urlopen(f"http://127.0.0.1:{down.server_address[1]}/", timeout=10)
        assert bad.value.code == 502
    finally:
        down.shutdown()
