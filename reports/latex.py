"""Booktabs tables sized for a two-column paper (ACL/EMNLP: 11 pt, two 7.7 cm columns, 16 cm of
text), never shrunk: `auto` tries the column at \\small, the table turned round (layers down), the
column at \\footnotesize, then a `table*` across the page, and last splits the columns into stacked
blocks. Widths are estimated from Computer Modern's glyph widths (Times, ACL's font, is narrower);
the tests compile every table and fail on an overfull box or a glyph below 8 pt."""

from __future__ import annotations

from dataclasses import dataclass

from reports.render import Grid, _letters, _number, notes_of, transposed

LATEX_ESCAPES = {
    "×": r"$\times$", "±": r"$\pm$", "—": "--", "–": "--", "Δ": r"$\Delta$", "†": r"$^{\dagger}$",
    "‡": r"$^{\ddagger}$", "↑": r"$^{\uparrow}$", "≈": r"$^{\approx}$", "≻": r"$^{\succ}$", "\u00a0": "~",
    "√": r"$\surd$", "σ": r"$\sigma$", "ε": r"$\varepsilon$", "ρ": r"$\rho$", "τ": r"$\tau$", "χ": r"$\chi$",
    "²": r"$^{2}$", "≥": r"$\geq$", "≤": r"$\leq$", "−": r"$-$", "∞": r"$\infty$",
    "<": r"$<$", ">": r"$>$", "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
    "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
}


def latex_escape(text: str) -> str:
    return "".join(LATEX_ESCAPES.get(ch, ch) for ch in text)


def prose(text: str) -> str:
    """A caption or note in LaTeX: `mean ± std` and `p < 0.05` never broken across lines."""
    for joined in (" ± ", " < ", " > ", " = "):
        text = text.replace(joined, joined.replace(" ", "\u00a0"))
    return latex_escape(text)


# the paper's geometry: ACL's style file (acl.sty) on A4, 11 pt
COLUMN_WIDTH_PT = 7.7 * 72.27 / 2.54
TEXT_WIDTH_PT = 16.0 * 72.27 / 2.54
TABCOLSEP_PT = 6.0
SIZES = {"small": 10.0, "footnotesize": 9.0}  # in an 11 pt paper; a 10 pt one sets both a point smaller
WIDTHS = {"column": ("table", r"\columnwidth", COLUMN_WIDTH_PT), "page": ("table*", r"\textwidth", TEXT_WIDTH_PT)}

# Computer Modern Roman at 10 pt, in points (T1): what an unknown glyph is taken to be: 6 pt
_GLYPHS = dict(zip("abcdefghijklmnopqrstuvwxyz", (5.00, 5.55, 4.44, 5.55, 4.44, 3.05, 5.00, 5.55, 2.78, 3.05, 5.28,
                                                  2.78, 8.33, 5.55, 5.00, 5.55, 5.28, 3.92, 3.94, 3.89, 5.55, 5.28,
                                                  7.22, 5.28, 5.28, 4.44), strict=True))
_GLYPHS.update(zip("ABCDEFGHIJKLMNOPQRSTUVWXYZ", (7.50, 7.08, 7.22, 7.64, 6.80, 6.53, 7.85, 7.50, 3.61, 5.14, 7.78,
                                                  6.25, 9.16, 7.50, 7.78, 6.80, 7.78, 7.36, 5.55, 7.22, 7.50, 7.50,
                                                  10.28, 7.50, 7.50, 6.11), strict=True))
_GLYPHS.update({**dict.fromkeys("0123456789", 5.00), " ": 3.33, ".": 2.78, ",": 2.78, ";": 2.78, ":": 2.78,
                "(": 3.89, ")": 3.89, "-": 3.33, "+": 7.78, "/": 5.00, "=": 7.78, "'": 2.78, "*": 5.00,
                "±": 7.78, "×": 7.78, "—": 5.00, "–": 5.00, "Δ": 8.33, "<": 7.78, ">": 7.78, "_": 5.00,
                "†": 3.2, "‡": 3.2, "↑": 7.0, "≈": 5.5, "≻": 5.5,  # the marks are set as superscripts, at 70 %
                "ε": 4.06})
BOLD = 1.16  # bold extended against regular
MARGIN = 0.97  # what an estimate may fill of the width it must fit


def text_width(text: str, size: float, bold: bool = False) -> float:
    """Points `text` takes at `size` pt (an estimate; a little generous)."""
    width = sum(_GLYPHS.get(ch, 6.0) for ch in text) * size / 10.0
    return width * (BOLD if bold else 1.0)


@dataclass(frozen=True)
class Layout:
    grid: Grid  # as printed (perhaps turned round)
    width: str  # column or page
    size: str  # small or footnotesize
    blocks: list[list[int]]  # the column indices of each stacked block (one block unless split)


def _column_widths(grid: Grid, size: float) -> tuple[float, list[float]]:
    """The label column's width and each data column's, at `size` pt (without the padding)."""
    letters = _letters(grid)
    label = max([text_width(grid.corner, size)] + [text_width(label, size) for label, _ in grid.rows])
    data = []
    for j, header in enumerate(grid.columns):
        widest = text_width(header, size)
        for _, cells in grid.rows:
            cell = cells[j]
            text = _number(cell, grid.decimals) + cell.mark + (letters[cell.note] if cell.note else "")
            widest = max(widest, text_width(text, size, cell.bold))
        data.append(widest)
    return label, data


def tabular_width(grid: Grid, size: float, columns: list[int] | None = None) -> float:
    """The estimated width of the tabular (every column padded by \\tabcolsep on both sides)."""
    label, data = _column_widths(grid, size)
    chosen = [data[j] for j in (columns if columns is not None else range(len(data)))]
    body = sum(chosen) + 2 * TABCOLSEP_PT * len(chosen)
    if grid.column_axis:  # the spanning header must fit over its columns
        body = max(body, text_width(grid.column_axis, size) + 2 * TABCOLSEP_PT)
    return label + 2 * TABCOLSEP_PT + body


def choose_layout(grid: Grid, width: str = "auto") -> Layout:
    """The first layout that fits without shrinking: column before page, \\small before
    \\footnotesize, as the study lays it out before turned round; else stacked column blocks."""
    widths = ["column", "page"] if width == "auto" else [width]
    shapes = [grid, transposed(grid)] if grid.transposable else [grid]
    for where in widths:
        for size in SIZES:
            for shape in shapes:
                if tabular_width(shape, SIZES[size]) <= WIDTHS[where][2] * MARGIN:
                    return Layout(shape, where, size, [list(range(len(shape.columns)))])
    where, size = widths[-1], "footnotesize"
    shape = min(shapes, key=lambda s: tabular_width(s, SIZES[size]))
    return Layout(shape, where, size, _blocks(shape, SIZES[size], WIDTHS[where][2] * MARGIN))


def _blocks(grid: Grid, size: float, limit: float) -> list[list[int]]:
    """The columns in stacked blocks of equal count, as many to a block as fit `limit` (the blocks
    share the tabular's columns, so each position is as wide as its widest block's column)."""
    label, data = _column_widths(grid, size)
    count = len(data)
    for per_block in range(count, 0, -1):
        blocks = [list(range(start, min(start + per_block, count))) for start in range(0, count, per_block)]
        widths = [max(data[block[p]] for block in blocks if p < len(block)) for p in range(per_block)]
        if label + 2 * TABCOLSEP_PT * (per_block + 1) + sum(widths) <= limit or per_block == 1:
            return blocks
    return [list(range(count))]


def _cell_latex(grid: Grid, cell, letters: dict[str, str]) -> str:
    text = latex_escape(_number(cell, grid.decimals))
    if cell.note:
        text += rf"\textsuperscript{{{letters[cell.note]}}}"
    if cell.bold:
        text = rf"\textbf{{{text}}}"
    if cell.selected:
        text = rf"\underline{{{text}}}"
    return text + latex_escape(cell.mark)


def _header(grid: Grid, columns: list[int], labelled: bool) -> list[str]:
    """The header rows above a block (none when no header says anything: a one-row table turned round)."""
    if not grid.column_axis and not grid.corner and not any(grid.columns[j] for j in columns):
        return []
    first = 2 if labelled else 1
    lines = []
    if grid.column_axis:
        spanner = rf"\multicolumn{{{len(columns)}}}{{c}}{{{latex_escape(grid.column_axis)}}}"
        last = first + len(columns) - 1
        lines += [("& " if labelled else "") + spanner + r" \\", rf"\cmidrule(lr){{{first}-{last}}}"]
    names = [latex_escape(grid.columns[j]) for j in columns]
    lines.append(" & ".join(([latex_escape(grid.corner)] if labelled else []) + names) + r" \\")
    return lines


def to_latex(grid: Grid, label: str, width: str = "auto", notes: str = "short") -> str:
    """A booktabs table (needs only booktabs), footnotes under the rule, caption below. `width`:
    `column` keeps it in one column of a two-column paper, `page` makes it a `table*` across the
    page, `auto` picks the first that fits (see `choose_layout`); nothing is ever scaled down."""
    layout = choose_layout(grid, width)
    grid = layout.grid
    environment = WIDTHS[layout.width][0]
    letters = _letters(grid)
    labelled = bool(grid.corner) or any(row for row, _ in grid.rows)
    widest = max(len(block) for block in layout.blocks)
    lines = [rf"\begin{{{environment}}}[t]", r"\centering", rf"\{layout.size}",
             rf"\begin{{tabular}}{{{'l' if labelled else ''}{'r' * widest}}}", r"\toprule"]
    for number, block in enumerate(layout.blocks):
        if number and not lines[-1].endswith("midrule"):
            lines.append(r"\midrule")
        header = _header(grid, block, labelled)
        lines += header + ([r"\midrule"] if header else [])
        for row_label, cells in grid.rows:
            texts = [_cell_latex(grid, cells[j], letters) for j in block] + [""] * (widest - len(block))
            lines.append(" & ".join(([latex_escape(row_label)] if labelled else []) + texts) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    parts = [rf"\textsuperscript{{{letter}}} {prose(text)}" if letter else prose(text)
             for letter, text in notes_of(grid, notes)]
    if parts:
        joined = r" \\ ".join(parts) if notes == "full" else "; ".join(parts) + "."
        lines.append(r"\par\smallskip{\footnotesize\raggedright " + joined + r"\par}")
    lines += [rf"\caption{{{prose(grid.title)}}}", rf"\label{{tab:{label}}}", rf"\end{{{environment}}}"]
    return "\n".join(lines) + "\n"


ACL_GEOMETRY = r"\usepackage[a4paper,textwidth=16cm,textheight=24.7cm,columnsep=0.6cm,top=2.5cm]{geometry}"


def latex_document(tables: list[str], figures: list[tuple[str, str]] = (), title: str | None = None,
                   appendix: str | None = None) -> str:
    """`report.tex`: a two-column article with ACL's page (11 pt, two 7.7 cm columns) that
    \\input's every table and includes the figures (PDF file stem, caption), so the tables are seen
    as a paper shows them; `appendix` (a .tex stem, the reproducibility section) follows on its own
    one-column page, as a paper's appendix."""
    lines = [r"\documentclass[11pt,twocolumn]{article}", ACL_GEOMETRY, r"\usepackage[T1]{fontenc}",
             r"\usepackage[utf8]{inputenc}", r"\usepackage{booktabs}", r"\usepackage{graphicx}",
             r"\begin{document}"]
    if title:  # a full-width header, above the floats of the first page
        lines.append(rf"\twocolumn[{{\section*{{{latex_escape(title)}}}}}]")
    lines += [rf"\input{{{t}}}" for t in tables]
    for stem, caption in figures:
        lines += [r"\begin{figure}[t]", r"\centering", rf"\includegraphics[width=\columnwidth]{{{stem}.pdf}}",
                  rf"\caption{{{latex_escape(caption)}}}", r"\end{figure}"]
    if appendix:
        lines += [r"\onecolumn", r"\appendix", rf"\input{{{appendix}}}"]
    lines.append(r"\end{document}")
    return "\n".join(lines) + "\n"
