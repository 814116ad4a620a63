"""Tables as Markdown (for READMEs) and LaTeX booktabs (for papers). Formatting only: every
number, mark and footnote arrives computed."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

N_NOTE = "n: replicate seeds completed; n=k/m marks a cell with fewer than the m planned"
BEST_NOTE = "bold: the best test mean of the column"


@dataclass(frozen=True)
class Cell:
    mean: float = math.nan
    std: float = math.nan
    bold: bool = False
    selected: bool = False
    mark: str = ""
    note: str | None = None  # why the cell is empty
    text: str | None = None  # a plain value (a layer number, a parameter count)
    n: int | None = None  # seeds the mean is over
    planned: int | None = None  # seeds the plan asked for


@dataclass
class Grid:
    title: str
    corner: str
    columns: list[str]
    rows: list[tuple[str, list[Cell]]]
    footnotes: list[str] = field(default_factory=list)
    decimals: int = 2
    transposable: bool = False  # the columns are one axis's values: LaTeX may print them down instead


def _number(cell: Cell, decimals: int) -> str:
    if cell.text is not None:
        return cell.text
    if math.isnan(cell.mean):
        value = "—"
    else:
        value = f"{cell.mean:.{decimals}f}"
        value = value if math.isnan(cell.std) else f"{value} ± {cell.std:.{decimals}f}"
    if cell.n is not None:
        short = cell.planned is not None and cell.n < cell.planned
        value += f" (n={cell.n}/{cell.planned})" if short else f" (n={cell.n})"
    return value


def _notes(grid: Grid) -> list[tuple[str, str]]:
    """Empty cells get letters a, b, ... with their reason; equal reasons share a letter."""
    letters: dict[str, str] = {}
    for _, cells in grid.rows:
        for cell in cells:
            if cell.note and cell.note not in letters:
                letters[cell.note] = chr(ord("a") + len(letters))
    return [(letter, note) for note, letter in letters.items()]


def to_markdown(grid: Grid) -> str:
    letters = {note: letter for letter, note in _notes(grid)}
    lines = [f"**{grid.title}**", "", "| " + " | ".join([grid.corner, *grid.columns]) + " |",
             "|" + "---|" + "---:|" * len(grid.columns)]
    for label, cells in grid.rows:
        texts = []
        for cell in cells:
            text = _number(cell, grid.decimals)
            if cell.note:
                text += f" <sup>{letters[cell.note]}</sup>"
            if cell.bold:
                text = f"**{text}**"
            if cell.selected:
                text = f"<ins>{text}</ins>"
            texts.append(text + cell.mark)
        lines.append("| " + " | ".join([label, *texts]) + " |")
    notes = [f"<sup>{letter}</sup> {note}" for letter, note in _notes(grid)] + grid.footnotes
    if notes:
        lines += [""] + [f"{note}  " for note in notes]
    return "\n".join(lines) + "\n"


LATEX_ESCAPES = {
    "×": r"$\times$", "±": r"$\pm$", "—": "--", "–": "--", "Δ": r"$\Delta$", "†": r"$^{\dagger}$",
    "‡": r"$^{\ddagger}$", "↑": r"$^{\uparrow}$",
    "<": r"$<$", ">": r"$>$", "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
    "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
}


def latex_escape(text: str) -> str:
    return "".join(LATEX_ESCAPES.get(ch, ch) for ch in text)


WIDTHS = {"column": ("table", r"\columnwidth"), "page": ("table*", r"\textwidth")}
AUTO_PAGE_COLUMNS = 6  # `auto`: tables with more data columns than this span the page (legible, not shrunk)


def to_latex(grid: Grid, label: str, width: str = "auto") -> str:
    """A booktabs table (needs booktabs and graphicx), footnotes under the rule. `width: column` is a
    `table` shrunk to the column when wider (never enlarged); `page` a `table*` across a two-column
    page, shrunk to the text width when wider; `auto` picks page for tables of many columns."""
    if width == "auto":
        if grid.transposable and len(grid.columns) > AUTO_PAGE_COLUMNS and len(grid.rows) < len(grid.columns):
            grid = transposed(grid)  # e.g. 13 layers across, 2 poolings down: layers go down instead
        width = "page" if len(grid.columns) > AUTO_PAGE_COLUMNS else "column"
    environment, limit = WIDTHS[width]
    letters = {note: letter for letter, note in _notes(grid)}
    columns = "l" + "r" * len(grid.columns)
    lines = [rf"\begin{{{environment}}}[t]", r"\centering", r"\small",
             rf"\resizebox{{\ifdim\width>{limit}{limit}\else\width\fi}}{{!}}{{%",
             rf"\begin{{tabular}}{{{columns}}}", r"\toprule",
             " & ".join(latex_escape(c) for c in [grid.corner, *grid.columns]) + r" \\", r"\midrule"]
    for row_label, cells in grid.rows:
        texts = []
        for cell in cells:
            text = latex_escape(_number(cell, grid.decimals))
            if cell.note:
                text += rf"\textsuperscript{{{letters[cell.note]}}}"
            if cell.bold:
                text = rf"\textbf{{{text}}}"
            if cell.selected:
                text = rf"\underline{{{text}}}"
            texts.append(text + latex_escape(cell.mark))
        lines.append(" & ".join([latex_escape(row_label), *texts]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}}"]
    notes = [rf"\textsuperscript{{{letter}}} {latex_escape(note)}" for letter, note in _notes(grid)]
    notes += [latex_escape(n) for n in grid.footnotes]
    if notes:
        lines.append(r"\par\smallskip{\footnotesize\raggedright " + r" \\ ".join(notes) + r"\par}")
    lines += [rf"\caption{{{latex_escape(grid.title)}}}", rf"\label{{tab:{label}}}", rf"\end{{{environment}}}"]
    return "\n".join(lines) + "\n"


def transposed(grid: Grid) -> Grid:
    """The same table with rows and columns swapped (each cell keeps its marks and notes)."""
    rows = [(column, [cells[j] for _, cells in grid.rows]) for j, column in enumerate(grid.columns)]
    return Grid(grid.title, grid.corner, [label for label, _ in grid.rows], rows, grid.footnotes, grid.decimals)


def latex_document(tables: list[str], figures: list[tuple[str, str]] = (), title: str | None = None) -> str:
    """`report.tex`: a two-column article (the layout of ACL/EMNLP papers) that \\input's every table
    and includes the figures (PDF file stem, caption), so the tables are checked as a paper sees them."""
    lines = [r"\documentclass[twocolumn]{article}", r"\usepackage[T1]{fontenc}", r"\usepackage[utf8]{inputenc}",
             r"\usepackage{booktabs}", r"\usepackage{graphicx}", r"\begin{document}"]
    if title:  # a full-width header, above the floats of the first page
        lines.append(rf"\twocolumn[{{\section*{{{latex_escape(title)}}}}}]")
    lines += [rf"\input{{{t}}}" for t in tables]
    for stem, caption in figures:
        lines += [r"\begin{figure}[t]", r"\centering", rf"\includegraphics[width=\columnwidth]{{{stem}.pdf}}",
                  rf"\caption{{{latex_escape(caption)}}}", r"\end{figure}"]
    lines.append(r"\end{document}")
    return "\n".join(lines) + "\n"
