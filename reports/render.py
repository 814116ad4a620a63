"""Tables as Markdown (for READMEs) and LaTeX booktabs (for papers). Formatting only: every
number, mark, label, caption and footnote arrives computed in a `Grid`; both formats read the
same caption and the same notes (`short`: a few lines under the table, `full`: every detail)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

N_NOTE = "n: replicate seeds completed; n=k/m marks a cell with fewer than the m planned"
NOTES = ("short", "full")


@dataclass(frozen=True)
class Cell:
    mean: float = math.nan
    std: float = math.nan
    bold: bool = False
    selected: bool = False
    mark: str = ""
    note: str | None = None  # a footnote: why the cell is empty, or what its number leaves out
    text: str | None = None  # a plain value (a layer number, a parameter count)
    n: int | None = None  # seeds the mean is over (None: the caption says, every cell has the same)
    planned: int | None = None  # seeds the plan asked for


@dataclass(frozen=True)
class Note:
    """A footnote: `full` is every detail (`report.notes: full`, and report.md's notes in full);
    `short` the line a paper shows under the table (None: left out of short notes)."""

    full: str
    short: str | None = None


@dataclass
class Grid:
    """A table as data: caption, the label column's header (`corner`), the column headers (values
    of `column_axis` when it is set), rows of (label, cells) and footnotes."""

    title: str  # the caption
    corner: str
    columns: list[str]
    rows: list[tuple[str, list[Cell]]]
    footnotes: list[Note | str] = field(default_factory=list)  # a plain string is a note in full only
    decimals: int = 2
    transposable: bool = False  # the columns are one axis's values: LaTeX may print them down instead
    column_axis: str = ""  # what the columns are values of ("Layer"): one header spans them

    @property
    def headers(self) -> list[str]:
        """Column headers that stand alone (Markdown): "Layer 2" rather than "2" under "Layer"."""
        return [f"{self.column_axis} {c}" if self.column_axis else c for c in self.columns]


def _number(cell: Cell, decimals: int) -> str:
    if cell.text is not None:
        return cell.text
    if math.isnan(cell.mean):
        return "—"
    value = f"{cell.mean:.{decimals}f}"
    value = value if math.isnan(cell.std) else f"{value} ± {cell.std:.{decimals}f}"
    if cell.n is not None:
        short = cell.planned is not None and cell.n < cell.planned
        value += f" (n={cell.n}/{cell.planned})" if short else f" (n={cell.n})"
    return value


def short_reason(reason: str) -> str:
    """A missing cell's reason in a word or two: `failed: OSError: ...` -> `failed`."""
    cut = min((i for i in (reason.find(":"), reason.find(" (")) if i > 0), default=len(reason))
    return SHORT_REASONS.get(reason, reason[:cut])


SHORT_REASONS = {"beyond the model's last layer": "no such layer"}


def _letters(grid: Grid) -> dict[str, str]:
    """Empty cells get letters a, b, ... with their reason; equal reasons share a letter."""
    letters: dict[str, str] = {}
    for _, cells in grid.rows:
        for cell in cells:
            if cell.note and cell.note not in letters:
                letters[cell.note] = chr(ord("a") + len(letters))
    return letters


def notes_of(grid: Grid, notes: str = "short") -> list[tuple[str | None, str]]:
    """(letter or None, text) of every note the table shows in this mode: the empty cells' reasons
    first, then the footnotes (in short mode each one's short line, where it has one)."""
    if notes not in NOTES:
        raise ValueError(f"notes must be one of {', '.join(NOTES)}, but got notes={notes!r}")
    full = notes == "full"
    out: list[tuple[str | None, str]] = [(letter, reason if full else short_reason(reason))
                                         for reason, letter in _letters(grid).items()]
    for note in grid.footnotes:
        text = (note if full else None) if isinstance(note, str) else (note.full if full else note.short)
        if text:
            out.append((None, text))
    return out


def markdown_notes(grid: Grid, notes: str = "short") -> list[str]:
    """Lines of Markdown: short notes as one paragraph, full notes one per line."""
    parts = [f"<sup>{letter}</sup> {text}" if letter else text for letter, text in notes_of(grid, notes)]
    if not parts:
        return []
    return [f"{part}  " for part in parts] if notes == "full" else ["; ".join(parts) + "."]


def to_markdown(grid: Grid, notes: str = "short") -> str:
    letters = _letters(grid)
    labelled = bool(grid.corner) or any(label for label, _ in grid.rows)
    head = ([grid.corner] if labelled else []) + grid.headers
    lines = [f"**{grid.title}**", "", "| " + " | ".join(head) + " |",
             "|" + ("---|" if labelled else "") + "---:|" * len(grid.columns)]
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
        lines.append("| " + " | ".join(([label] if labelled else []) + texts) + " |")
    body = markdown_notes(grid, notes)
    if body:
        lines += [""] + body
    return "\n".join(lines) + "\n"


def transposed(grid: Grid) -> Grid:
    """The same table with rows and columns swapped (each cell keeps its marks and notes)."""
    rows = [(column, [cells[j] for _, cells in grid.rows]) for j, column in enumerate(grid.columns)]
    return Grid(grid.title, grid.column_axis, [label for label, _ in grid.rows], rows, grid.footnotes, grid.decimals,
                column_axis=grid.corner)

