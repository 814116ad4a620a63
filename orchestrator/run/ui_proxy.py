"""MLflow's UI behind a same-origin proxy that opens runs in the model-training view, and lets in
only the browser tab it serves.

MLflow 3.17 keeps a GenAI / model-training mode per browser in localStorage
(`mlflow.workflowType_v1`, default `genai`); the runs table's links carry no mode, so in a browser
that never chose one a clicked run opens in the GenAI view (mlflow/mlflow#24498), whatever the
experiment's tag or the URL the user started from. `orchestrator ui` serves MLflow through this
proxy, which adds one line of script to the page's head: the mode is set to model training unless
the browser already holds a choice, and MLflow's chat assistant is not opened on a first visit (its
button stays).

The proxy serves MLflow's REST API, which can delete runs, so it keeps the checks MLflow's own server
would make on its port: a request whose `Host` is not the loopback name the proxy listens on is
refused (DNS rebinding: a foreign site whose name resolves to 127.0.0.1), and so is a state-changing
request (POST, PUT, PATCH, DELETE) whose `Origin` (or, without one, `Referer`) is not the proxy's own
origin (a foreign page's form or fetch). Each refusal is a 403 and one log line. It listens on
127.0.0.1 only. A client that hangs up before its answer is written (a browser tab closed, a poll
that timed out) ends that request quietly.

optuna-dashboard (`orchestrator ui --optuna`) is served through the same proxy, its pages unchanged: it makes
no such checks itself (a foreign page's DELETE of /api/studies/0 removed a cell's Optuna study, and a
rebound name read them all), and it can delete studies and trials.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import re
import sys
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

MODE_KEY = "mlflow.workflowType_v1"
# MLflow 3.17 opens its chat assistant (an LLM provider to set up, a quarter of the window) on a
# browser's first visit unless this is set; the button that opens it stays
ASSISTANT_SHOWN_KEY = "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1"
BROWSER_DEFAULTS = {MODE_KEY: "machine_learning", ASSISTANT_SHOWN_KEY: True}  # set only where the browser has none
SCRIPT = ("<script>try{" + "".join(f'if(!localStorage.getItem("{key}"))localStorage.setItem("{key}",'
                                   f'{json.dumps(json.dumps(value))});' for key, value in BROWSER_DEFAULTS.items())
          + "}catch(e){}</script>").encode()
# per-connection headers, and what the proxy sets itself (the length of a rewritten page; the
# browser's origin, which MLflow's own cross-origin checks would compare with its port, not ours:
# the proxy makes those checks itself, against its own origin)
DROPPED = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
           "transfer-encoding", "upgrade", "content-length", "host", "accept-encoding", "origin", "referer"}
WRITES = {"POST", "PUT", "PATCH", "DELETE"}
LOOPBACK_NAMES = ("127.0.0.1", "localhost")  # what a browser on this machine sends for the printed URL
HUNG_UP = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)
SHARED_VIEW = "ablation"  # the runs page at ?viewStateShareKey=ablation opens the study's view (tracking.py)
SHARED_VIEW_TAG = f"mlflow.sharedViewState.{SHARED_VIEW}"


def inject(page: bytes) -> bytes:
    """The page with the mode script as the first thing in its head."""
    return re.sub(rb"(<head[^>]*>)", lambda m: m.group(1) + SCRIPT, page, count=1, flags=re.IGNORECASE)


def refusal(method: str, headers, port: int) -> str | None:
    """Why a request may not pass (one line for the log), or None when it may."""
    hosts = {f"{name}:{port}" for name in LOOPBACK_NAMES}
    host = (headers.get("Host") or "").strip().lower()
    if host not in hosts:
        return f"Host {host or '(none)'!r} is not {' or '.join(sorted(hosts))} (DNS rebinding?)"
    if method not in WRITES:
        return None
    own = {f"http://{h}" for h in hosts}
    origin = headers.get("Origin")
    if origin is not None:
        return None if origin.strip().lower() in own else f"Origin {origin!r} is not this UI's"
    referer = headers.get("Referer")
    if referer is None:
        return "neither Origin nor Referer says it comes from this UI"
    parts = urlsplit(referer.strip())
    if f"{parts.scheme}://{parts.netloc}".lower() in own:
        return None
    return f"Referer {referer[:100]!r} is not this UI's"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: ModeProxy

    def _forward(self) -> None:
        try:
            why = refusal(self.command, self.headers, self.server.server_address[1])
            if why:
                self.server.log(f"ui: refused {self.command} {self.path[:100]}: {why} (403)")
                self.send_error(403, "Forbidden: not a request of this UI")
                return
            self._pass_on()
        except HUNG_UP:
            self.close_connection = True  # the client went away: nothing to answer, nothing to report

    def _pass_on(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in DROPPED}
        upstream = http.client.HTTPConnection("127.0.0.1", self.server.upstream_port, timeout=300)
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
        except OSError as exc:  # the server not up yet, or gone
            self.send_error(502, f"the UI's server is not answering ({exc})")
            return
        finally:
            upstream.close()
        if self.server.rewrite_pages and "text/html" in (response.getheader("Content-Type") or ""):
            data = inject(data)
        self.send_response(response.status, response.reason)
        for key, value in response.getheaders():
            if key.lower() not in DROPPED:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _forward

    def log_message(self, format, *args) -> None:  # noqa: A002 (the base class's name)
        pass


def to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class ModeProxy(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, upstream_port: int, log: Callable[[str], None] = to_stderr,
                 rewrite_pages: bool = True):
        super().__init__(("127.0.0.1", port), _Handler)
        self.upstream_port = upstream_port
        self.log = log
        self.rewrite_pages = rewrite_pages

    def handle_error(self, request, client_address) -> None:
        """One line instead of socketserver's traceback; a client that hung up is no error at all."""
        error = sys.exc_info()[1]
        if not isinstance(error, HUNG_UP):
            self.log(f"ui: a request failed: {type(error).__name__}: {str(error)[:200]}")


def start_proxy(port: int, upstream_port: int, log: Callable[[str], None] = to_stderr,
                rewrite_pages: bool = True) -> ModeProxy:
    """Serve 127.0.0.1:`port` from 127.0.0.1:`upstream_port` in a daemon thread; refusals go to `log`;
    `rewrite_pages`: MLflow's pages get the mode script (False: pages pass unchanged)."""
    proxy = ModeProxy(port, upstream_port, log, rewrite_pages)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    return proxy


def sqlite_runs_path(uri: str, name: str) -> str:
    """`runs_path` of a SQLite store, read with sqlite3 (read only): importing MLflow here would cost the
    UI's start seconds and this process hundreds of MiB."""
    import sqlite3

    database = uri.removeprefix("sqlite:///")
    try:
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as store:
            found = store.execute("SELECT experiment_id FROM experiments WHERE name = ? AND lifecycle_stage = "
                                  "'active'", (name,)).fetchone()
            if found is None:
                return ""
            shared = store.execute("SELECT 1 FROM experiment_tags WHERE experiment_id = ? AND key = ?",
                                   (found[0], SHARED_VIEW_TAG)).fetchone()
    except sqlite3.Error:
        return ""
    return experiment_path(str(found[0]), shared is not None)


def experiment_path(experiment_id: str, shared_view: bool) -> str:
    """The UI path of an experiment's runs table. MLflow 3 keeps a GenAI / model-training mode per
    browser (GenAI by default); `workflowType` in the URL opens the model-training runs table, and
    `viewStateShareKey` the study's own view (grouped by the ablation axes) when it has one."""
    view = f"&viewStateShareKey={SHARED_VIEW}" if shared_view else ""
    return f"#/experiments/{experiment_id}/runs?workflowType=machine_learning{view}"
