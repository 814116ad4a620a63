"""Paper-sized tables: every table of the quickstart's and the paper-scale studies' reports, compiled
alone in a two-column ACL-sized page, fits its column or the page without shrinking below 8 pt and
without an overfull box; its footnotes stay within 3 lines; constant axes and a shared n go to the
caption; labels are readable. The reports are built from synthetic runs of each example's own plan."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from reports.build import build_report
from tests.paper_studies import example_runs

STUDIES = ("quickstart", "paper_minilm", "two_models")
# ACL's page (acl.sty): A4, text 16 cm wide and 24.7 cm high, two columns 0.6 cm apart (7.7 cm each). Nothing
# may scale a table: \resizebox and \scalebox stop the compile.
ACL_PAGE = r"""\documentclass[%(size)s,twocolumn]{article}
\usepackage[T1]{fontenc}
\usepackage[utf8]{inputenc}
\usepackage{booktabs}
\usepackage{graphicx}
\setlength\paperwidth{21cm}\setlength\paperheight{29.7cm}\pdfpagewidth=\paperwidth\pdfpageheight=\paperheight
\setlength\textwidth{16cm}\setlength\columnsep{0.6cm}\setlength\textheight{24.7cm}
\setlength\oddsidemargin{-0.04cm}\setlength\evensidemargin{-0.04cm}\setlength\topmargin{-1cm}
\renewcommand\resizebox[3]{\errmessage{a table was scaled (resizebox)}}
\renewcommand\scalebox[2]{\errmessage{a table was scaled (scalebox)}}
\pagestyle{empty}
\begin{document}
\input{%(table)s}
\end{document}
"""
BP = 72.27 / 72  # a PDF point in TeX points
SMALLEST = 8.0


def compile_alone(folder: Path, table: str, size: str) -> tuple[str, Path]:
    """The table alone on an ACL page; (the log, the PDF)."""
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed (CI installs texlive)")
    document = folder / f"acl-{size}-{table}.tex"
    document.write_text(ACL_PAGE % {"size": size, "table": table})
    result = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", document.name], cwd=folder,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:]
    return document.with_suffix(".log").read_text(errors="replace"), document.with_suffix(".pdf")


def printed(pdf: Path) -> dict:
    """What the page shows: the smallest glyph of the table and of its notes in TeX points (letters and
    digits with a letter or digit beside them, so superscript marks do not count), and the notes' lines
    (the text between the table's bottom rule and the caption)."""
    pdfplumber = pytest.importorskip("pdfplumber")
    with pdfplumber.open(pdf) as document:
        page = document.pages[0]
        chars = page.chars
        text = "".join(c["text"] for c in chars)
        caption = next(c["top"] for i, c in enumerate(chars) if "".join(d["text"] for d in chars[i:i + 7]) == "Table1:")
        rules = [line["bottom"] for line in page.lines + page.rects if line["bottom"] < caption]
        bottom = max(rules)

        def body(c, i):
            return c["text"].isalnum() and any(
                0 <= j < len(chars) and chars[j]["text"].isalnum() and abs(chars[j]["size"] - c["size"]) < 0.01
                and abs(chars[j]["top"] - c["top"]) < 1 for j in (i - 1, i + 1))

        glyphs = [c for i, c in enumerate(chars) if body(c, i)]
        table = [c["size"] * BP for c in glyphs if c["top"] < bottom]
        notes = [c for c in glyphs if bottom < c["top"] < caption - 1]
        return {"table": min(table), "notes": min((c["size"] * BP for c in notes), default=None),
                "note_lines": len({round(c["top"]) for c in notes}), "right": max(c["x1"] for c in chars),
                "text": text}


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for name in STUDIES:
        folder = tmp_path_factory.mktemp(name)
        build_report(example_runs(name), folder, ("markdown", "latex"))
        out[name] = folder
    return out


@pytest.mark.parametrize("size", ["10pt", "11pt"])
@pytest.mark.parametrize("study", STUDIES)
def test_every_table_fits_an_acl_page_at_8_pt_or_more_with_3_lines_of_notes(reports, study, size):
    folder = reports[study]
    tables = sorted(p.stem for p in folder.glob("*.tex") if p.stem not in ("report", "reproducibility")
                    and not p.stem.startswith("acl-"))  # reproducibility.tex: an appendix section, no table
    assert {"ablation", "headline"} <= set(tables) and ("tuning" in tables) == (study == "quickstart")
    for table in tables:
        source = (folder / f"{table}.tex").read_text()
        assert "resizebox" not in source and "scalebox" not in source, table
        log, pdf = compile_alone(folder, table, size)
        assert "Overfull \\hbox" not in log, (study, table, size)
        seen = printed(pdf)
        assert seen["table"] >= SMALLEST - 0.01, (study, table, size, seen["table"])
        assert seen["notes"] is None or seen["notes"] >= SMALLEST - 0.01, (study, table, size, seen["notes"])
        assert seen["note_lines"] <= 3, (study, table, size, seen["note_lines"])
        page = 16 * 72 / 2.54 + 72 * (1 - 0.04 / 2.54)  # the text's right edge in PDF points
        assert seen["right"] <= page + 0.5, (study, table, size)
        if source.startswith("\\begin{table}"):  # one column: within its 7.7 cm
            assert seen["right"] <= 72 * (1 - 0.04 / 2.54) + 7.7 * 72 / 2.54 + 0.5, (study, table, size)


def test_the_paper_scale_ablation_tables_sit_in_one_column(reports):
    """The layer tables of both paper-scale studies fit one column: 7 layers of one model at \\small,
    13 layers of two models (turned round: layers down) at \\footnotesize (9 pt in an 11 pt paper)."""
    for study, size in (("paper_minilm", "small"), ("two_models", "footnotesize"), ("quickstart", "small")):
        table = (reports[study] / "ablation.tex").read_text()
        assert table.startswith(f"\\begin{{table}}[t]\n\\centering\n\\{size}\n"), study
    two = (reports["two_models"] / "ablation.tex").read_text()
    assert "& \\multicolumn{2}{c}{Model} \\\\" in two and "Layer & all-MiniLM-L6-v2 & all-mpnet-base-v2 \\\\" in two
    assert [line.split(" &")[0] for line in two.splitlines() if re.match(r"^\d+ &", line)] == [str(k) for k in
                                                                                                 range(13)]


def test_constant_axes_and_a_shared_n_are_said_once_in_the_caption(reports):
    for study, seeds in (("quickstart", 2), ("paper_minilm", 5), ("two_models", 3)):
        markdown = (reports[study] / "report.md").read_text()
        table = (reports[study] / "ablation.tex").read_text()
        assert f"Test Spearman ×100 by layer, mean ± std over {seeds} seeds (pooling: mean)." in markdown
        assert "(n=" not in table and "(n=" not in markdown.split("Notes in full")[0], study
        assert "Pooling" not in table and "| Pooling" not in markdown and "mean," not in table, study
        assert "caption{Test Spearman $\\times$100 by layer, mean~$\\pm$~std over " in table


def test_a_cell_short_of_seeds_shows_its_n_and_the_caption_does_not_claim_one(tmp_path):
    runs = example_runs("paper_minilm")
    dropped = runs.runs.drop(index=runs.runs.index[(runs.runs.layer == 3) & (runs.runs.seed == 4)])
    build_report(dataclasses.replace(runs, runs=dropped), tmp_path, ("markdown",))
    markdown = (tmp_path / "report.md").read_text()
    assert "mean ± std over seeds (pooling: mean)." in markdown
    row = next(line for line in markdown.splitlines() if line.startswith("| Spearman |"))
    assert row.count("(n=5)") == 6 and row.count("(n=4/5)") == 1
    assert "n: seeds completed" in markdown


def test_the_bold_legend_says_what_bold_marks(reports):
    """One row (the quickstart: pooling is constant): bold is the best layer of the row, and the legend
    says so. Two rows (two models): bold is the better model at each layer both models have."""
    def cells(markdown: str, label: str) -> list[tuple[bool, float | None]]:
        """(bold, mean) of each cell of the row with this label."""
        row = next(line for line in markdown.splitlines() if line.startswith(f"| {label} |"))
        out = []
        for cell in row.strip("|").split("|")[1:]:
            mean = re.search(r"(\d+\.\d+) ±", cell)
            out.append(("**" in cell, float(mean[1]) if mean else None))
        return out

    quick = cells((reports["quickstart"] / "report.md").read_text(), "Spearman")
    assert [mean for bold, mean in quick if bold] == [max(mean for _, mean in quick)]
    assert "bold: best layer;" in (reports["quickstart"] / "report.md").read_text()
    two = (reports["two_models"] / "report.md").read_text()
    mini, mpnet = cells(two, "all-MiniLM-L6-v2"), cells(two, "all-mpnet-base-v2")
    for (mini_bold, a), (mpnet_bold, b) in zip(mini[:7], mpnet[:7], strict=True):  # layers 0..6: both models
        assert mini_bold == (a > b) and mpnet_bold == (b > a)
    assert mini[7:] == [(False, None)] * 6 and not any(bold for bold, _ in mpnet[7:])  # nothing to compare
    assert "bold: best per layer;" in two and "bold: the best test mean of each layer (the best model there)" in two


def test_short_notes_are_the_default_and_full_notes_keep_every_detail(reports, tmp_path):
    short = (reports["paper_minilm"] / "ablation.tex").read_text()
    # the short note names the family the correction is over: 6 layers against the last, by either test
    assert "stats.csv" not in short and "p~$<$~0.05 vs. last layer (seed t-test / test-pair bootstrap, Holm, " \
        "m~=~6)" in short
    markdown = (reports["paper_minilm"] / "report.md").read_text()
    assert "<details><summary>Notes in full</summary>" in markdown and "raw and corrected ones" in markdown
    runs = example_runs("paper_minilm")
    build_report(dataclasses.replace(runs, report={**runs.report, "notes": "full"}), tmp_path, ("markdown", "latex"))
    full = (tmp_path / "ablation.tex").read_text()
    assert "raw and corrected ones (t-test, Wilcoxon, permutation) in stats.csv" in full
    assert "Notes in full" not in (tmp_path / "report.md").read_text()
    log, pdf = compile_alone(tmp_path, "ablation", "11pt")
    assert printed(pdf)["note_lines"] > 3 and "Overfull \\hbox" not in log  # today's detail, still in the column


def test_default_labels_and_report_labels_override_them(reports, tmp_path):
    two = (reports["two_models"] / "report.md").read_text()
    assert "| Model | Layer 0 | Layer 1 |" in two and "sentence-transformers/" not in two.split("Notes in full")[0]
    tuning = (reports["quickstart"] / "report.md").read_text()
    assert "| Layer | Trials | LR | Dev Spearman |" in tuning and "| 2 | 3 (1) |" in tuning
    runs = example_runs("two_models")
    labels = {"model": "Encoder", "layer": "Blocks", "sentence-transformers/all-MiniLM-L6-v2": "MiniLM"}
    build_report(dataclasses.replace(runs, report={**runs.report, "labels": labels}), tmp_path, ("markdown",))
    relabelled = (tmp_path / "report.md").read_text()
    assert "| Encoder | Blocks 0 |" in relabelled and "| MiniLM |" in relabelled and "by blocks," in relabelled
