"""Is the Hugging Face hub reachable from here? Answered once per process in at most a second and a half, so
that a machine without network fails in one line instead of the hub clients' retry loops (five retries with
backoff, about 25 s per file)."""

from __future__ import annotations

import functools
import os
import socket
import sys
import threading
from urllib.parse import urlparse

OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
CHECK_TIMEOUT_S = 1.5


def offline_by_setting() -> bool:
    """The user said so: HF_HUB_OFFLINE (or the datasets / transformers variable) is set."""
    return any(os.environ.get(name, "0").strip().lower() in ("1", "true", "yes", "on") for name in OFFLINE_VARIABLES)


def endpoint() -> tuple[str, int]:
    """Host and port of the hub (HF_ENDPOINT, default https://huggingface.co)."""
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)


def can_connect(host: str, port: int, timeout_s: float) -> bool:
    """A TCP connection to host:port within the timeout. The name lookup has no timeout of its own, so
    the attempt runs in a thread that is abandoned when it takes too long."""
    answers: list[bool] = []

    def attempt() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                answers.append(True)
        except OSError:
            answers.append(False)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(timeout_s)
    return bool(answers and answers[0])


@functools.lru_cache(maxsize=1)
def hub_reachable() -> bool:
    """False when an offline variable is set or the hub's host does not accept a connection in 1.5 s."""
    if offline_by_setting():
        return False
    return can_connect(*endpoint(), CHECK_TIMEOUT_S)


def offline_unless_reachable() -> None:
    """When the hub cannot be reached, put the hub clients of this process (and of the processes it starts)
    in offline mode: files in the Hugging Face cache still load, and a missing one fails at once instead of
    after the clients' retries."""
    if hub_reachable():
        return
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    try:  # the clients read the variables when imported: tell the ones already imported too
        import huggingface_hub.constants as hub_constants
    except ImportError:  # pragma: no cover - a dependency of transformers
        return
    hub_constants.HF_HUB_OFFLINE = True
    if "datasets" in sys.modules:
        import datasets.config

        datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True
