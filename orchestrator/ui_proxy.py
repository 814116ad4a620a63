"""MLflow's UI behind a same-origin proxy that opens runs in the model-training view.

MLflow 3.17 keeps a GenAI / model-training mode per browser in localStorage
(`mlflow.workflowType_v1`, default `genai`); the runs table's links carry no mode, so in a browser
that never chose one a clicked run opens in the GenAI view (mlflow/mlflow#24498), whatever the
experiment's tag or the URL the user started from. `orchestrator ui` serves MLflow through this
proxy, which adds one line of script to the page's head: the mode is set to model training unless
the browser already holds a choice. Everything else is passed through unchanged.
"""

from __future__ import annotations

import http.client
import http.server
import re
import threading

MODE_KEY = "mlflow.workflowType_v1"
SCRIPT = (f'<script>try{{if(!localStorage.getItem("{MODE_KEY}"))'
          f'localStorage.setItem("{MODE_KEY}",JSON.stringify("machine_learning"))}}catch(e){{}}</script>').encode()
# per-connection headers, and what the proxy sets itself (the length of a rewritten page; the
# browser's origin, which MLflow's own cross-origin checks would compare with its port, not ours)
DROPPED = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
           "transfer-encoding", "upgrade", "content-length", "host", "accept-encoding", "origin", "referer"}


def inject(page: bytes) -> bytes:
    """The page with the mode script as the first thing in its head."""
    return re.sub(rb"(<head[^>]*>)", lambda m: m.group(1) + SCRIPT, page, count=1, flags=re.IGNORECASE)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: ModeProxy

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in DROPPED}
        upstream = http.client.HTTPConnection("127.0.0.1", self.server.upstream_port, timeout=300)
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
        except OSError as exc:  # MLflow not up yet, or gone
            self.send_error(502, f"MLflow is not answering ({exc})")
            return
        finally:
            upstream.close()
        if "text/html" in (response.getheader("Content-Type") or ""):
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


class ModeProxy(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, upstream_port: int):
        super().__init__(("127.0.0.1", port), _Handler)
        self.upstream_port = upstream_port


def start_proxy(port: int, upstream_port: int) -> ModeProxy:
    """Serve 127.0.0.1:`port` from 127.0.0.1:`upstream_port` in a daemon thread."""
    proxy = ModeProxy(port, upstream_port)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    return proxy
