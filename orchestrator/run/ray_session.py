"""The driver's Ray: a fresh local one unless an address is given, a cluster checked against what a trial
asks for, and the signals around a launch (SIGTERM and SIGHUP take Ctrl-C's path; a local Ray stopped under
the launch ends it in one line; Ctrl-C held off while Ray shuts down), with no AWS credential forwarded to
the trials."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from orchestrator.study.config import StudyConfig
from trainables.errors import UserInputError

# What each Ray worker of a study needs set. A trial's worker is handed to the next trial (reuse_actors) once the
# last one's training thread ends, and Tune waits only TUNE_FUNCTION_THREAD_TIMEOUT_S (2 s) for that: on a loaded
# machine a pruned trial's thread took longer to wind down (its last journal line, MLflow's last call), the next
# trial failed ("Trainable runner reuse requires reset_config()") and the study then waited on it for good.
WORKER_ENV = {"TUNE_FUNCTION_THREAD_TIMEOUT_S": "300"}


def connect_ray(address: str | None):
    """A fresh local Ray unless an address is given (argument or RAY_ADDRESS); never a stray one."""
    import ray

    target = address or os.environ.get("RAY_ADDRESS") or "local"
    if ray.is_initialized():
        return ray
    if target == "local":  # Ray's advice about its own default token auth is not the user's business here
        logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    try:
        with hangup_ignored_by_children(target == "local"):
            ray.init(address=target, include_dashboard=False, log_to_driver=False, configure_logging=False,
                     runtime_env={"env_vars": WORKER_ENV})
    except (ConnectionError, ValueError, RuntimeError) as exc:
        auth = "" if os.environ.get("RAY_AUTH_MODE") == "token" else (
            "; if the cluster uses token authentication, set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN or "
            "RAY_AUTH_TOKEN_PATH as on its nodes")
        raise UserInputError("--address", target, f"cannot reach a Ray cluster there ({exc}); start one or "
                                                  f"omit --address for a local Ray{auth}") from None
    return ray


@contextlib.contextmanager
def hangup_ignored_by_children(local: bool):
    """A local Ray's daemons and workers start with SIGHUP ignored (an ignored signal stays ignored
    across exec): a closed terminal sends SIGHUP to the whole process group, and a GCS and raylet that
    died of it left the driver waiting 60 s for its cluster, then ending with exit 1, instead of
    stopping the trials at their checkpoints as it does (`graceful_sigterm`). The driver's own
    handling of SIGHUP is restored at once."""
    if not local or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)


def check_cluster(ray, study: StudyConfig) -> None:
    """A trial runs on one node: its request must fit the largest alive node, not the cluster's
    total (a request no node meets would make Tune wait forever)."""
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive", n.get("alive", True))]
    largest_cpu = max((r.get("CPU", 0) for r in nodes), default=0)
    largest_gpu = max((r.get("GPU", 0) for r in nodes), default=0)
    total_gpu = sum(r.get("GPU", 0) for r in nodes)
    if study.resources.gpu > 0 and total_gpu == 0:
        raise UserInputError("resources.gpu", study.resources.gpu,
                             "the cluster has 0 GPUs; use gpu: 0 or a cluster with GPUs")
    if study.resources.gpu > largest_gpu:
        raise UserInputError("resources.gpu", study.resources.gpu,
                             f"no node has {study.resources.gpu:g} GPUs (the largest has {largest_gpu:g}); ask for at "
                             "most that many per trial")
    if study.resources.cpu > largest_cpu:
        raise UserInputError("resources.cpu", study.resources.cpu,
                             f"no node has {study.resources.cpu:g} CPUs (the largest of {len(nodes)} has "
                             f"{largest_cpu:g}); ask for at most that many per trial")


SECRETS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SECURITY_TOKEN", "AWS_SESSION_TOKEN")


@contextlib.contextmanager
def no_forwarded_secrets():
    """Tune copies the driver's AWS credentials into every trial's runtime environment, and Ray's
    runtime-env agent writes that environment in plain text to a world-readable log in its session
    folder. The trials read and write only the study folder (a local path) and never talk to S3:
    the credentials stay with the driver (which may need them for MLflow's artifact store)."""
    from ray.tune.execution import class_cache

    forwarded = getattr(class_cache, "ENV_VARS_TO_PROPAGATE", None)
    if not isinstance(forwarded, set | frozenset):  # a Ray that no longer does this
        yield
        return
    class_cache.ENV_VARS_TO_PROPAGATE = type(forwarded)(forwarded - set(SECRETS))
    try:
        yield
    finally:
        class_cache.ENV_VARS_TO_PROPAGATE = forwarded


@dataclasses.dataclass
class Stops:
    """How a launch is stopped and what its caller hears of it. `signal`: the stop signal (SIGTERM,
    SIGHUP) that stopped it, set by `graceful_sigterm` (None: Ctrl-C, or none); `on_lost(code)`: what to
    do when a stop signal stopped the local Ray too (a SIGTERM to the whole process group), given the
    exit code 128 + that signal (the CLI ends there with its one line); None (the Python API's default)
    waits for Ray as Ray does."""

    on_lost: Callable[[int], None] | None = None
    signal: int | None = None


def shutdown_ray() -> None:
    """Disconnect from Ray (a local one stops) with Ctrl-C held off for the second it takes: a Ctrl-C
    that landed in Ray's own shutdown at exit printed an `Exception ignored in atexit callback`
    traceback below the launch's last line. Nothing to do when Ray was never started."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        ray.shutdown()
    except Exception as exc:  # a cluster already gone: nothing left to stop
        logging.getLogger("orchestrator").debug("ray.shutdown: %s", exc)
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def graceful_sigterm(stops: Stops | None = None):
    """SIGTERM (a scheduler's or `kill`'s stop) and SIGHUP (the terminal closed) take the path of
    Ctrl-C: Tune stops the trials at their last checkpoints and returns, so the runs are closed and
    `resume` continues. A SIGHUP that is ignored (`nohup`) stays ignored. The stop goes through Tune's
    SIGINT handler where one is set, else it is raised as KeyboardInterrupt here, so a launch whose SIGINT
    is ignored (started in the background by a script) still stops. The signal is kept in `stops`."""
    stops = stops if stops is not None else Stops()
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    returned = threading.Event()  # Tune returned: Ray's own stop from here on is no loss
    watch_local_ray(returned, stops.on_lost)

    def on_term(signum, frame):
        stops.signal = signum
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler) and handler is not signal.default_int_handler:
            os.kill(os.getpid(), signal.SIGINT)  # Tune's own Ctrl-C path: trials stop at their checkpoints
        else:  # Python's Ctrl-C, or SIGINT ignored (a launch started with `&` from a script): raised here
            raise KeyboardInterrupt

    caught = [signal.SIGTERM] + [signal.SIGHUP] * (signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN)
    previous = {stop: signal.signal(stop, on_term) for stop in caught}
    try:
        yield
    finally:
        returned.set()
        for stop, handler in previous.items():
            signal.signal(stop, handler)


def local_ray_processes() -> dict[str, list]:
    """The daemons of the Ray this process started, by type (`subprocess.Popen`s: `gcs_server`, `raylet`,
    ...); empty when it joined a cluster or Ray keeps them elsewhere than Ray 2.x's `_global_node`."""
    try:
        from ray._private import worker

        return {kind: [info.process for info in infos]
                for kind, infos in worker._global_node.all_processes.items()}
    except (ImportError, AttributeError):
        return {}


ESSENTIAL = ("gcs_server", "raylet")  # without either, no trial can run or stop


def watch_local_ray(returned: threading.Event, on_lost: Callable[[int], None] | None,
                    poll_s: float = 0.25) -> None:
    """While Tune runs, watch the local Ray's GCS and raylet. A SIGTERM sent to the whole process group
    (`kill -TERM -PGID`, a scheduler stopping every process) stops them as well as the driver, whose main
    thread then waits inside Ray for 60 s and ends with exit 1 and Ray's C++ log line, its own signal
    handler never reached (measured: the raylet exits about 10 s after the signal, the GCS stops answering).
    When one of them is gone before Tune returned, the CLI's `on_lost` ends the launch at once with its
    one line: the journal holds every finished result, so `resume` continues as after any crash. The
    exit code is 128 + the signal that ended a Ray process (SIGTERM: 143), else 1. The Python API (no
    `on_lost`) keeps Ray's behaviour."""
    processes = local_ray_processes()
    essential = [p for kind in ESSENTIAL for p in processes.get(kind, [])]
    if on_lost is None or not essential:
        return

    def watch() -> None:
        while all(p.poll() is None for p in essential) and not returned.is_set():
            time.sleep(poll_s)
        if returned.is_set():
            return
        time.sleep(poll_s)  # the other daemons' codes settle
        signals = [-p.returncode for ps in processes.values() for p in ps if (p.poll() or 0) < 0]
        on_lost(128 + signals[0] if signals else 1)

    threading.Thread(target=watch, name="local-ray-watch", daemon=True).start()


def slots(study: StudyConfig, total: dict[str, float], max_concurrent: int | None = None) -> int:
    """How many trials a cluster of `total` resources (Ray's names) runs at once for this study's
    per-trial request; `--max-concurrent` wins (a cluster that will grow: say how far)."""
    if max_concurrent:
        return max_concurrent
    counts = [int(total.get("CPU", 0) // study.resources.cpu)] if study.resources.cpu > 0 else []
    if study.resources.gpu > 0:
        counts.append(int(total.get("GPU", 0) // study.resources.gpu))
    return max(1, min(counts) if counts else 1)
