"""Ray's own log lines during a launch go to the study's log file, not the terminal.

Ray Tune reports what the launch already handles (a full disk, a worker killed for memory, an
interrupted run whose trial folders are gone: "Failed to fetch metrics for N trial(s)") with its
own tracebacks on stderr, dozens of lines above the one line the launch writes. While the trials
run, the `ray` loggers write to `<study folder>/launch.log` instead (appended, one header per
launch); a log that cannot be written (the disk that filled up) drops its lines without a word.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
from collections.abc import Iterator
from pathlib import Path

LAUNCH_LOG = "launch.log"


class QuietFileHandler(logging.FileHandler):
    """A file handler that never reports its own failure: on a full disk, logging's default would
    print a `--- Logging error ---` traceback for every line."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        pass


@contextlib.contextmanager
def ray_logs_to(path: Path, header: str) -> Iterator[None]:
    """Send every `ray*` logger's lines to `path` while the block runs; the terminal gets none."""
    handler = QuietFileHandler(path, delay=True, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    loggers = [logging.getLogger("ray")] + [
        logger for name, logger in logging.Logger.manager.loggerDict.items()
        if name.startswith("ray.") and isinstance(logger, logging.Logger) and logger.handlers]
    saved = [(logger, logger.handlers[:], logger.propagate) for logger in loggers]
    for logger in loggers:
        logger.handlers = [handler] if logger.name == "ray" else []
        logger.propagate = logger.name != "ray"
    logging.getLogger("ray").info("%s at %s", header, datetime.datetime.now().isoformat(timespec="seconds"))
    try:
        yield
    finally:
        for logger, handlers, propagate in saved:
            logger.handlers, logger.propagate = handlers, propagate
        with contextlib.suppress(OSError):  # the last buffered lines on a full disk
            handler.close()
