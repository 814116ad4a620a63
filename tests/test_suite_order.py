"""The suite's own order: files longest first (tests/durations.json), and xdist's hand-out rule replayed."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from benchmarks.suite_order import by_count, by_seconds, makespan
from tests.conftest import REPO, longest_files_first


def test_a_long_file_with_one_test_started_last_runs_alone_at_the_end():
    """Three workers; the ten-minute single test last (most tests first) ends at 600 + what came before;
    longest first it starts at once and the others share the rest."""
    files = {"docs.py": [600.0], "many.py": [10.0] * 30, "faults.py": [200.0, 200.0], "small.py": [5.0] * 4}
    assert by_count(files)[-1] == "docs.py" and by_seconds(files, {f: sum(t) for f, t in files.items()})[0] == "docs.py"
    late, _ = makespan(by_count(files), files, workers=3)
    early, clocks = makespan(by_seconds(files, {f: sum(t) for f, t in files.items()}), files, workers=3)
    assert early == 600.0 and late > early and sum(clocks) == sum(map(sum, files.values()))


def test_a_worker_takes_the_next_file_when_two_tests_or_fewer_are_left():
    """xdist's rule: a worker left with 2 tests or fewer is handed the next file even while a long test runs,
    so that file waits behind it while another worker idles (a's 300-s test holds e.py back 100 s)."""
    files = {"a.py": [1.0, 1.0, 1.0, 300.0], "b.py": [50.0], "e.py": [100.0]}
    end, clocks = makespan(["a.py", "b.py", "e.py"], files, workers=2)
    assert clocks == [403.0, 50.0] and end == 403.0


def test_the_conftest_orders_files_by_their_recorded_seconds_and_keeps_each_files_order():
    recorded = json.loads((REPO / "tests" / "durations.json").read_text())
    assert recorded and all(isinstance(v, int | float) and v >= 0 for v in recorded.values())
    assert all((REPO / path).is_file() for path in recorded)  # a renamed file is caught here
    heaviest = max(recorded, key=recorded.get)
    lightest = min(recorded, key=recorded.get)
    items = [SimpleNamespace(path=REPO / lightest, name="one"), SimpleNamespace(path=REPO / heaviest, name="two"),
             SimpleNamespace(path=REPO / lightest, name="three"), SimpleNamespace(path=Path(REPO / "tests" / "new.py"),
                                                                               name="four")]
    ordered = [item.name for item in longest_files_first(items)]
    assert ordered[0] == "two" and ordered.index("one") < ordered.index("three")  # stable within a file
