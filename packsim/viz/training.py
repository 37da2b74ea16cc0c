"""Training curves side by side (notebook 06): what the trainer reports vs what matters.

Three panels (:data:`PANELS`); a setup has one colour, dash and marker in all of them (buggy:
vermillion, dashed, x; correct: blue, solid, circles). Panel 1: the loss each setup's trainer
reports (thick line, filled markers) beside its own response-only loss on the same packs (thin
line, open markers; the legend's two grey "panel 1" entries say so): the gap is the prompt tokens
the reported loss averages in, a different quantity per setup, so compare a setup with itself.
Panels 2-3: the response-only loss on held-out examples run alone, and exact match on them (both
comparable across setups). Several seeds: the mean, with a min..max band. The widget
(:func:`curves`) reads a :class:`~packsim.experiment.results.Results` and/or live
:class:`~packsim.experiment.results.StepRecord` s passed to ``.callback`` while training runs;
:func:`reported_loss_figure` draws one run's reported loss (notebook 02). The widget's HTML is in
the ``training_*`` files of ``packsim/viz/frontend/`` (:mod:`packsim.viz.assets`).

Lessons: 02, 06.
"""

from __future__ import annotations

import time
from pathlib import Path

import ipywidgets as widgets
import plotly.graph_objects as go
from plotly.colors import hex_to_rgb
from plotly.subplots import make_subplots

from packsim.core.errors import PacksimError
from packsim.experiment.results import Results, RunResult, StepRecord
from packsim.viz.assets import template
from packsim.viz.style import GUIDE, layout, setup_colour, setup_dash, setup_symbol
from packsim.viz.widget import PacksimWidget, escape, show_figure, style_html

__all__ = ["Curves", "curves", "curves_figure", "reported_loss_figure", "PANELS"]

# (curve kind, column, panel index, the thin "part" line of panel 1?) of every line drawn.
PANELS = (
    ("train", "reported_loss", 1, False),
    ("train", "response_loss", 1, True),
    ("eval", "isolated_response_loss", 2, False),
    ("eval", "isolated_exact_match", 3, False),
)
_TITLES = (
    "training packs: reported (thick)<br>vs response-only part (thin)",  # fits one column
    "response-only loss<br>(held-out, run alone)",
    "exact match<br>(held-out, run alone)",
)


def _as_runs(results) -> list[RunResult]:
    """RunResults from a Results, a results.json path or dir, a dict, or a list of RunResult."""
    if results is None:
        return []
    if isinstance(results, (str, Path)):
        results = Results.load(results)
    if isinstance(results, dict):
        results = Results.from_dict(results)
    if isinstance(results, Results):
        return list(results.runs)
    if isinstance(results, RunResult):
        return [results]
    if isinstance(results, (list, tuple)) and all(isinstance(r, RunResult) for r in results):
        return list(results)
    raise PacksimError(
        f"curves() takes a packsim Results, a path to results.json, or a list of RunResult; got "
        f"{type(results).__name__}. Load one with packsim.experiment.results.Results.load(path)."
    )


def _points(run: RunResult, kind: str, key: str) -> dict[int, float]:
    """``{step: value}`` of one curve column, skipping missing values."""
    cols = run.curves.get(kind, {})
    return {
        int(s): float(v)
        for s, v in zip(cols.get("step", []), cols.get(key, []), strict=False)
        if s is not None and v is not None
    }


def seed_spread(runs: list[RunResult], kind: str, key: str):
    """(steps, mean, low, high) over the seeds in ``runs``: at each step, the seeds that have it.

    Steps are the union over seeds, so a seed still training does not cut the others' lines.
    """
    series = [s for s in (_points(r, kind, key) for r in runs) if s]
    steps = sorted(set().union(*series)) if series else []
    vals = [[s[t] for s in series if t in s] for t in steps]  # (steps, seeds that have it)
    return steps, [sum(v) / len(v) for v in vals], [min(v) for v in vals], [max(v) for v in vals]


def _rgba(colour: str, alpha: float) -> str:
    r, g, b = hex_to_rgb(colour)
    return f"rgba({r},{g},{b},{alpha})"


_KEY = (("panel 1: reported loss", 2.5, "circle"),
        ("panel 1: its response-only part", 1.2, "circle-open"))  # (name, width, marker)


def _add_key(fig: go.Figure) -> None:
    """Two grey legend entries for panel 1's two lines of a setup (width and marker fill)."""
    for name, width, symbol in _KEY:
        fig.add_trace(go.Scatter(x=[None], y=[None], name=name, legendgroup="panel 1 key",
                                 mode="lines+markers", line=dict(color=GUIDE, width=width),
                                 marker=dict(symbol=symbol, size=7, color=GUIDE),
                                 hoverinfo="skip"), row=1, col=1)  # fmt: skip


def _figure(runs: list[RunResult], title: str = "") -> go.Figure:
    fig = make_subplots(rows=1, cols=3, subplot_titles=_TITLES, horizontal_spacing=0.07)
    by_setup: dict[str, list[RunResult]] = {}
    for r in runs:
        by_setup.setdefault(r.setup, []).append(r)
    order = list(by_setup)
    drawn: set[int] = set()  # panels with a line
    for setup, group in by_setup.items():
        colour = setup_colour(setup, order)
        symbol, dash = setup_symbol(setup, order), setup_dash(setup, order)
        n = len({r.seed for r in group})
        name = setup if n == 1 else f"{setup} (mean of {n} seeds, band: min-max)"
        legend_done = False
        for kind, key, col, part in PANELS:
            steps, mean, low, high = seed_spread(group, kind, key)
            if not steps:
                continue
            if n > 1:
                fig.add_trace(
                    go.Scatter(
                        x=steps + steps[::-1],
                        y=high + low[::-1],
                        fill="toself",
                        mode="lines",
                        line=dict(width=0),
                        fillcolor=_rgba(colour, 0.12 if part else 0.22),
                        hoverinfo="skip",
                        showlegend=False,
                        legendgroup=setup,
                    ),
                    row=1,
                    col=col,
                )
            fig.add_trace(
                go.Scatter(
                    x=steps,
                    y=mean,
                    name=name,
                    legendgroup=setup,
                    showlegend=not legend_done,
                    mode="lines+markers",
                    # A setup: its colour (Okabe-Ito), dash and marker, in every panel; panel
                    # 1's response-only part: a thin line and open markers (see _KEY).
                    line=dict(color=colour, width=1.2 if part else 2.5 if kind == "train" else 2,
                              dash=dash),
                    marker=dict(symbol=f"{symbol}-open" if part else symbol, size=7, color=colour,
                                maxdisplayed=12 if kind == "train" else 0),
                    hovertemplate=f"{setup} {key}<br>step %{{x}}: %{{y:.4g}}<extra></extra>",
                ),
                row=1,
                col=col,
            )
            legend_done = True
            drawn.add(col)
    if 1 in drawn:
        _add_key(fig)
    for col in sorted({c for _, _, c, _ in PANELS} - drawn):  # no empty panel without a word
        waiting = "waiting for the first evaluation" if col > 1 else "waiting for the first training step"
        axis = "" if col == 1 else col
        fig.add_annotation(text=f"<i>{waiting}</i>", showarrow=False, x=0.5, y=0.5,
                           xref=f"x{axis} domain", yref=f"y{axis} domain", font=dict(size=13))
        fig.update_xaxes(showticklabels=False, showgrid=False, zeroline=False, row=1, col=col)
        fig.update_yaxes(showticklabels=False, showgrid=False, zeroline=False, row=1, col=col)
    for col in (1, 2, 3):
        fig.update_xaxes(title_text="step", row=1, col=col)
    fig.update_yaxes(range=[0, 1.02], row=1, col=3)
    return layout(
        fig,
        title or "Training side by side: reported loss vs what matters",
        460,
        below="legend",
        font=dict(size=11),
    )


def curves_figure(results, title: str = "") -> go.Figure:
    """Static curves figure (three panels, see the module doc) for HTML export (notebook 06).

    ``results``: a :class:`~packsim.experiment.results.Results`, a path to ``results.json`` (or its
    directory), its dict, or a list of :class:`~packsim.experiment.results.RunResult`.
    """
    return _figure(_as_runs(results), title)


class Curves(PacksimWidget):
    """Live side-by-side curves; pass ``.callback`` (or the object itself) to the trainer.

    Redraws happen at most every ``every`` train records or ``min_interval_s`` seconds, and at
    every eval record; call :meth:`redraw` to force one (e.g. after training).
    """

    def __init__(self, results=None, every: int = 25, min_interval_s: float = 0.5):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise PacksimError(f"every={every!r} must be a positive int (records between redraws).")
        self.every, self.min_interval_s = every, float(min_interval_s)
        self.runs: dict[tuple[str, int, str], RunResult] = {}
        for r in _as_runs(results):
            self.runs[(r.setup, int(r.seed), r.data)] = r
        datas = list(dict.fromkeys(d for _, _, d in self.runs)) or ["tasks"]
        single = len(datas) == 1
        why = (
            f"Only one data design ({datas[0]}) in these results, so there is nothing to switch "
            "to: the dropdown switches when they hold runs of both designs (tasks and facts)."
        )
        self.data = widgets.Dropdown(
            options=datas,
            value=datas[0],
            description="data",
            disabled=single,
            tooltip=why if single else "Which data design's runs to show.",
            layout=widgets.Layout(width="220px"),
        )
        note = template("training_note.html").substitute(note=escape(why)) if single else ""
        self.data_note = widgets.HTML(note)
        self.data.observe(lambda _c: self.redraw(), names="value")
        self.out = widgets.Output(layout=widgets.Layout(min_height="470px"))
        self.status = widgets.HTML()
        self.widget = widgets.VBox(
            [style_html(), widgets.HBox([self.data, self.data_note]), self.out, self.status]
        )
        self.widget.add_class("packsim-curves")
        self.n_records = 0
        self.n_draws = 0
        self._pending = 0
        self._last_draw = float("-inf")
        self.redraw()

    def __call__(self, record) -> None:
        self.callback(record)

    def callback(self, record: StepRecord | dict) -> None:
        """Add one live record (a StepRecord or its dict) and redraw if due."""
        if isinstance(record, dict):
            try:
                record = StepRecord(**record)
            except TypeError as err:
                raise PacksimError(
                    f"not a step record: {record!r} ({err}); pass packsim.experiment.results.StepRecord "
                    "objects (kind, setup, seed, step, values)."
                ) from err
        if not isinstance(record, StepRecord) or record.kind not in ("train", "eval"):
            raise PacksimError(
                f"curves.callback takes a StepRecord with kind 'train' or 'eval', got {record!r}."
            )
        key = (record.setup, int(record.seed), self.data.value)
        run = self.runs.get(key)
        if run is None:
            run = self.runs[key] = RunResult(setup=record.setup, seed=int(record.seed), data=key[2])
        run.add(record)
        self.n_records += 1
        self._pending += 1
        due = (
            record.kind == "eval"
            or self._pending >= self.every
            or time.monotonic() - self._last_draw >= self.min_interval_s
        )
        if due:
            self.redraw()

    def shown_runs(self) -> list[RunResult]:
        """Runs of the selected data set, in first-seen order."""
        return [r for (_, _, d), r in self.runs.items() if d == self.data.value]

    def figure(self) -> go.Figure:
        """The current figure (static, for export)."""
        return _figure(self.shown_runs())

    def redraw(self) -> None:
        """Draw the figure and the status line now."""
        show_figure(self.out, self.figure())
        self.status.value = self._status_html()
        self.n_draws += 1
        self._pending = 0
        self._last_draw = time.monotonic()

    def _status_html(self) -> str:
        runs = self.shown_runs()
        if not runs:
            return template("training_empty.html").template
        run_html = template("training_run.html").substitute
        parts = []
        for r in runs:
            last = r.last("train", "step")
            step_s = "-" if last is None else str(last)
            rep, em = r.last("train", "reported_loss"), r.last("eval", "isolated_exact_match")
            rep_s = "-" if rep is None else f"{rep:.3f}"
            em_s = "-" if em is None else f"{em:.2f}"
            evals = r.last("eval", "step")
            em_s = em_s if evals is not None else "waiting for the first evaluation"
            parts.append(run_html(setup=escape(r.setup), seed=r.seed, step=step_s, reported=rep_s,
                                  exact_match=em_s))  # fmt: skip
        return "<br>".join(parts)


def curves(results=None, every: int = 25, min_interval_s: float = 0.5) -> Curves:
    """Side-by-side training curves widget (notebook 06); ``.callback`` feeds it live.

    ``results``: None (start empty and fill it live), a :class:`~packsim.experiment.results.Results`, a
    path to ``results.json``, or a list of RunResult. Example::

        view = packsim.viz.curves()
        view                                   # shows it
        train(..., callback=view.callback)     # updates while training runs
    """
    return Curves(results, every=every, min_interval_s=min_interval_s)


def reported_loss_figure(run: RunResult, title: str = "") -> go.Figure:
    """The loss one run's trainer reported at each step (``curves["train"]["reported_loss"]``).

    ``run``: a :class:`~packsim.experiment.results.RunResult`, e.g. what ``packsim.train`` returns
    (notebook 02: the loss falls under ``buggy`` although the model reads its neighbours).
    """
    train = run.curves["train"]
    if not train.get("step"):
        raise PacksimError("this run has no training records: train it first (steps > 0).")
    line = dict(color=setup_colour(run.setup), dash=setup_dash(run.setup))
    fig = go.Figure(go.Scatter(x=train["step"], y=train["reported_loss"], mode="lines", line=line,
                               name=run.setup))  # fmt: skip
    return layout(fig, title or f"Loss reported while training under '{run.setup}'", 300,
                  xaxis_title="step", yaxis_title="loss")  # fmt: skip
