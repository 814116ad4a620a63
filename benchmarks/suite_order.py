"""The order `make test` hands test files to its workers, and what it costs at the end of the suite.

`make test` runs the suite in three processes, each test file whole in one of them (pytest-xdist's
`--dist loadfile`). xdist hands a worker the next file when it has two tests or fewer left, in an order
it chooses: by default the files with the most tests first, so a file with one long test (the docs' run,
about ten minutes) starts last and runs alone at the end while the other workers idle. The suite's
conftest orders the files by their measured seconds instead (`tests/durations.json`, longest first) and
the Makefile asks xdist to keep that order (`--no-loadscope-reorder`).

This script reads the per-test seconds of one real run (pytest's `--junitxml`), and replays xdist's
scheduling rule on them for both orders, side by side: the same tests, the same seconds, the same rule;
only the order differs. The durations were measured with three workers sharing two cores, so the
replay shows what the order changes, not the next run's wall time, which only a run measures.

    python benchmarks/suite_order.py run.xml              # replay both orders
    python benchmarks/suite_order.py run.xml --write      # and refresh tests/durations.json
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DURATIONS = REPO / "tests" / "durations.json"
PREFETCH = 2  # xdist's LoadScopeScheduling: a worker with this many tests left or fewer gets the next file


def read_junit(path: Path) -> dict[str, list[float]]:
    """Each test file (repository path) with the seconds of its tests (setup, call and teardown)."""
    files: dict[str, list[float]] = defaultdict(list)
    for case in ET.parse(path).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        for end in range(len(parts), 0, -1):  # `tests.orchestrator.test_x.TestClass`: the longest file prefix
            candidate = "/".join(parts[:end]) + ".py"
            if (REPO / candidate).is_file():
                files[candidate].append(float(case.get("time", 0)))
                break
    return dict(files)


def makespan(order: list[str], files: dict[str, list[float]], workers: int = 3) -> tuple[float, list[float]]:
    """When the last worker ends, replaying xdist's rule: each worker starts with one file; after each of
    its tests, a worker left with PREFETCH tests or fewer takes the next file in `order`."""
    queue = list(order)
    pending: list[list[float]] = [[] for _ in range(workers)]
    clock = [0.0] * workers
    for worker in range(workers):
        if queue:
            pending[worker].extend(files[queue.pop(0)])
    while any(pending):
        worker = min((w for w in range(workers) if pending[w]), key=lambda w: clock[w] + pending[w][0])
        clock[worker] += pending[worker].pop(0)
        if len(pending[worker]) <= PREFETCH and queue:
            pending[worker].extend(files[queue.pop(0)])
    return max(clock), clock


def by_count(files: dict[str, list[float]]) -> list[str]:
    """xdist's default (`--loadscope-reorder`): the files with the most tests first."""
    return sorted(files, key=lambda f: -len(files[f]))


def by_seconds(files: dict[str, list[float]], weights: dict[str, float]) -> list[str]:
    """The conftest's order: the longest files first by their recorded seconds (a file not recorded:
    the median, so a new file neither jumps the queue nor waits for the end)."""
    known = sorted(weights.values())
    middle = known[len(known) // 2] if known else 0.0
    return sorted(files, key=lambda f: -weights.get(f, middle))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit", type=Path, help="pytest --junitxml of a `make test` run")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="write tests/durations.json from this run")
    args = parser.parse_args()
    files = read_junit(args.junit)
    seconds = {f: round(sum(t), 1) for f, t in files.items()}
    total = sum(seconds.values())
    print(f"{len(files)} files, {sum(len(t) for t in files.values())} tests, {total:.0f} s of tests in all "
          f"({total / args.workers:.0f} s per worker if perfectly shared)")
    rows = [("xdist's default (most tests first)", by_count(files)),
            ("longest first (tests/durations.json)", by_seconds(files, seconds))]
    if DURATIONS.is_file() and not args.write:
        rows.append(("longest first (the recorded durations)", by_seconds(files, json.loads(DURATIONS.read_text()))))
    base = None
    for label, order in rows:
        end, clocks = makespan(order, files, args.workers)
        base = base or end
        print(f"{label:42s} last worker ends at {end:7.0f} s  (workers {', '.join(f'{c:.0f}' for c in clocks)}; "
              f"{end / base:.3f} of the default)")
    if args.write:
        DURATIONS.write_text(json.dumps(dict(sorted(seconds.items(), key=lambda kv: -kv[1])), indent=0) + "\n")
        print(f"wrote {DURATIONS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
