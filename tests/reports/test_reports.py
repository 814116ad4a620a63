"""Reports from a synthetic MLflow store with known numbers, written the way launches write it."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from orchestrator.run.tracking import StudyTracker
from orchestrator.study.journal import Outcome, TrialRecord
from reports.aggregate import summarize
from reports.build import build_report
from reports.collect import StudyRuns, collect
from reports.record import KindRecord, StudyRecord
from reports.significance import compare_to_baseline

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
# layer -> test Spearman per seed 0, 1, 2; best dev per seed; parameters
TEST = {1: [74.0, 77.0, 75.0], 2: [80.0, 82.0, 84.0], 3: [75.0, 75.5, 76.0]}
DEV = {1: 60.0, 2: 85.0, 3: 90.0}  # dev picks layer 3, test favours layer 2: selection must use dev
PARAMS = {0: 11.9e6, 1: 13.7e6, 2: 15.5e6, 3: 17.2e6}
NOISE = {1: 2.0, 2: 0.05, 3: 2.0}  # per-pair prediction noise: layer 2 predicts the gold order best


def make_store(folder: Path, name: str = "synthetic", label: str | None = None) -> str:
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    study = {"name": name, "model": "m", "ablate": {"layer": [0, 1, 2, 3]},
             "report": {"baseline": {"layer": "last"}, **({"label": label} if label else {})}}
    (folder / "study.yaml").write_text(yaml.safe_dump(study))
    tracker = StudyTracker(uri, name, folder / "artifacts")
    tracker.start_parent(folder / "study.yaml", StudyRecord(
        name=name, kind=KindRecord(name="finetune"), metric="dev_spearman", mode="max",
        cells=[{"layer": k} for k in range(4)], seeds=[0, 1, 2], tuned={"lr": "LogUniform(low=1e-05, high=0.001)"}),
        "test")
    gold = np.random.default_rng(0).uniform(0, 1, 300)
    for layer in range(4):
        for seed in range(3):
            key = f"c{layer}-s{seed}"
            record = TrialRecord(key, layer, "replicate", seed, {"lr": 1e-4},
                                 {"layer": layer, "lr": 1e-4, "seed": seed})
            tracker.start_trial(record, f"layer={layer}", f"ray{layer}{seed}")
            if layer == 0:
                record.outcome, record.error = Outcome.FAILED, "OSError: weights file is corrupt"
            else:
                record.outcome = Outcome.COMPLETED
                tracker.log_epoch(key, {"epoch": 1, "best_dev_spearman": DEV[layer], "params": PARAMS[layer],
                                        "test_spearman": TEST[layer][seed], "test_pearson": TEST[layer][seed] - 1})
                # layer 1 draws exactly the baseline's (layer 3) noise: no difference at all
                noise = np.random.default_rng(100 * (3 if layer == 1 else layer) + seed).normal(0, NOISE[layer], 300)
                path = folder / f"{key}.csv"
                pd.DataFrame({"prediction": gold + noise, "score": gold}).to_csv(path, index_label="pair")
                shutil.copy(path, folder / "test_predictions.csv")
                tracker.log_artifact(key, str(folder / "test_predictions.csv"))
            tracker.finish_trial(record)
        tuning = TrialRecord(f"c{layer}-t0", layer, "tune", 10_000, {"lr": 2e-4}, {"layer": layer, "lr": 2e-4})
        tracker.start_trial(tuning, f"layer={layer}", f"tune{layer}")
        tracker.log_epoch(tuning.key, {"epoch": 1, "best_dev_spearman": DEV.get(layer, 1.0)})
        tuning.outcome = Outcome.PRUNED if layer == 2 else Outcome.COMPLETED
        tracker.finish_trial(tuning)
    tracker.reconcile({}, finished=True)
    return uri


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[str, Path]:
    folder = tmp_path_factory.mktemp("store")
    return make_store(folder), folder


def test_collect_gives_one_tidy_row_per_run(store):
    runs = collect(store[0], "synthetic")
    assert len(runs.runs) == 16 and runs.axes == ["layer"] and runs.metric == "dev_spearman"
    assert runs.report == {"baseline": {"layer": "last"}}
    assert sorted(runs.replicates().layer.unique()) == [0, 1, 2, 3]
    assert set(runs.runs.outcome) == {"completed", "failed", "pruned"}


def test_summary_is_mean_and_sample_std_over_seeds(store):
    summary = summarize(collect(store[0], "synthetic")).set_index("layer")
    assert summary.loc[2, "mean"] == pytest.approx(82.0) and summary.loc[2, "std"] == pytest.approx(2.0)
    assert summary.loc[1, "mean"] == pytest.approx(76.0 - 2 / 3) and summary.loc[1, "std"] == pytest.approx(
        np.std([74, 77, 75], ddof=1))
    assert summary.loc[0, "n"] == 0 and summary.loc[0, "missing"] == "failed: OSError: weights file is corrupt"


def test_significance_against_the_last_layer(store):
    runs = collect(store[0], "synthetic")
    summary = summarize(runs)
    stats = compare_to_baseline(runs, summary, [], "layer", "last", "test_spearman").set_index("cell")
    assert set(stats.baseline) == {"layer=3"}
    assert stats.loc["layer=2", "difference"] == pytest.approx(82.0 - 75.5)
    from scipy.stats import ttest_rel

    assert stats.loc["layer=2", "t_p"] == pytest.approx(ttest_rel(TEST[2], TEST[3]).pvalue)
    assert stats.loc["layer=2", "t_p"] < 0.05 < stats.loc["layer=1", "t_p"]
    assert stats.loc["layer=2", "bootstrap_p"] == pytest.approx(2 / 1001)  # every resample favours it: not 0
    assert stats.loc["layer=1", "bootstrap_p"] == 1.0 and stats.loc["layer=1", "bootstrap_difference"] == 0.0
    assert stats.loc["layer=2", "wilcoxon_p"] == pytest.approx(2 / 2 ** 3)  # every difference of 3 seeds positive
    assert stats.loc["layer=2", "paired_p"] == stats.loc["layer=2", "t_p"]  # the t-test marks by default


def unversioned(text: str) -> str:
    """The producer's version and commit change with every commit; the golden files hold neither."""
    import re

    return re.sub(r"ablation-orchestrator \S+ \(commit \w+\)", "ablation-orchestrator VERSION (commit COMMIT)", text)


def test_markdown_and_latex_match_the_golden_files(store, tmp_path):
    written = build_report(collect(store[0], "synthetic"), tmp_path)
    names = {p.name for p in written}
    assert {"report.md", "ablation.tex", "headline.tex", "tuning.tex", "runs.csv", "cells.csv", "stats.csv",
            "score_by_layer.png", "score_by_layer.pdf", "score_by_params.png", "score_by_params.pdf"} <= names
    for name in ("report.md", "ablation.tex", "headline.tex", "tuning.tex"):
        assert unversioned((tmp_path / name).read_text()) == (GOLDEN / name).read_text(), name
    report = (tmp_path / "report.md").read_text()
    row = next(line for line in report.splitlines() if line.startswith("| Spearman |"))
    cells = [c.strip() for c in row.strip("|").split("|")][1:]
    assert cells[0] == "— <sup>a</sup>"  # layer 0 failed: shown, with the reason as a footnote
    assert cells[1] == "75.33 ± 1.53"  # no mark: neither test finds a difference; n=3 is said once, in the caption
    assert cells[2] == "**82.00 ± 2.00**†‡"  # best test, significant by both tests after correction
    assert cells[3] == "<ins>75.50 ± 0.50</ins>"  # the dev-selected layer, although test prefers layer 2
    assert "mean ± std over 3 seeds." in report
    assert "<sup>a</sup> failed; bold: best layer;" in report  # the short notes under the table
    assert "<sup>a</sup> failed: OSError: weights file is corrupt" in report  # and in full below it


def test_every_number_in_the_tables_is_recomputed_from_runs_csv(store, tmp_path):
    build_report(collect(store[0], "synthetic"), tmp_path)
    runs = pd.read_csv(tmp_path / "runs.csv")
    done = runs[(runs.phase == "replicate") & (runs.outcome == "completed")]
    grouped = done.groupby("layer").test_spearman.agg(["mean", "std"])
    report = (tmp_path / "report.md").read_text()
    for layer, row in grouped.iterrows():
        assert f"{row['mean']:.2f} ± {row['std']:.2f}" in report, layer
    chosen = done.groupby("layer").best_dev_spearman.mean().idxmax()
    headline = report.splitlines()[report.splitlines().index("| k | Params (M) | Spearman | Pearson | Last | "
                                                             "Spearman (last) | Δ |") + 2]
    assert headline.split("|")[1].strip() == str(chosen)


def compile_latex(folder: Path, document: str) -> str:
    """pdflatex twice (references); returns the log. Skips where pdflatex is absent (CI installs it)."""
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed (CI installs texlive)")
    for _ in range(2):
        result = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", document], cwd=folder,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout[-2000:]
    return (folder / Path(document).with_suffix(".log")).read_text(errors="replace")


def test_the_report_tex_compiles_in_a_two_column_paper(store, tmp_path):
    build_report(collect(store[0], "synthetic"), tmp_path)
    log = compile_latex(tmp_path, "report.tex")
    assert (tmp_path / "report.pdf").stat().st_size > 1000
    for name in ("ablation", "headline", "tuning"):
        assert rf"\input{{{name}}}" in (tmp_path / "report.tex").read_text()
    assert "Overfull \\hbox" not in log


def wide_runs(width: str) -> StudyRuns:
    """A 13-layer x 2-pooling table (a base-size model's layer study) with long cells and labels."""
    rows = [{"run_id": f"r{layer}{pooling}{seed}", "trial_key": "k", "cell": f"layer={layer} pooling={pooling}",
             "phase": "replicate", "seed": seed, "outcome": "completed", "status": "FINISHED", "error": None,
             "layer": layer, "pooling": pooling, "test_spearman": 60 + layer * 2 + seed * 0.3,
             "best_dev_spearman": 61 + layer * 2, "epoch": 3, "best_epoch": 3 if layer < 4 else 2}
            for layer in range(13) for pooling in ("mean", "cls") for seed in range(3)]
    return StudyRuns("wide", pd.DataFrame(rows), ["layer", "pooling"], "dev_spearman",
                     {"baseline": {"layer": "last"}, "latex": {"width": width},
                      "labels": {"layer": "Layer", "pooling": "Pooling", "cls": "CLS", "mean": "Mean"}},
                     planned_seeds=3)


@pytest.mark.parametrize("width", ["column", "page", "auto"])
def test_a_wide_table_fits_its_column_or_page(width, tmp_path):
    build_report(wide_runs(width), tmp_path, ("markdown", "latex"))
    table = (tmp_path / "ablation.tex").read_text()
    # 13 layers x 2 poolings: wider than the page at 8 pt; turned round (layers down) it fits a column at \small
    assert table.startswith("\\begin{table*}" if width == "page" else "\\begin{table}[t]\n\\centering\n\\small")
    assert "& \\multicolumn{2}{c}{Pooling} \\\\" in table and "Layer & Mean & CLS" in table and "\n12 &" in table
    order = [int(line.split("&")[0]) for line in table.splitlines() if line.split("&")[0].strip().isdigit()]
    assert order == list(range(13))  # numeric order: numpy's integers sorted as numbers, 2 before 10
    assert "resizebox" not in table
    assert (tmp_path / "tuning.tex").exists() is False
    assert (tmp_path / "headline.tex").read_text().startswith(
        "\\begin{table}[t]" if width == "column" else "\\begin{table*}")  # 7 columns: auto spans the page too
    assert "↑" not in table and "uparrow" in table  # layers 0-3 still rising: marked, escaped for LaTeX
    markdown = (tmp_path / "report.md").read_text()
    assert "(8 of 26 cells)" in markdown  # the not-converged footnote counts them
    assert "| Pooling | Layer 0 | Layer 1 |" in markdown and "\n| CLS |" in markdown  # labels, not internal names
    log = compile_latex(tmp_path, "report.tex")
    assert "Overfull \\hbox" not in log  # without the shrink, this table runs over a two-column page


def test_report_command_writes_the_folder_and_rejects_bad_formats(store, tmp_path):
    from orchestrator.cli import app

    runner = CliRunner()
    out = tmp_path / "out"
    result = runner.invoke(app, ["report", "synthetic", "--tracking-uri", store[0], "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "report.md").exists() and (out / "ablation.tex").exists()
    bad = runner.invoke(app, ["report", "synthetic", "--tracking-uri", store[0], "--format", "pdf",
                              "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and bad.stderr.strip() == ("error: --format: 'pdf' is not valid; use a comma list "
                                                         "of md, tex, csv")
    assert not (tmp_path / "bad").exists()
    missing = runner.invoke(app, ["report", "nope", "--tracking-uri", store[0]])
    assert missing.exit_code == 2 and "no MLflow experiment of that name" in missing.stderr


def test_the_suite_table_is_mean_and_std_over_seeds_with_the_best_of_each_set_bold(tmp_path):
    from reports.build import suite_grid
    from reports.collect import StudyRuns
    from reports.latex import to_latex
    from reports.render import to_markdown

    rows = []
    for method, base in (("simcse", 70.0), ("micse", 72.0)):
        for seed in (0, 1):
            metrics = {f"test_{s}_spearman": base + i + seed for i, s in enumerate(
                ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sick"))}
            metrics["test_suite_avg_spearman"] = base + 3 + seed
            if method == "simcse":
                metrics["test_sick_spearman"] = 90.0 + seed  # simcse wins one set
            rows.append({"run_id": f"{method}{seed}", "cell": f"method={method}", "phase": "replicate", "seed": seed,
                         "outcome": "completed", "method": method, "test_spearman": metrics["test_stsb_spearman"],
                         "best_dev_spearman": 80.0, **metrics})
    runs = StudyRuns("suite", pd.DataFrame(rows), ["method"], "dev_spearman")
    grid = suite_grid(runs, 2)
    assert grid.columns == ["STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R", "Avg."]
    cells = dict(grid.rows)  # rows by the method's readable name (labels.VALUES), not the cell key
    assert cells["miCSE"][0].mean == 72.5 and cells["miCSE"][0].std == pytest.approx(0.7071, abs=1e-4)
    assert cells["miCSE"][0].bold and not cells["SimCSE"][0].bold
    assert cells["SimCSE"][6].bold and cells["SimCSE"][6].mean == 90.5
    markdown = to_markdown(grid)
    assert "| miCSE | **72.50 ± 0.71** |" in markdown and "mean ± std over 2 seeds." in markdown
    assert suite_grid(StudyRuns("plain", pd.DataFrame(rows).drop(columns=["test_suite_avg_spearman"]), ["method"],
                                "dev_spearman"), 2) is None
    # the report builds the suite table exactly when the study record lists it (the kind declared it)
    from reports.build import TABLES, TableContext
    from reports.record import KindRecord, StudyRecord

    def with_tables(tables):
        record = StudyRecord(name="suite", kind=KindRecord(name="contrastive", tables=tables), metric="dev_spearman",
                             cells=[{"method": "simcse"}, {"method": "micse"}], seeds=[0, 1])
        return TableContext(StudyRuns("suite", pd.DataFrame(rows), ["method"], "dev_spearman", record=record),
                            pd.DataFrame(), pd.DataFrame(), [], "method", 2)

    assert TABLES["suite"](with_tables(["suite"])) is not None and TABLES["suite"](with_tables([])) is None
    if shutil.which("pdflatex") is None:
        return
    from reports.latex import latex_document

    (tmp_path / "suite.tex").write_text(to_latex(grid, "suite"))
    (tmp_path / "all.tex").write_text(latex_document(["suite"]))
    result = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "all.tex"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:]


def test_the_cycle_table_shows_both_encoders_on_dev_and_test_after_every_cycle():
    from reports.build import cycle_grid
    from reports.collect import StudyRuns

    rows = []
    for seed in (0, 1):
        metrics = {f"cycle{c}_{enc}{split}_spearman": 10 * c + (5 if enc else 0) + (1 if split == "test" else 0) + seed
                   for c in (1, 2) for enc in ("", "cross_") for split in ("dev", "test")}
        rows.append({"run_id": f"r{seed}", "cell": "layer=6", "phase": "replicate", "seed": seed,
                     "outcome": "completed", "layer": 6, "test_spearman": 1.0, "best_dev_spearman": 1.0, **metrics})
    grid = cycle_grid(StudyRuns("d", pd.DataFrame(rows), ["layer"], "dev_spearman"), 2)
    assert grid.columns == ["1", "2"] and grid.headers == ["Cycle 1", "Cycle 2"]
    labels = [label for label, _ in grid.rows]  # one layer: the caption names it, the rows do not
    assert labels == ["bi · dev", "bi · test", "cross · dev", "cross · test"] and "(layer: 6)" in grid.title
    cross_test = dict(grid.rows)["cross · test"]
    assert [c.mean for c in cross_test] == [16.5, 26.5] and cross_test[0].std == pytest.approx(0.7071, abs=1e-4)
    assert cycle_grid(StudyRuns("d", pd.DataFrame(rows).drop(columns=[c for c in rows[0] if c.startswith("cycle")]),
                                ["layer"], "dev_spearman"), 2) is None


def test_corrected_p_values_match_a_hand_computation():
    from reports.significance import adjust_p

    raw = pd.Series([0.01, 0.04, 0.03, float("nan")])
    # Holm: sorted 0.01, 0.03, 0.04 times 3, 2, 1 -> 0.03, 0.06, 0.04, then a running maximum: 0.03, 0.06, 0.06
    assert adjust_p(raw, "holm").tolist()[:3] == pytest.approx([0.03, 0.06, 0.06])
    assert adjust_p(raw, "bonferroni").tolist()[:3] == pytest.approx([0.03, 0.12, 0.09])
    assert adjust_p(raw, "none").tolist()[:3] == pytest.approx([0.01, 0.04, 0.03])
    assert all(np.isnan(adjust_p(raw, m).iloc[3]) for m in ("holm", "bonferroni", "none"))


def test_stats_keep_raw_and_corrected_p_values_and_marks_use_the_corrected(store):
    from reports.significance import marks

    runs = collect(store[0], "synthetic")
    stats = compare_to_baseline(runs, summarize(runs), [], "layer", "last", "test_spearman").set_index("cell")
    raw = stats.loc[["layer=1", "layer=2"], "t_p"]
    holm = sorted(raw)[0] * 2, max(sorted(raw)[0] * 2, sorted(raw)[1])
    assert sorted(stats.loc[["layer=1", "layer=2"], "paired_p_adj"]) == pytest.approx(sorted(min(1, h) for h in holm))
    tested = stats.dropna(subset=["paired_p"])
    assert (tested.paired_p_adj >= tested.paired_p).all() and set(stats.correction) == {"holm"}
    shifted = tested.reset_index().assign(paired_p=0.04, paired_p_adj=0.08, bootstrap_p=0.04, bootstrap_p_adj=0.08)
    assert marks(shifted) == {}  # significant before correction, not after it
    assert marks(shifted, alpha=0.1) == {"layer=1": "†‡", "layer=2": "†‡"}


def test_the_bootstrap_refuses_prediction_files_of_other_pairs():
    from reports.bootstrap import paired_bootstrap

    gold = np.linspace(0, 1, 50)
    one = pd.DataFrame({"pair": range(50), "prediction": gold, "score": gold})
    other = one.iloc[::-1].reset_index(drop=True)  # the same pairs in another order
    with pytest.raises(ValueError, match="hold different test pairs"):
        paired_bootstrap([one], [other])
    with pytest.raises(ValueError, match="hold different test pairs"):
        paired_bootstrap([one], [one.iloc[:40]])
    assert paired_bootstrap([one], [one.copy()])[1] == 1.0


def test_verify_passes_on_a_fresh_report_and_names_the_cell_after_mlflow_changes(tmp_path):
    from mlflow.tracking import MlflowClient

    from orchestrator.cli import app

    uri = make_store(tmp_path)
    build_report(collect(uri, "synthetic"), tmp_path / "report")
    provenance = __import__("json").loads((tmp_path / "report" / "provenance.json").read_text())
    assert provenance["tracking_uri"] == uri and provenance["study"] == "synthetic" and len(provenance["commit"]) > 5
    result = CliRunner().invoke(app, ["verify", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    assert "ok: every number of" in result.stdout and "(4 cells)" in result.stdout

    client = MlflowClient(uri)
    runs = collect(uri, "synthetic").runs.set_index("trial_key")
    client.log_metric(runs.loc["c1-s0", "run_id"], "test_spearman", 90.0, step=2)  # edited after the report
    result = CliRunner().invoke(app, ["verify", str(tmp_path / "report")])
    assert result.exit_code == 1
    expected = f"differs: cell layer=1: test_spearman mean {np.mean(TEST[1])} in the report, "
    assert expected in result.stderr and f"{np.mean([90.0, 77.0, 75.0])} from MLflow" in result.stderr

    client.log_metric(runs.loc["c1-s0", "run_id"], "test_spearman", 74.0, step=3)  # put back
    client.delete_run(runs.loc["c2-s2", "run_id"])  # a run deleted after the report
    result = CliRunner().invoke(app, ["verify", str(tmp_path / "report")])
    assert result.exit_code == 1
    gone = runs.loc["c2-s2", "run_id"]
    assert f"differs: cell layer=2: run {gone} is no longer in MLflow (n 3 in the report, 2 now)" in result.stderr
    assert "layer=1" not in result.stderr


def test_verify_of_a_report_an_older_version_wrote_says_which_wrote_it(tmp_path):
    """A column a newer version added (budget.csv's too_few) makes the tables differ; verify says which
    version wrote the report and how to write it again, and says nothing of it when the numbers agree."""
    import json

    from orchestrator.cli import app

    uri = make_store(tmp_path)
    folder = tmp_path / "report"
    build_report(collect(uri, "synthetic"), folder)
    provenance = json.loads((folder / "provenance.json").read_text())
    (folder / "provenance.json").write_text(json.dumps({**provenance, "version": "0.0.9", "commit": "a" * 40}))
    result = CliRunner().invoke(app, ["verify", str(folder)])
    assert result.exit_code == 0 and "written by version" not in result.output  # other commit, same numbers: ok
    budget = pd.read_csv(folder / "budget.csv")
    budget.drop(columns="too_few").to_csv(folder / "budget.csv", index=False)  # as the older version wrote it
    result = CliRunner().invoke(app, ["verify", str(folder)])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("differs: budget.csv: columns ") and len(lines) >= 2
    assert lines[-1] == (f"differs: the report was written by version 0.0.9 at commit aaaaaaaaaaaa, this is "
                         f"{provenance['version']} at {provenance['commit'][:12]}: a column or wording that differs "
                         f"may be that change; `orchestrator report synthetic --out {folder}` writes it again with "
                         "this version")


def test_verify_names_a_hand_edit_of_any_csv_value(tmp_path):
    """verify used to compare only n, mean, std and dev of cells.csv and the tables' text: an edited
    runs.csv, stats.csv or any other column of cells.csv passed as `ok`."""
    from orchestrator.cli import app

    uri = make_store(tmp_path)
    build_report(collect(uri, "synthetic"), tmp_path / "report")
    folder = tmp_path / "report"
    pristine = {name: (folder / name).read_text() for name in ("runs.csv", "stats.csv", "cells.csv")}

    def edited(name, change):
        for other, text in pristine.items():
            (folder / other).write_text(text)
        table = pd.read_csv(folder / name)
        change(table)
        table.to_csv(folder / name, index=False)
        result = CliRunner().invoke(app, ["verify", str(folder)])
        assert result.exit_code == 1, (name, result.output)
        return result.stderr

    runs = pd.read_csv(folder / "runs.csv")
    run = runs.run_id[runs.trial_key == "c2-s1"].item()
    message = edited("runs.csv", lambda t: t.__setitem__("seed", t.seed.where(t.run_id != run, 7)))
    assert f"differs: runs.csv row run_id={run}: seed 7 in the report, 1 from MLflow" in message
    message = edited("runs.csv", lambda t: t.drop(index=t.index[t.run_id == run], inplace=True))
    assert f"differs: runs.csv row run_id={run}: from MLflow, not in the report" in message
    stats = pd.read_csv(folder / "stats.csv")
    cell, baseline, p = stats.cell[0], stats.baseline[0], stats.paired_p_adj[0]
    message = edited("stats.csv", lambda t: t.__setitem__("paired_p_adj", t.paired_p_adj.where(t.index != 0, 0.001)))
    assert f"differs: stats.csv row cell={cell} · baseline={baseline}: paired_p_adj 0.001 in the report, {p} " \
           "from MLflow" in message
    cells = pd.read_csv(folder / "cells.csv")
    message = edited("cells.csv", lambda t: t.__setitem__("pearson_mean", t.pearson_mean + 1))
    assert f"differs: cells.csv row cell=layer=1: pearson_mean {cells.pearson_mean[1] + 1} in the report" in message
    for other, text in pristine.items():
        (folder / other).write_text(text)
    assert CliRunner().invoke(app, ["verify", str(folder)]).exit_code == 0


def test_one_report_across_two_studies_has_the_study_as_an_axis(tmp_path):
    import re

    from orchestrator.cli import app

    uri = make_store(tmp_path, "english", label="en")
    make_store(tmp_path, "german", label="de")
    result = CliRunner().invoke(app, ["report", "english", "german", "--tracking-uri", uri,
                                      "--out", str(tmp_path / "both")])
    assert result.exit_code == 0, result.output
    report = (tmp_path / "both" / "report.md").read_text()
    assert "# english+german" in report and "**Test Spearman ×100 by layer, mean ± std over 3 seeds.**" in report
    rows = [line for line in report.splitlines() if line.startswith(("| en |", "| de |"))]
    assert [r.split(" |")[0] for r in rows[:2]] == ["| en", "| de"]
    # each study against its own baseline; Holm over the table's 4 comparisons: the t-test's p (0.017 raw) no
    # longer passes, the bootstrap's does
    assert all(re.search(r"82\.00 ± 2\.00(\*\*)?‡ \|", row) for row in rows[:2])
    cells = pd.read_csv(tmp_path / "both" / "cells.csv")
    assert len(cells) == 8 and set(cells.study) == {"en", "de"}
    stats = pd.read_csv(tmp_path / "both" / "stats.csv")
    assert set(zip(stats.cell.str.split().str[0], stats.baseline.str.split().str[0], strict=True)) == {
        ("study=en", "study=en"), ("study=de", "study=de")}  # significance only within a study
    verified = CliRunner().invoke(app, ["verify", str(tmp_path / "both")])
    assert verified.exit_code == 0, verified.output


def test_layers_beyond_a_shallower_models_depth_say_so(tmp_path):
    """`ablate: {model: [6 layers, 12 layers], layer: all}`: the 6-layer model's row ends at 6, and its
    empty cells say why instead of "not in the study"."""
    rows = [{"run_id": f"r{model}{layer}{seed}", "trial_key": "k", "cell": f"model={model} layer={layer}",
             "phase": "replicate", "seed": seed, "outcome": "completed", "status": "FINISHED", "error": None,
             "model": model, "layer": layer, "test_spearman": 60 + layer + seed * 0.3,
             "best_dev_spearman": 61 + layer, "epoch": 1, "best_epoch": 1}
            for model, depth in (("mini", 6), ("base", 12)) for layer in range(depth + 1) for seed in range(3)]
    runs = StudyRuns("two", pd.DataFrame(rows), ["model", "layer"], "dev_spearman",
                     {"baseline": {"layer": "last"}, "rows": ["model"], "columns": "layer"}, planned_seeds=3)
    build_report(runs, tmp_path, ("markdown",))
    markdown = (tmp_path / "report.md").read_text()
    mini = next(line for line in markdown.splitlines() if line.startswith("| mini |"))
    assert mini.count("— <sup>a</sup>") == 6 and "<sup>a</sup> beyond the model's last layer" in markdown
    assert "not in the study" not in markdown


@pytest.mark.parametrize(("formats", "present", "absent"), [
    (["markdown"], {"report.md"}, {"report.tex", "ablation.tex"}),
    (["latex"], {"report.tex", "ablation.tex"}, {"report.md"}),
])
def test_report_formats_in_the_study_decide_what_is_written(store, tmp_path, formats, present, absent):
    """`report.formats` is read: the data files (runs.csv, cells.csv) are always written (verify and
    every table are recomputed from them)."""
    import dataclasses

    from reports.build import build_report
    from reports.collect import collect

    runs = collect(store[0], "synthetic")
    runs = dataclasses.replace(runs, report={**runs.report, "formats": formats})
    written = {p.name for p in build_report(runs, tmp_path / "out")}
    assert present <= written and not (absent & written) and {"runs.csv", "cells.csv"} <= written
    assert {p.name for p in (tmp_path / "out").iterdir()} >= present and not absent & {
        p.name for p in (tmp_path / "out").iterdir()}


def test_runs_and_so_every_table_follow_the_plans_cell_order_not_the_names():
    """`epochs=10` sorted as text came before `epochs=2`: the epochs study's table read 1, 10, 2, 4."""
    from reports.collect import sort_runs

    planned = ["epochs=1 layer=1", "epochs=2 layer=1", "epochs=4 layer=1", "epochs=10 layer=1"]
    frame = pd.DataFrame({"cell": ["epochs=10 layer=1", "epochs=2 layer=1", "gone", "epochs=1 layer=1",
                                   "epochs=4 layer=1", "epochs=1 layer=1"],
                          "phase": ["replicate"] * 6, "seed": [0, 0, 0, 1, 0, 0]})
    ordered = sort_runs(frame, planned)
    assert list(ordered.cell) == [*planned[:1], *planned[:1], *planned[1:], "gone"]
    assert list(ordered.seed[:2]) == [0, 1]


def test_degenerate_seeds_and_collapsed_cells_are_said_in_the_cell_never_averaged_away(tmp_path):
    """Layer 1: 2 of 5 seeds degenerate (no test score): the mean is over the other 3 and the cell says so.
    Layer 2: every seed's test cosines within 1e-4 (collapsed): the number is shown, marked, with its spread.
    Layer 0: every seed degenerate: empty, with the reason."""
    rows = []
    for layer in (0, 1, 2, 3):
        for seed in range(5):
            row = {"run_id": f"r{layer}{seed}", "trial_key": "k", "cell": f"layer={layer}", "phase": "replicate",
                   "seed": seed, "outcome": "completed", "status": "FINISHED", "error": None, "layer": layer,
                   "best_dev_spearman": 50.0 + layer, "epoch": 2, "best_epoch": 1}
            if layer == 0 or (layer == 1 and seed in (1, 3)):
                row.update({"test_degenerate": 1, "test_epoch": 0})
            else:
                row["test_spearman"] = 30.0 + layer * 10 + seed
            if layer == 2:
                row["test_cosine_spread"] = [1.1e-5, 1.4e-5, 1.2e-5, 1.3e-5, 1.2e-5][seed]
            rows.append(row)
    runs = StudyRuns("collapse", pd.DataFrame(rows), ["layer"], "dev_spearman", {}, planned_seeds=5)
    summary = summarize(runs).set_index("layer")
    assert summary.loc[1, "n"] == 3 and summary.loc[1, "mean"] == pytest.approx(40 + (0 + 2 + 4) / 3)
    assert summary.loc[1, "degenerate"] == 2 and summary.loc[2, "cosine_spread"] == pytest.approx(1.4e-5)
    build_report(runs, tmp_path, ("markdown", "latex"))
    markdown = (tmp_path / "report.md").read_text()
    cells = next(line for line in markdown.splitlines() if "| 42.00" in line).split("|")[2:-1]
    assert cells[0].strip() == "— <sup>a</sup>"
    assert cells[1].strip() == "42.00 ± 2.00 (n=3/5) <sup>b</sup>"
    assert cells[2].strip().startswith("52.00 ± 1.58 (n=5) <sup>c</sup>")
    short = next(line for line in markdown.splitlines() if line.startswith("<sup>a</sup>"))
    assert ("<sup>b</sup> 2 of 5 seeds degenerate, the mean over the other 3; <sup>c</sup> collapsed, cosine "
            "spread 1.1e-5 to 1.4e-5;") in short  # the short notes under the table keep the count and the spread
    assert ("<sup>b</sup> 2 of 5 seeds degenerate, the mean over the other 3 (constant output: correlation "
            "undefined)") in markdown  # and the full ones say why
    assert "collapsed, cosine spread 1.1e-5 to 1.4e-5" in (tmp_path / "ablation.tex").read_text()
    written = pd.read_csv(tmp_path / "cells.csv").set_index("layer")
    assert written.loc[1, "degenerate"] == 2 and written.loc[2, "cosine_spread"] == pytest.approx(1.4e-5)


@pytest.mark.parametrize("rule", ["two_stage", "sequential"])
def test_adaptive_seeds_report_the_first_stage_std_and_steins_interval(tmp_path, rule):
    """A cell that got 8 seeds (its first 3 were spread out) and one that stopped at 3. The std over
    all n seeds runs low under any rule that looks at the spread; the first stage's is unbiased.
    The two-stage rule's interval is Stein's: t with k-1 degrees of freedom, the first stage's std, √n."""
    from scipy.stats import t as t_dist

    test = {1: [70.0, 74.0, 72.5, 71.0, 71.2, 70.9, 71.1, 71.0], 2: [80.0, 80.5, 80.2]}
    dev = {1: [60.0, 65.0, 62.0, 61.0, 61.5, 61.2, 61.4, 61.3], 2: [70.0, 70.2, 70.1]}
    rows = [{"run_id": f"r{layer}{seed}", "trial_key": "k", "cell": f"layer={layer}", "phase": "replicate",
             "seed": seed, "outcome": "completed", "status": "FINISHED", "error": None, "layer": layer,
             "test_spearman": value, "best_dev_spearman": dev[layer][seed], "epoch": 2, "best_epoch": 1}
            for layer, values in test.items() for seed, value in enumerate(values)]
    replicate = {"seeds": 3, "max_seeds": 8, "until": {"dev_ci95": 0.5, "rule": rule}}
    runs = StudyRuns("adaptive", pd.DataFrame(rows), ["layer"], "dev_spearman", {}, planned_seeds=3,
                     replicate=replicate)
    summary = summarize(runs).set_index("layer")
    assert summary.loc[1, "n"] == 8 and summary.loc[1, "mean"] == pytest.approx(np.mean(test[1]))
    assert summary.loc[1, "std"] == pytest.approx(np.std(test[1][:3], ddof=1))  # the first stage only
    assert summary.loc[1, "std_seeds"] == 3 and summary.loc[1, "std_all_seeds"] == pytest.approx(
        np.std(test[1], ddof=1))
    first_stage = np.std(dev[1][:3], ddof=1)
    stein = t_dist.ppf(0.975, 2) * first_stage / np.sqrt(8)
    t_interval = t_dist.ppf(0.975, 7) * np.std(dev[1], ddof=1) / np.sqrt(8)
    assert summary.loc[1, "dev_ci95"] == pytest.approx(stein if rule == "two_stage" else t_interval)
    build_report(runs, tmp_path, ("markdown",))
    markdown = (tmp_path / "report.md").read_text()
    assert f"{np.mean(test[1]):.2f} ± {np.std(test[1][:3], ddof=1):.2f} (n=8)" in markdown
    note = next(line for line in markdown.splitlines() if line.startswith("seeds: adaptive"))
    assert "± is the std over the 3 first-stage seeds" in note and "std_all_seeds" in note
    # the 20-run means of docs/concepts/seeds-and-budgets.md (two-stage), not one run's 3.5 % and 6.8 %
    assert ("ran 3.9 % low (dev 7.9 %)" in note) if rule == "two_stage" else ("ran 7.2 % low (dev 13.2 %)" in note)
    assert ("and 5.5–8.6 % low (dev 10.4–15.1 %) where max_seeds decided fewer cells (means of 20 runs)" in note
            if rule == "two_stage" else "6.8–7.8 % low (dev 11.4–14.2 %)" in note)
    # the first-stage std is unbiased only against a fixed 3 seeds: c4(3) = Γ(3/2) / Γ(1) = √π / 2 of σ
    assert f"c4(3) = {math.sqrt(math.pi) / 2:.3f} of σ, {100 * (1 - math.sqrt(math.pi) / 2):.1f} % below it" in note
    assert "c4(3) = 0.886 of σ, 11.4 % below it" in note
    if rule == "two_stage":
        assert "it covered 95.0 % of the simulated means (the t-interval over all n: 90.9–93.4 %)" in note
    assert ("Stein's interval" in note) == (rule == "two_stage") and "about 3 %" not in note


@pytest.mark.parametrize("damage", [
    lambda text: text[: len(text) // 2],  # cut short (a crash or a full disk mid-write)
    lambda text: "42",  # JSON, but no object
    lambda text: "{}",  # an object without the study or its store
    lambda text: text.replace('"tracking_uri"', '"tracking"'),  # a key renamed by hand
    lambda text: "\udcff",  # not UTF-8
])
def test_verify_of_a_damaged_provenance_json_is_one_line(tmp_path, damage):
    from orchestrator.cli import app

    uri = make_store(tmp_path)
    build_report(collect(uri, "synthetic"), tmp_path / "report")
    path = tmp_path / "report" / "provenance.json"
    path.write_bytes(damage(path.read_text()).encode("utf-8", "surrogateescape"))
    result = CliRunner().invoke(app, ["verify", str(tmp_path / "report")])
    assert result.exit_code == 2 and result.stderr == (
        f"error: FOLDER: '{tmp_path / 'report'}' is not valid; provenance.json is damaged; write the report again "
        "with `orchestrator report`\n"), result.output


def test_a_report_interrupted_half_way_leaves_the_earlier_report_as_it_was(tmp_path, monkeypatch):
    """Ctrl-C (or a crash) while `report` rewrites a folder after the runs changed: the files were
    written in place one by one, so the folder held the new runs.csv beside the old tables. Now the
    earlier report stays whole, nothing is left beside it, and the next report is all new."""
    from mlflow.tracking import MlflowClient

    import reports.build

    uri = make_store(tmp_path)
    folder = tmp_path / "report"
    build_report(collect(uri, "synthetic"), folder)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    runs = collect(uri, "synthetic").runs.set_index("trial_key")
    MlflowClient(uri).log_metric(runs.loc["c1-s0", "run_id"], "test_spearman", 90.0, step=2)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(reports.build, "to_latex", interrupted)  # after the figures and CSVs, before report.md
        with pytest.raises(KeyboardInterrupt):
            build_report(collect(uri, "synthetic"), folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no scratch folder left beside it
    written = build_report(collect(uri, "synthetic"), folder)
    assert sorted(p.name for p in written) == sorted(before) and all(p.parent == folder for p in written)
    assert (folder / "runs.csv").read_bytes() != before["runs.csv"] and "90.0" in (folder / "runs.csv").read_text()
