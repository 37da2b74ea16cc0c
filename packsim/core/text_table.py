"""Tables as text: rows of cells lined up in columns, for a terminal or as GitHub Markdown.

Every table packsim and its benchmarks print goes through here: :func:`text_table` lines up rows
(the header is row 0) in columns two spaces apart, for a terminal or a log (the audit report, the
trap table, forensics, the notebook runner); :func:`markdown_table` writes ``| a | b |`` rows
under a ``|---|`` rule (the museum, the benchmark tables pasted into ``benchmarks/RESULTS.md``).
Cells are ``str()``-ed; a column is as wide as its widest cell. Rows are sequences of cells,
``n_rows x n_columns``, every row with as many cells as the first.

Lessons: A6 (and the reports and tables of the library).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from packsim.core.errors import PacksimError

__all__ = ["column_widths", "text_table", "markdown_table"]


def _cells(rows: Sequence[Sequence[object]], what: str = "the first row") -> list[list[str]]:
    """The rows as strings, checked to have the same number of cells."""
    cells = [[str(c) for c in r] for r in rows]
    for r in cells[1:]:
        if len(r) != len(cells[0]):
            raise PacksimError(f"row {r} has {len(r)} cells but {what} has {len(cells[0])}: give every "
                               "row one cell per column (an empty string for a blank cell).")
    return cells


def column_widths(rows: Sequence[Sequence[object]]) -> list[int]:
    """The width of each column: the length of its longest ``str()``-ed cell (n_columns,)."""
    cells = _cells(rows)
    return [max(len(r[k]) for r in cells) for k in range(len(cells[0]))] if cells else []


def text_table(rows: Sequence[Sequence[object]], *, right: Collection[int] = (), pad_last: bool = True,
               sep: str = "  ") -> list[str]:
    """One line per row, each cell padded to its column's width, cells joined by ``sep``.

    ``right``: indices of the columns aligned right (numbers); the others align left.
    ``pad_last=False`` leaves the last cell as it is (no trailing spaces); ``True`` pads it too, so
    every line is as long as the table is wide (a prefix to write more text after).
    """
    cells = _cells(rows)
    widths = column_widths(cells)
    last = len(widths) - 1
    return [sep.join(c if k == last and not pad_last else c.rjust(w) if k in right else c.ljust(w)
                     for k, (c, w) in enumerate(zip(r, widths, strict=True))) for r in cells]


def markdown_table(headers: Sequence[object], rows: Sequence[Sequence[object]], *, pad: bool = True) -> str:
    """A GitHub Markdown table: ``headers`` over a rule, then ``rows``.

    ``pad=True`` pads the columns to line up in a terminal (``|---------|`` rules as wide as the
    column); ``pad=False`` writes each cell as it is under ``|---|`` rules (the shortest source).
    """
    cells = _cells([headers, *rows], "the header")
    if pad:
        widths = column_widths(cells)
        lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells]
        rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    else:
        lines = ["| " + " | ".join(r) + " |" for r in cells]
        rule = "|" + "|".join("---" for _ in cells[0]) + "|"
    return "\n".join([lines[0], rule, *lines[1:]])
