"""Figures of data-parallel training (notebook 10): token weights per normaliser, R ranks vs one process.

- :func:`token_weights_figure`: the weight of ONE counted token in each (rank, micro-batch) cell
  of a step under each normaliser of :mod:`packsim.scaling.normalisation` (a heatmap, one row
  per normaliser); :func:`token_weights_explorer` puts it under two sliders (each rank's tokens);
- :func:`ranks_vs_one_figure`: ``packsim train`` outputs against the one-process run: the response
  loss per step, its |difference| from one process, and the max |weight difference| after training;
- :func:`rank_loads_figure`: the load of each rank under several ways of dealing packs.

Lessons: 10.
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from packsim.scaling.normalisation import NORMALISATIONS, weights
from packsim.scaling.rank_balance import straggler_ratio
from packsim.scaling.train_command import compare_outputs
from packsim.viz.style import OKABE_ITO, layout
from packsim.viz.widget import PacksimWidget, show_figure

__all__ = ["token_weights_figure", "token_weights_explorer", "TokenWeightsExplorer", "ranks_vs_one_figure",
           "rank_loads_figure", "NORMALISER_COLOURS"]

NORMALISER_COLOURS = {"global": OKABE_ITO["bluish_green"], "local": OKABE_ITO["orange"], "mean": OKABE_ITO["vermillion"]}


def token_weights_figure(counts) -> go.Figure:
    """Heatmap: rows = normalisers, columns = the (rank, micro-batch) cells of counts (R, M)."""
    counts = torch.as_tensor(counts)  # (R, M)
    R, M = counts.shape
    cells = [f"rank {r}, mb {m}<br>({int(counts[r, m])} tokens)" for r in range(R) for m in range(M)]
    z = [weights(counts, kind).reshape(-1).tolist() for kind in NORMALISATIONS]  # (kinds, R*M)
    fig = go.Figure(go.Heatmap(z=z, x=cells, y=list(NORMALISATIONS), colorscale="Blues", showscale=False,
                               text=[[f"{w:.4f}" for w in row] for row in z], texttemplate="%{text}",
                               hovertemplate="%{y}, %{x}: one token weighs %{text}<extra></extra>"))
    total = int(counts.sum())
    title = f"weight of one token in each cell (one process: 1 / {total} = {1 / max(total, 1):.4f} everywhere)"
    return layout(fig, title, height=300, yaxis=dict(autorange="reversed"))


class TokenWeightsExplorer(PacksimWidget):
    """Two sliders (rank 0's and rank 1's tokens; rank 0 splits them in halves over its 2
    micro-batches, rank 1 one third / two thirds) over :func:`token_weights_figure`."""

    def __init__(self, rank0_tokens: int = 40, rank1_tokens: int = 105):
        self.sliders = [widgets.IntSlider(rank0_tokens, min=2, max=200, step=2, description="rank 0 tokens"),
                        widgets.IntSlider(rank1_tokens, min=3, max=201, step=3, description="rank 1 tokens")]
        self.out = widgets.Output()
        for s in self.sliders:
            s.observe(lambda _: self.update(), "value")
        self.widget = widgets.VBox([widgets.HBox(self.sliders), self.out])
        self.widget.add_class("packsim-token-weights")
        self.update()

    def counts(self) -> torch.Tensor:
        """The (2, 2) table the sliders describe."""
        a, b = (s.value for s in self.sliders)
        return torch.tensor([[a // 2, a - a // 2], [b // 3, b - b // 3]])

    def figure(self) -> go.Figure:
        return token_weights_figure(self.counts())

    def update(self) -> None:
        show_figure(self.out, self.figure())


def token_weights_explorer(rank0_tokens: int = 40, rank1_tokens: int = 105) -> TokenWeightsExplorer:
    """The token-weight table of a 2-rank x 2-micro-batch step under two sliders."""
    return TokenWeightsExplorer(rank0_tokens, rank1_tokens)


def ranks_vs_one_figure(runs: dict[str, dict], reference: str = "one", loss: str = "response_loss") -> go.Figure:
    """Three panels: ``loss`` per step, its |difference| from ``runs[reference]``, max |weight difference|.

    ``runs``: name -> a loaded ``packsim train`` output (:func:`~packsim.scaling.train_command.load_output`);
    each run other than ``reference`` is coloured by the normaliser it recorded.
    """
    one = runs[reference]["losses"][loss]
    steps = list(range(1, len(one) + 1))
    fig = make_subplots(rows=1, cols=3, subplot_titles=(f"{loss.replace('_', ' ')} per step",
                                                        "|difference| from one process",
                                                        "max |weight difference| after training"))
    fig.add_scatter(x=steps, y=one, name=reference, line=dict(color="black", width=4), row=1, col=1)
    names, gaps = [n for n in runs if n != reference], []
    for name in names:
        colour = NORMALISER_COLOURS.get(runs[name]["run"].extra.get("normalise"), "#555")
        curve = runs[name]["losses"][loss]
        fig.add_scatter(x=steps, y=curve, name=name, line=dict(color=colour, dash="dot"), row=1, col=1)
        gap = [max(abs(a - b), 1e-9) for a, b in zip(curve, one, strict=True)]  # floor for the log axis
        fig.add_scatter(x=steps, y=gap, name=name, line=dict(color=colour), showlegend=False, row=1, col=2)
        gaps.append((colour, compare_outputs(runs[name], runs[reference], loss=loss)["max_weight_diff"]))
    fig.add_bar(x=names, y=[g for _, g in gaps], marker_color=[c for c, _ in gaps], showlegend=False, row=1, col=3)
    for col in (2, 3):
        fig.update_yaxes(type="log", exponentformat="power", row=1, col=col)
    for col in (1, 2):
        fig.update_xaxes(title_text="step", row=1, col=col)
    return layout(fig, "R ranks against one process", height=400, below="legend")


def rank_loads_figure(loads: dict[str, list[float]], cost: str = "attention work (causal score pairs, sum of L(L+1)/2)") -> go.Figure:
    """Grouped bars: ``loads[method]`` is each rank's load; the legend gives each method's straggler ratio."""
    fig = go.Figure()
    for method, per_rank in loads.items():
        fig.add_bar(name=f"{method}: ratio {straggler_ratio(per_rank):.2f}",
                    x=[f"rank {r}" for r in range(len(per_rank))], y=list(per_rank))
    n = max(len(v) for v in loads.values())
    return layout(fig, f"one step, {n} ranks: {cost} per rank", height=360, below="legend", barmode="group",
                  yaxis_title=cost)
