"""`orchestrator doctor`'s tracking-server checks where no real server is needed: a URL nothing answers,
and a server that answers /health while its backend fails every request (as MLflow does when its
database is down). Each fails in one line, fast (no retries), and leaves MLflow's settings as they were.
The checks against a real server on PostgreSQL are in tests/orchestrator/test_postgres.py (slow)."""

from __future__ import annotations

import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from orchestrator.checks.doctor import QUICK_REQUESTS, tracking_checks
from tests.services import free_port


class DatabaseDown(BaseHTTPRequestHandler):
    """/health says OK; every API request is a 500, as MLflow's server answers with its database down."""

    requests: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.requests.append(self.path)
        if self.path == "/health":
            self._answer(200, b"OK")
        else:
            self._answer(500, b'{"error_code": "INTERNAL_ERROR", "message": "connection to server refused"}')

    do_POST = do_GET  # noqa: N815

    def _answer(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture()
def database_down():
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), DatabaseDown)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    DatabaseDown.requests = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join()


def test_a_url_nothing_answers_fails_in_one_line():
    uri = f"http://127.0.0.1:{free_port()}"
    checks = tracking_checks(uri)
    assert [(c.name, c.ok) for c in checks] == [("tracking server", False)]
    assert checks[0].detail.startswith(f"{uri} does not answer (") and checks[0].detail.endswith(
        "; start it or fix the URL")


def test_a_server_whose_backend_fails_is_one_failed_line_without_retries(database_down, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "7")  # the user's own setting, restored afterwards
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    started = time.monotonic()
    checks = tracking_checks(database_down)
    took = time.monotonic() - started
    assert [(c.name, c.ok) for c in checks] == [("tracking server", True), ("tracking backend", False)]
    assert checks[0].detail.startswith(f"{database_down} answers in ")
    assert "(is the database up and writable?)" in checks[1].detail and "\n" not in checks[1].detail
    assert took < 20, f"{took:.0f} s: MLflow retried the failing request"
    api_requests = [p for p in DatabaseDown.requests if p != "/health"]
    assert len(api_requests) == 1, api_requests  # one request, not retried
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "7" and "MLFLOW_HTTP_REQUEST_TIMEOUT" not in os.environ
    assert set(QUICK_REQUESTS) >= {"MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"}


def test_a_sqlite_store_is_checked_where_the_study_would_write_it(tmp_path):
    assert tracking_checks("sqlite:///mlflow.db", base=tmp_path)[0].ok
    blocked = tmp_path / "file"
    blocked.write_text("")
    checks = tracking_checks("sqlite:///file/mlflow.db", base=tmp_path)
    assert [(c.name, c.ok) for c in checks] == [("tracking", False)]
