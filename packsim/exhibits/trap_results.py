"""The live trap table's result: the measured cells and how the table prints.

A :class:`Cell` is one (family, attention implementation, condition) measurement: "isolated",
"leaks" or "not run" (with the reason), the largest logit change (a float) and packsim.audit's
verdict on the same forward. A :class:`TrapTable` holds the cells, rows (family, impl) x columns
(condition), with the versions it ran on, and prints as text, HTML (a "not run" reason once, as a
numbered footnote; a measured cell's kernel, where it is not torch's own, once, as a lettered one:
e.g. "isolated[a]" with "[a] flash_attention_2 kernel: reference kernel (packsim, pure torch), not
flash-attn ..."; "!" where the audit disagrees) or a plotly heatmap. The measuring is in
:mod:`packsim.exhibits.traps`.

Lessons: none directly (lesson 04 prints the table :func:`packsim.exhibits.traps.trap_table` returns).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from packsim.core.errors import PacksimError
from packsim.core.text_table import text_table
from packsim.exhibits.trap_cases import CONDITIONS

__all__ = ["Cell", "TrapTable"]


@dataclass(frozen=True)
class Cell:
    """One measurement. ``status``: "isolated", "leaks", "not run" or "needs CUDA" (the isolating
    path exists only in a CUDA kernel that is not here; ``note`` says why).

    ``change``: max |logit change| of a later example's token when the first example changes;
    ``audit_isolated``: packsim.audit's verdict on the same forward (None when not run);
    ``audit_failed``: every probe the audit failed (positions and loss too, for the record);
    ``kernel``: what a measured cell's attention ran on, where that is not torch's own ('' for
    eager / sdpa / flex), e.g. the reference kernel (packsim, pure torch), not flash-attn.
    """

    family: str
    impl: str
    condition: str
    status: str
    change: float | None = None
    audit_isolated: bool | None = None
    audit_failed: tuple[str, ...] = ()
    note: str = ""
    kernel: str = ""

    @property
    def measured(self) -> bool:
        return self.status in ("isolated", "leaks")

    @property
    def agrees(self) -> bool | None:
        """Whether the audit's verdict matches the perturbation (None when not measured)."""
        if not self.measured or self.audit_isolated is None:
            return None
        return self.audit_isolated == (self.status == "isolated")


_SHORT = {"isolated": "isolated", "leaks": "LEAKS", "not run": "n/a", "needs CUDA": "needs CUDA"}
_COLOR = {"isolated": "#1a7f37", "leaks": "#cf222e", "not run": "#6e7781", "needs CUDA": "#9a6700"}
_FOOTNOTED = ("not run", "needs CUDA")  # statuses whose note prints once, as a numbered footnote


@dataclass
class TrapTable:
    """The measured cells, rows (family, impl) x columns (condition), and what it ran on.

    ``text()`` / ``str()`` for a terminal, ``to_html()`` / ``_repr_html_`` for a notebook,
    ``figure()`` for a plotly heatmap. ``disagreements()`` lists cells where the audit's verdict
    differs from the independent perturbation (empty when the audit is right everywhere).
    """

    cells: list[Cell]
    families: tuple[str, ...]
    impls: tuple[str, ...]
    conditions: tuple[str, ...]
    versions: dict[str, str]
    seconds: float
    descriptions: dict[str, str] = field(default_factory=dict)  # condition -> words (else CONDITIONS)

    def describe(self, condition: str) -> str:
        return self.descriptions.get(condition) or CONDITIONS.get(condition, condition)

    def cell(self, family: str, impl: str, condition: str) -> Cell:
        for c in self.cells:
            if (c.family, c.impl, c.condition) == (family, impl, condition):
                return c
        raise PacksimError(f"no cell ({family!r}, {impl!r}, {condition!r}) in this table: it was "
                           "built with other families=/impls=/conditions=.")

    def disagreements(self) -> list[Cell]:
        return [c for c in self.cells if c.agrees is False]

    def _notes(self) -> list[str]:
        notes: list[str] = []
        for c in self.cells:
            if c.status in _FOOTNOTED and c.note not in notes:
                notes.append(c.note)
        return notes

    def _status_of(self, note: str) -> str:
        return next(c.status for c in self.cells if c.status in _FOOTNOTED and c.note == note)

    def kernels(self) -> list[tuple[str, str]]:
        """[(impl, kernel)] of the measured cells that ran on a named kernel, in order: [a], [b], ..."""
        return list(dict.fromkeys((c.impl, c.kernel) for c in self.cells if c.measured and c.kernel))

    def _label(self, c: Cell, notes: list[str], kernels: list[tuple[str, str]] | None = None) -> str:
        label = _SHORT[c.status]
        if c.status in _FOOTNOTED:
            label += f"[{notes.index(c.note) + 1}]"
        if c.measured and c.kernel:
            label += f"[{_letter((kernels or self.kernels()).index((c.impl, c.kernel)))}]"
        return label + ("!" if c.agrees is False else "")

    def _kernel_lines(self) -> list[str]:
        return [f"[{_letter(k)}] {impl} kernel: {kernel}" for k, (impl, kernel) in enumerate(self.kernels())]

    def header(self) -> str:
        v = self.versions
        measured = [c for c in self.cells if c.measured]
        audited = [c for c in measured if c.agrees is not None]
        agree = sum(bool(c.agrees) for c in audited)
        verdict = (f"packsim.audit agrees with the perturbation in {agree}/{len(audited)}" if audited
                   else "packsim.audit not run on these cells")
        return (f"Is a packed row isolated? Measured on transformers {v['transformers']}, torch "
                f"{v['torch']}, {v['device']}, flex_attention {v['flex_attention']}; "
                f"{len(measured)} cells measured in {self.seconds:.1f} s; {verdict}.")

    def text(self) -> str:
        notes, kernels = self._notes(), self.kernels()
        head = ("family", "impl", *self.conditions)
        rows = [head] + [(f, i, *(self._label(self.cell(f, i, c), notes, kernels) for c in self.conditions))
                         for f in self.families for i in self.impls]
        lines = [self.header(), *text_table(rows, pad_last=False)]
        lines += [f"{name}: {self.describe(name)}" for name in self.conditions]
        lines += self._kernel_lines()
        lines += [f"[{k}] {self._status_of(note)}: {note}" for k, note in enumerate(notes, 1)]
        if self.disagreements():
            lines.append("! the audit's verdict differs from the perturbation in this cell")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def to_html(self) -> str:
        notes, kernels = self._notes(), self.kernels()
        head = "".join(f"<th title='{html.escape(self.describe(c))}'>{c}</th>" for c in self.conditions)
        body = []
        for f in self.families:
            for i in self.impls:
                tds = []
                for cond in self.conditions:
                    c = self.cell(f, i, cond)
                    tip = c.note if c.status in _FOOTNOTED else (
                        f"max |change| {c.change:.2e}; audit failed: {', '.join(c.audit_failed) or 'none'}"
                        + (f"; kernel: {c.kernel}" if c.kernel else ""))
                    tds.append(f"<td style='color:{_COLOR[c.status]};font-weight:bold' "
                               f"title='{html.escape(tip, quote=True)}'>"
                               f"{html.escape(self._label(c, notes, kernels))}</td>")
                body.append(f"<tr><td>{f}</td><td><code>{html.escape(i)}</code></td>{''.join(tds)}</tr>")
        legend = "".join(f"<li><code>{c}</code>: {html.escape(self.describe(c))}</li>" for c in self.conditions)
        legend += "".join(f"<li>{html.escape(line)}</li>" for line in self._kernel_lines())
        legend += "".join(f"<li>[{k}] {self._status_of(n)}: {html.escape(n)}</li>" for k, n in enumerate(notes, 1))
        return (f"<div class='packsim-traps'><p><b>{html.escape(self.header())}</b></p><table>"
                f"<tr><th>family</th><th>impl</th>{head}</tr>{''.join(body)}</table>"
                f"<ul>{legend}</ul></div>")

    def _repr_html_(self) -> str:
        return self.to_html()

    def figure(self):
        """A plotly heatmap: green isolated, red leaks, grey not run; hover shows the evidence.
        Without plotly (the course extra) one PacksimError line says what to install."""
        from packsim.core.extras import require

        require("TrapTable.figure", "course", "plotly")
        import plotly.graph_objects as go

        notes, kernels = self._notes(), self.kernels()
        code = {"isolated": 1.0, "leaks": 0.0, "not run": 0.5, "needs CUDA": 0.5}
        ys = [f"{f} / {i}" for f in self.families for i in self.impls]
        cells = [[self.cell(f, i, c) for c in self.conditions] for f in self.families for i in self.impls]
        z = [[code[c.status] for c in row] for row in cells]
        text = [[self._label(c, notes, kernels) for c in row] for row in cells]
        hover = [[c.note or (f"change {c.change:.2e}, audit isolated: {c.audit_isolated}"
                             + (f", kernel: {c.kernel}" if c.kernel else "")) for c in row]
                 for row in cells]
        scale = [[0, _COLOR["leaks"]], [0.5, _COLOR["not run"]], [1, _COLOR["isolated"]]]
        fig = go.Figure(go.Heatmap(z=z, x=list(self.conditions), y=ys, text=text,
                                   texttemplate="%{text}", customdata=hover, zmin=0, zmax=1,
                                   hovertemplate="%{y}, %{x}: %{customdata}<extra></extra>",
                                   colorscale=scale, showscale=False))
        fig.update_layout(title=self.header(), yaxis_autorange="reversed",
                          height=120 + 28 * len(ys), margin=dict(l=10, r=10, t=80, b=10))
        return fig


def _letter(k: int) -> str:
    """0 -> "a", 25 -> "z", 26 -> "aa": the kernel footnotes' marks (numbers are the "not run" ones)."""
    return _letter(k // 26 - 1) + chr(ord("a") + k % 26) if k >= 26 else chr(ord("a") + k)
