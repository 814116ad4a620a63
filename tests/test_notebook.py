"""examples/notebooks/quickstart.ipynb runs top to bottom (nbclient, a real Ray launch of two tiny studies),
and what its figures show is what `orc.results()` says: the plotted layer curves and learning curves are
checked point by point, not only that a picture came out."""

from __future__ import annotations

import json
import time
from pathlib import Path

import nbformat
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "examples" / "notebooks" / "quickstart.ipynb"
LEARNING_RATES = [1e-4, 1e-3]
FIGURES = """
import json
def errorbars(fig):
    return [{"label": c.get_label(), "x": [float(v) for v in c.lines[0].get_xdata()],
             "y": [float(v) for v in c.lines[0].get_ydata()]} for c in fig.axes[0].containers]
def lines(fig):
    return [{"title": ax.get_title(), "lines": [{"label": line.get_label(), "x": [float(v) for v in line.get_xdata()],
             "y": [float(v) for v in line.get_ydata()]} for line in ax.lines]} for ax in fig.axes]
print(json.dumps({"layers": errorbars(fig_layers), "curves": lines(fig_curves)}))
"""


def with_parameters(notebook, parameters: str):
    """The notebook with a cell of `parameters` after its `parameters` cell (papermill's convention)."""
    index = next(i for i, cell in enumerate(notebook.cells) if "parameters" in cell.metadata.get("tags", []))
    notebook.cells.insert(index + 1, nbformat.v4.new_code_cell(parameters, metadata={"tags": ["injected"]}))
    return notebook


def test_the_notebook_is_one_parameters_cell_away_from_the_tiny_model():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    tagged = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and "STUDY_FILE" in tagged[0].source and "LEARNING_RATES" in tagged[0].source
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code")  # stored clean
    assert (NOTEBOOK.parent / "../quickstart.yaml").resolve().is_file()


@pytest.mark.slow
def test_the_quickstart_notebook_runs_and_its_plots_show_the_results(tmp_path, tiny_bert, synthetic_data_dir):
    from nbclient import NotebookClient

    import orchestrator as orc

    study = tmp_path / "tiny.yaml"
    study.write_text(yaml.safe_dump({
        "name": "tiny", "model": tiny_bert, "ablate": {"layer": [1, 3]}, "replicate": {"seeds": [0, 1]},
        "train": {"epochs": 2, "batch_size": 16, "max_seq_length": 32},
        "data": {"max_train_samples": 160, "max_eval_samples": 80}, "data_dir": str(synthetic_data_dir),
        "resources": {"cpu": 1}, "tracking": {"mlflow_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}}))
    notebook = with_parameters(nbformat.read(NOTEBOOK, as_version=4),
                               f"STUDY_FILE = {str(study)!r}\nOVERRIDES = []\nLEARNING_RATES = {LEARNING_RATES!r}")
    notebook.cells.append(nbformat.v4.new_code_cell(FIGURES, metadata={"tags": ["injected"]}))
    started = time.monotonic()
    NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}},
                   ).execute()
    print(f"the notebook ran in {time.monotonic() - started:.0f} s")
    figures = json.loads(notebook.cells[-1].outputs[0]["text"])

    names = [f"nb_lr_{lr:g}" for lr in LEARNING_RATES]
    storage = tmp_path / "studies"
    for name in names:  # the launches ran as the CLI's do: a finished study, its report verified
        assert orc.status(name, storage=storage).complete
        assert orc.verify(tmp_path / "reports" / name).ok

    # the layer curve: one line per study, each point the mean test score of that layer's replicates
    assert [line["label"] for line in figures["layers"]] == names
    for line in figures["layers"]:
        replicates = orc.results(line["label"], storage=storage, phase="replicate")
        means = replicates.groupby("layer").test_spearman.mean()
        assert line["x"] == [1.0, 3.0] and len(replicates) == 4
        assert line["y"] == pytest.approx(means.loc[[1, 3]].tolist())
    # the learning curves: one panel per study, one line per layer, each point the mean dev score of an epoch
    assert [panel["title"] for panel in figures["curves"]] == names
    for panel in figures["curves"]:
        curves = orc.results(panel["title"], storage=storage, phase="replicate", curves=True)
        assert [line["label"] for line in panel["lines"]] == ["layer 1", "layer 3"]
        for layer, line in zip((1, 3), panel["lines"], strict=True):
            expected = curves[curves.layer == layer].groupby("epoch").dev_spearman.mean()
            assert line["x"] == [1.0, 2.0] and line["y"] == pytest.approx(expected.tolist())

    executed = {i: cell for i, cell in enumerate(notebook.cells) if cell.cell_type == "code"}
    images = [i for i, cell in executed.items()
              if any("image/png" in output.get("data", {}) for output in cell.outputs)]
    assert len(images) == 2  # the two figures were drawn into the notebook
    last = notebook.cells[-2].outputs  # the report across both studies (the last cell is the test's)
    table = next(o for o in last if "text/html" in o.get("data", {}))["data"]["text/html"]
    assert all(f"study={name}" in table or name in table for name in names)  # one report across both
    assert any("verified against MLflow: True" in o.get("text", "") for o in last)
