"""Every runnable command in the docs runs as written (slow): the `bash` blocks of each page, in the order of
the site's navigation, in a scratch copy of the repository with `../shared/data` beside it, as a newcomer
types them. The conventions are the docs' own (docs/contributing.md): blocks of a page share one terminal's
working folder and exported variables; pages after Getting started run with the virtual environment active;
`orchestrator ui` is started, its URL fetched and stopped with Ctrl-C; all-MiniLM-L6-v2 is swapped for a tiny
random BERT of the same depth and the example studies' data and epochs are capped, so the whole site runs in
a few minutes."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import MINILM, save_tiny_bert
from tests.test_docs import DOCS, REPO, fences

pytestmark = pytest.mark.slow

SERVER = re.compile(r"^\s*(\.venv/bin/)?orchestrator ui\b[^\n]*$")
URL = re.compile(r"http://127\.0\.0\.1:\d+/\S*")
CAPS = {"max_train_samples": 64, "max_eval_samples": 64}
BLOCK_TIMEOUT_S = 900


def nav_pages() -> list[Path]:
    """The pages in the navigation's order."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())

    def walk(node):
        if isinstance(node, str):
            yield DOCS / node
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)
        elif isinstance(node, dict):
            for value in node.values():
                yield from walk(value)

    return list(walk(config["nav"]))


def bash_blocks(page: Path) -> list[str]:
    return [body for language, body in fences(page) if language == "bash"]


def shrink_study(text: str, tiny: str) -> str:
    """An example study with the tiny model, capped data and one epoch: the same cells, phases and names."""
    study = yaml.safe_load(text)
    if not isinstance(study, dict) or "name" not in study:
        return text  # not a study file (a cluster recipe)
    if study.get("model") == MINILM:
        study["model"] = tiny
    ablate = study.get("ablate") or {}
    if isinstance(ablate.get("model"), list):
        ablate["model"] = [tiny if m == MINILM else m for m in ablate["model"]]
    data = study.setdefault("data", {}) or {}
    study["data"] = {k: min(v or CAPS[k], CAPS[k]) for k, v in {**CAPS, **data}.items()}
    train = study.setdefault("train", {}) or {}
    if "epochs" in train:
        train["epochs"] = 1
    study["train"] = train
    return yaml.safe_dump(study, sort_keys=False)


def shadow_venv(target: Path) -> None:
    """`.venv` of the scratch copy: the test's own environment seen through links, with a fresh `.installed`
    so that `make setup` has nothing to do (it would otherwise install into the real one)."""
    real = Path(sys.prefix)
    (target / "bin").mkdir(parents=True)
    shutil.copy2(real / "pyvenv.cfg", target / "pyvenv.cfg")
    for entry in real.iterdir():
        if entry.name not in ("bin", "pyvenv.cfg"):
            (target / entry.name).symlink_to(entry)
    for entry in (real / "bin").iterdir():
        if not entry.name.startswith("."):
            (target / "bin" / entry.name).symlink_to(entry)
    for marker in (".installed", ".mpnet", ".docs"):
        (target / "bin" / marker).touch()


@pytest.fixture(scope="module")
def newcomer(tmp_path_factory, data_dir):
    """A checkout beside `shared/data`, as Getting started describes it, with the tiny model swapped in."""
    if shutil.which("make") is None or shutil.which("pdflatex") is None:
        pytest.skip("make and pdflatex are needed (CI installs texlive)")
    root = tmp_path_factory.mktemp("newcomer")
    repo = root / "ablation-orchestrator"
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split("\n")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, repo / name)
    (root / "shared").mkdir()
    (root / "shared" / "data").symlink_to(data_dir)
    tiny = str(save_tiny_bert(root / "tiny-minilm", layers=6))
    for example in (repo / "examples").glob("*.yaml"):
        example.write_text(shrink_study(example.read_text(), tiny))
    shadow_venv(repo / ".venv")
    hidden = ("ORCHESTRATOR_DATA_DIR", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k not in hidden}
    env["PYTHONPATH"] = str(repo)  # the scratch copy's code is what runs (the venv's install points elsewhere)
    return repo, env, tiny


def run_server(command: str, cwd: Path, env: dict[str, str]) -> str:
    """Start it, fetch the URL it prints, stop it with Ctrl-C; its output."""
    server = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=cwd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = server.stdout.readline()
            if not line:
                break
            lines.append(line)
            found = URL.search(line)
            if found:
                with urllib.request.urlopen(found.group(0), timeout=30) as page:
                    assert page.status == 200
                break
        else:
            raise AssertionError(f"{command}: no URL in 240 s")
        assert found, f"{command} ended without a URL:\n{''.join(lines)}"
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGINT)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
    assert server.returncode in (0, 130), f"{command} exited {server.returncode}:\n{''.join(lines)}"
    return "".join(lines)


def run_page(page: Path, repo: Path, env: dict[str, str], tiny: str, state: Path) -> list[str]:
    """Each block in the folder and with the variables the one before left; the outputs."""
    cwd, outputs = repo, []
    for number, block in enumerate(bash_blocks(page), start=1):
        text = block.replace(MINILM, tiny)
        if SERVER.match(text.strip()) and "\n" not in text.strip():
            outputs.append(run_server(text.strip(), cwd, env))
            continue
        script = f"set -euo pipefail\n{text}\npwd > {state}/cwd\nenv -0 > {state}/env\n"
        result = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                                timeout=BLOCK_TIMEOUT_S)
        assert result.returncode == 0, (f"{page.relative_to(DOCS)}, block {number} exited {result.returncode}:\n"
                                        f"{text}\n--- stdout\n{result.stdout[-3000:]}\n--- stderr\n"
                                        f"{result.stderr[-3000:]}")
        outputs.append(result.stdout)
        cwd = Path((state / "cwd").read_text().strip())
        env = dict(item.split("=", 1) for item in (state / "env").read_text().split("\0") if "=" in item)
    return outputs


def activated(env: dict[str, str], repo: Path) -> dict[str, str]:
    """What `source .venv/bin/activate` leaves, for the pages after Getting started."""
    return {**env, "VIRTUAL_ENV": str(repo / ".venv"), "PATH": f"{repo / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"}


def test_every_runnable_block_of_the_docs_runs_as_written(newcomer, tmp_path):
    repo, env, tiny = newcomer
    ran = {}
    for page in nav_pages():
        if not bash_blocks(page):
            continue
        first = page.name == "getting-started.md"
        ran[page.relative_to(DOCS).as_posix()] = run_page(page, repo, env if first else activated(env, repo), tiny,
                                                          tmp_path)
    started = ran["getting-started.md"]
    assert (repo / "reports" / "quickstart" / "report.md").is_file()
    assert (repo / "reports" / "quickstart" / "report.pdf").stat().st_size > 10_000
    assert any("MLflow UI for quickstart: http://127.0.0.1:" in out for out in started)
    assert any("ok: every number of reports/quickstart" in out for out in started)
    assert set(ran) >= {"getting-started.md", "concepts/studies.md", "how-to/resume-and-edit.md"}
