"""Packing playground (notebook 01): draw a length mix, pack it, see the rows and the waste.

Controls: length distribution (long-tailed lognormal or uniform) and its parameters (only the
chosen mix's show, bounded by the capacity), number of examples, capacity, algorithm
(``wrapped`` | ``sequential`` | ``ffd`` | ``bfd``), seed. The packs are drawn as
stacked bars (one bar per row, one segment per example or piece, capacity dashed), and a table
compares the four algorithms: rows vs the lower bound ``ceil(tokens / capacity)``, fill ratio,
examples cut, and the padding one-example-per-row would waste. Lengths are clipped to the
capacity (as a ``max_length`` truncation would), so every example fits one row; the numbers say how
many were (:func:`clipped_count`).

Lessons: 01.
"""

from __future__ import annotations

import ipywidgets as widgets
import numpy as np
import plotly.graph_objects as go

from packsim.core.data import long_tailed_lengths, uniform_lengths
from packsim.core.errors import PacksimError
from packsim.core.pack_stats import examples_cut, packing_stats
from packsim.core.packing import STRATEGIES, as_piece, pack
from packsim.viz.style import LEAK_RED, chip_text, example_colour, layout
from packsim.viz.widget import PacksimWidget, escape, show_figure, style_html

__all__ = ["PackingPlayground", "packing_playground", "packing_figure", "draw_lengths", "clipped_count"]

CAPACITIES = (64, 128, 256, 512, 1024, 2048, 4096)
DISTRIBUTIONS = ("long_tailed", "uniform")
_LABELS = {"long_tailed": "long-tailed", "uniform": "uniform"}  # what the dropdown shows


def draw_lengths(
    distribution: str,
    n: int,
    capacity: int,
    seed: int = 0,
    median: float = 90,
    sigma: float = 0.9,
    low: int = 16,
    high: int = 256,
) -> np.ndarray:
    """``n`` example lengths (n,) int64 from ``distribution``, clipped to ``[1, capacity]``.

    ``distribution``: one of :data:`DISTRIBUTIONS` (``"long-tailed"`` is read as ``"long_tailed"``).
    """
    distribution = distribution.replace("-", "_")
    if distribution == "long_tailed":
        median = min(max(median, 8), capacity)
        return long_tailed_lengths(
            n, median=median, sigma=sigma, max_len=capacity, min_len=min(8, capacity), seed=seed
        )
    if distribution == "uniform":
        high = min(high, capacity)
        return uniform_lengths(n, min(low, high), high, seed=seed)
    raise PacksimError(f"unknown distribution {distribution!r}: use one of {list(DISTRIBUTIONS)}.")


def clipped_count(distribution: str, n: int, capacity: int, seed: int = 0, median: float = 90,
                  sigma: float = 0.9) -> int:
    """How many of :func:`draw_lengths`'s long-tailed draws were longer than ``capacity`` before the
    clip (the same draw, unclipped); 0 for ``uniform``, whose range is cut to the capacity instead."""
    if distribution.replace("-", "_") != "long_tailed":
        return 0
    raw = long_tailed_lengths(n, median=min(max(median, 8), capacity), sigma=sigma, max_len=2**40,
                              min_len=min(8, capacity), seed=seed)
    return int((raw > capacity).sum())


def _segments(packs, lengths):
    """Per pack, its (example, start, stop) entries in row order."""
    out = []
    for p in packs:
        out.append([tuple(as_piece(e, lengths)) for e in p])
    return out


def packing_figure(lengths, capacity: int, strategy: str = "bfd") -> go.Figure:
    """Stacked bars of the packs of ``lengths`` (n,) at ``capacity`` (static, notebook 01).

    One bar per packed row; each segment is one example (or piece, hatched by the cut), coloured
    by example; the dashed line is the capacity.
    """
    lengths = np.asarray(lengths)
    packs = pack(lengths, capacity, strategy=strategy)
    stats = packing_stats(lengths, packs, capacity)
    rows = _segments(packs, lengths)
    fig = go.Figure()
    depth = max((len(r) for r in rows), default=0)
    for slot in range(depth):
        whole_bars, cut_bars = [], []  # (x, tokens, colour, hover text) of the slot-th segment of each row
        for p, row in enumerate(rows):
            if slot < len(row):
                ex, a, b = row[slot]
                whole = b - a == int(lengths[ex])
                text = f"example {ex}: tokens {a}-{b} of {int(lengths[ex])}" + ("" if whole else " (cut)")
                (whole_bars if whole else cut_bars).append((p, b - a, example_colour(ex), text))
        # Whole pieces: one trace, a colour per bar. Cut pieces: hatched, one trace per colour, with
        # scalar colours (plotly.js reads a hatch's default colours from an array marker.color as
        # invalid: a browser console warning per bar); chip_text: a hatch that reads on the piece.
        by_colour = {}
        for bar in cut_bars:
            by_colour.setdefault(bar[2], []).append(bar)
        for bars, hatched in ((whole_bars, False), *((group, True) for group in by_colour.values())):
            if not bars:
                continue
            xs, ys, colours, text = (list(v) for v in zip(*bars, strict=True))
            marker = dict(color=colours if not hatched else colours[0], line=dict(color="#555", width=0.5))
            if hatched:
                marker["pattern"] = dict(shape="/", bgcolor=colours[0], fgcolor=chip_text(colours[0]))
            fig.add_trace(
                go.Bar(x=xs, y=ys, marker=marker, hovertext=text, hoverinfo="text+x", showlegend=False)
            )
    fig.add_hline(
        y=capacity,
        line=dict(color=LEAK_RED, dash="dash"),
        annotation_text=f"capacity {capacity}",
        annotation_position="top left",
    )
    return layout(
        fig,
        f"{strategy}: {stats.n_packs} rows for {stats.n_examples} examples "
        f"(lower bound {stats.lower_bound}), fill {stats.fill_ratio:.1%}",
        380,
        barmode="stack",
        bargap=0.05 if len(rows) > 40 else 0.2,
        xaxis_title="packed row",
        yaxis_title="tokens",
    )


def comparison_rows(lengths, capacity: int) -> list[dict]:
    """One dict per algorithm: rows, lower bound, fill, examples cut (notebook 01's table)."""
    out = []
    for strategy in STRATEGIES:
        packs = pack(lengths, capacity, strategy=strategy)
        s = packing_stats(lengths, packs, capacity)
        out.append(
            dict(
                strategy=strategy,
                rows=s.n_packs,
                lower_bound=s.lower_bound,
                fill=s.fill_ratio,
                cut=examples_cut(lengths, packs),
            )
        )
    return out


def _stats_html(lengths, capacity: int, strategy: str, clipped: int = 0) -> str:
    s = packing_stats(lengths, pack(lengths, capacity, strategy=strategy), capacity)
    cols = ("algorithm", "rows", "lower bound", "fill", "examples cut")
    head = "<tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>"
    body = "".join(
        f"<tr style='{'font-weight:bold' if r['strategy'] == strategy else ''}'>"
        f"<td>{escape(r['strategy'])}</td><td>{r['rows']}</td><td>{r['lower_bound']}</td>"
        f"<td>{r['fill']:.1%}</td><td>{r['cut']}</td></tr>"
        for r in comparison_rows(lengths, capacity)
    )
    return (
        f"<div>{s.n_examples} examples, {s.total_tokens} tokens, longest {int(np.max(lengths))}"
        + (f" ({clipped} drawn longer, clipped to the capacity as a max_length truncation would). " if clipped else ". ")
        +
        f"<b>{escape(strategy)}</b>: {s.n_packs} rows (lower bound {s.lower_bound}), "
        f"<b>fill {s.fill_ratio:.1%}</b>. One example per row would waste "
        f"<b>{s.one_per_row_padding_waste:.1%}</b> of its tokens on padding (padded to the "
        f"longest), {s.one_per_row_capacity_waste:.1%} padded to the capacity.</div>"
        f"<table class='packsim-table'>{head}{body}</table>"
    )


class PackingPlayground(PacksimWidget):
    """Packing playground; build it with :func:`packing_playground`. Controls are attributes."""

    def __init__(
        self,
        n: int = 120,
        capacity: int = 512,
        strategy: str = "bfd",
        distribution: str = "long_tailed",
        seed: int = 0,
    ):
        distribution = distribution.replace("-", "_")
        if capacity not in CAPACITIES:
            raise PacksimError(f"capacity={capacity!r}: pick one of {list(CAPACITIES)}.")
        if strategy not in STRATEGIES:
            raise PacksimError(f"strategy={strategy!r}: pick one of {list(STRATEGIES)}.")
        short = dict(style={"description_width": "90px"}, layout=widgets.Layout(width="330px"))
        self.distribution = widgets.Dropdown(
            options=[(_LABELS[d], d) for d in DISTRIBUTIONS],
            value=distribution,
            description="lengths",
            **short,
        )
        self.n = widgets.IntSlider(
            value=n, min=1, max=400, description="examples", continuous_update=False, **short
        )
        self.capacity = widgets.Dropdown(
            options=CAPACITIES, value=capacity, description="capacity", **short
        )
        self.strategy = widgets.ToggleButtons(
            options=STRATEGIES, value=strategy, description="algorithm"
        )
        self.median = widgets.IntSlider(
            value=90, min=8, max=1024, description="median", continuous_update=False, **short
        )
        self.sigma = widgets.FloatSlider(
            value=0.9,
            min=0.0,
            max=1.6,
            step=0.1,
            description="spread",
            continuous_update=False,
            **short,
        )
        self.uniform_range = widgets.IntRangeSlider(
            value=(16, 256),
            min=1,
            max=4096,
            description="min/max",
            continuous_update=False,
            **short,
        )
        self._syncing = False  # True while update() moves slider bounds (no redraw per change)
        self.seed = widgets.BoundedIntText(
            value=seed, min=0, max=10**6, description="seed", **short
        )
        self.out = widgets.Output(layout=widgets.Layout(min_height="390px"))
        self.stats = widgets.HTML()
        for w in (
            self.distribution,
            self.n,
            self.capacity,
            self.strategy,
            self.median,
            self.sigma,
            self.uniform_range,
            self.seed,
        ):
            w.observe(lambda _c: self._syncing or self.update(), names="value")
        # only the controls of the chosen mix show: a box each (the sliders share one Layout object)
        self.long_tailed_controls = widgets.VBox([self.median, self.sigma])
        self.uniform_controls = widgets.VBox([self.uniform_range])
        controls = widgets.HBox(
            [
                widgets.VBox([self.distribution, self.n, self.capacity, self.seed]),
                widgets.VBox([self.long_tailed_controls, self.uniform_controls]),
            ]
        )
        self.widget = widgets.VBox([style_html(), controls, self.strategy, self.out, self.stats])
        self.widget.add_class("packsim-playground")
        self.update()

    def lengths(self) -> np.ndarray:
        """The current length draw (n,)."""
        low, high = self.uniform_range.value
        return draw_lengths(
            self.distribution.value,
            self.n.value,
            self.capacity.value,
            self.seed.value,
            self.median.value,
            self.sigma.value,
            low,
            high,
        )

    def figure(self) -> go.Figure:
        return packing_figure(self.lengths(), self.capacity.value, self.strategy.value)

    def update(self) -> None:
        """Show the chosen mix's controls, bound them by the capacity, redraw the bars and numbers."""
        long_tailed = self.distribution.value == "long_tailed"
        self.median.disabled = self.sigma.disabled = not long_tailed
        self.uniform_range.disabled = long_tailed
        self.long_tailed_controls.layout.display = "" if long_tailed else "none"
        self.uniform_controls.layout.display = "none" if long_tailed else ""
        self._syncing = True
        try:  # no length above the capacity can be drawn, so no slider offers one
            self.median.max = self.uniform_range.max = self.capacity.value
        finally:
            self._syncing = False
        lengths = self.lengths()
        show_figure(self.out, packing_figure(lengths, self.capacity.value, self.strategy.value))
        clipped = clipped_count(self.distribution.value, self.n.value, self.capacity.value, self.seed.value,
                                self.median.value, self.sigma.value)
        self.stats.value = _stats_html(lengths, self.capacity.value, self.strategy.value, clipped)


def packing_playground(
    n: int = 120,
    capacity: int = 512,
    strategy: str = "bfd",
    distribution: str = "long_tailed",
    seed: int = 0,
) -> PackingPlayground:
    """Packing playground widget (notebook 01): lengths, capacity and algorithm controls."""
    return PackingPlayground(
        n=n, capacity=capacity, strategy=strategy, distribution=distribution, seed=seed
    )
