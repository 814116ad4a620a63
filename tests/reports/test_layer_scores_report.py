"""`adaptive_layers` in the report: each trial scored every layer 0..k of the one model it trained
(`layer<j>_test_spearman`); the report shows them per cell, mean ± std over the seeds, a column a layer, the row's
best in bold; a cell of the same study trained without it (an ablation of the switch) has no row."""

from __future__ import annotations

import pandas as pd

from reports.build import build_report
from reports.collect import StudyRuns

# per cell and seed: test Spearman at layers 0..3 (the last is the trial's own test_spearman)
LOGGED = {"adaptive_layers=True": [(40.0, 61.0, 70.0, 75.0), (42.0, 63.0, 72.0, 73.0)],
          "adaptive_layers=False": [None, None]}


def runs_of(logged: dict) -> StudyRuns:
    rows = []
    for cell, seeds in logged.items():
        for seed, layers in enumerate(seeds):
            row = {"run_id": f"{cell}{seed}", "trial_key": f"{cell}-s{seed}", "cell": cell, "phase": "replicate",
                   "seed": seed, "outcome": "completed", "status": "FINISHED", "error": None,
                   "adaptive_layers": cell.endswith("True"), "dev_spearman": 80.0 + seed,
                   "test_spearman": layers[-1] if layers else 74.0 + seed}
            if layers:
                row.update({f"layer{j}_test_spearman": v for j, v in enumerate(layers)})
                row.update({f"layer{j}_dev_spearman": v + 5 for j, v in enumerate(layers)})
            rows.append(row)
    return StudyRuns("adaptive", pd.DataFrame(rows), ["adaptive_layers"], "dev_spearman", {}, planned_seeds=2)


def layer_table(folder) -> list[str]:
    report = (folder / "report.md").read_text()
    return report.split("**Every layer of one training")[1].split("\n\n")[1].splitlines()


def test_every_layer_of_the_one_training_is_a_column_with_its_mean_and_std_over_seeds(tmp_path):
    build_report(runs_of(LOGGED), tmp_path, ("markdown", "latex", "csv"))
    header, _, *rows = layer_table(tmp_path)
    assert [c.strip() for c in header.strip("|").split("|")][1:] == ["layer 0", "layer 1", "layer 2", "layer 3"]
    assert len(rows) == 1, rows  # the cell trained without it has no row
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[1].startswith("41.00 ± 1.41") and cells[3].startswith("71.00 ± 1.41"), cells
    assert cells[4].startswith("**74.00 ± 1.41**"), cells  # the row's best layer in bold
    assert "Every layer of one training: Test Spearman ×100 at layer j" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "layers.tex").is_file()


def test_a_study_whose_runs_scored_no_layers_has_no_such_table(tmp_path):
    build_report(runs_of({"adaptive_layers=False": [None, None]}), tmp_path, ("markdown", "latex"))
    assert not (tmp_path / "layers.tex").exists()
    assert "Every layer of one training" not in (tmp_path / "report.md").read_text()


def test_a_seed_that_failed_is_left_out_and_the_caption_says_how_many_remain(tmp_path):
    runs = runs_of(LOGGED)
    runs.runs.loc[runs.runs.run_id == "adaptive_layers=True1", "outcome"] = "failed"
    build_report(runs, tmp_path, ("markdown",))
    cells = [c.strip() for c in layer_table(tmp_path)[2].strip("|").split("|")]
    assert cells[1] == "40.00" and cells[4] == "**75.00**", cells  # seed 0's own scores, no std of one
    assert "at layer j, mean ± std over 1 of the 2 planned seeds" in (tmp_path / "report.md").read_text()


def test_matryoshka_sizes_are_a_column_each_and_2d_a_row_per_layer(tmp_path):
    """`matryoshka_dims` alone: one row per cell, a column per size, largest first; with adaptive_layers too
    (2D Matryoshka): per cell a row per layer, the same columns, each layer's best size in bold."""
    rows = []
    for seed in (0, 1):
        row = {"run_id": f"r{seed}", "trial_key": f"c-s{seed}", "cell": "matryoshka=on", "phase": "replicate",
               "seed": seed, "outcome": "completed", "status": "FINISHED", "error": None, "matryoshka": "on",
               "dev_spearman": 80.0, "test_spearman": 70.0 + seed}
        row.update({"dim32_test_spearman": 70.0 + seed, "dim8_test_spearman": 60.0 + seed,
                    "dim16_test_spearman": 66.0 + seed})
        row.update({f"layer{j}_dim{d}_test_spearman": 10.0 * j + d / 8 + seed for j in range(3) for d in (32, 16, 8)})
        rows.append(row)
    build_report(StudyRuns("m", pd.DataFrame(rows), ["matryoshka"], "dev_spearman", {}, planned_seeds=2), tmp_path,
                 ("markdown", "latex"))
    report = (tmp_path / "report.md").read_text()
    sizes = report.split("**Every size of one training")[1].split("\n\n")[1].splitlines()
    assert [c.strip() for c in sizes[0].strip("|").split("|")][1:] == ["d = 32", "d = 16", "d = 8"]
    cells = [c.strip() for c in sizes[2].strip("|").split("|")]
    assert cells[1].startswith("**70.50 ± 0.71**") and cells[2].startswith("66.50") and cells[3].startswith("60.50")
    grid = report.split("**Every layer and size of one training (2D Matryoshka)")[1].split("\n\n")[1].splitlines()
    assert [r.split("|")[1].strip() for r in grid[2:]] == ["layer 0", "layer 1", "layer 2"]
    layer2 = [c.strip() for c in grid[4].strip("|").split("|")]
    assert layer2[1].startswith("**24.50 ± 0.71**") and layer2[3].startswith("21.50"), layer2  # 20 + d/8 + mean seed
    assert (tmp_path / "sizes.tex").is_file() and (tmp_path / "layer_sizes.tex").is_file()
