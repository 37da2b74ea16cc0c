"""The leakage explorer's static figure: one (query x key) attention heatmap per setup.

For HTML export and front ends without a kernel. Each panel is a pack row's attention under one
setup, (T, T) for one layer and head or their mean (:func:`packsim.viz.leakage_data.row_weights`
of maps (L, B, H, T, T)), with lines at example boundaries and the mean share of attention outside
each token's own example in its title; ``query`` outlines one query row. The interactive explorer
is :mod:`packsim.viz.leakage`; its ``.figure()`` draws this for its current view.

Lessons: A2.
"""

from __future__ import annotations

import plotly.graph_objects as go
import torch
from plotly.colors import hex_to_rgb
from plotly.subplots import make_subplots

from packsim.core.attention_share import mean_outside_share
from packsim.core.errors import PacksimError
from packsim.core.segments import run_starts
from packsim.viz.leakage_data import MEAN, panel_models, row_weights, setup_maps
from packsim.viz.style import LEAK_RED, add_boundaries, layout
from packsim.viz.widget import as_batch, check_row, token_glyphs

__all__ = ["attention_heatmaps", "leakage_figure", "outside_share_figure"]


def attention_heatmaps(batch, maps: dict, row: int, query=None, layer=MEAN, head=MEAN) -> go.Figure:
    """One (query x key) heatmap per setup of ``maps`` ({setup: (L, B, H, T, T)}), row ``row`` of ``batch``."""
    seq = batch.seq_ids[row]  # (T,)
    glyphs = token_glyphs(batch.input_ids[row])
    T = len(glyphs)
    names = list(maps)
    mats = {name: row_weights(m, row, layer, head) for name, m in maps.items()}  # (T, T) each
    titles = [
        f"{n}: {mean_outside_share(mats[n][None, None], seq[None]):.1%} of attention outside its example"
        for n in names
    ]
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=titles, horizontal_spacing=0.08)
    labels = [f"{k} {g!r}" for k, g in enumerate(glyphs)]
    pairs = [[f"query {q}<br>key {k}" for k in labels] for q in labels]  # (T, T) hover text
    starts = [k for k in run_starts(seq).nonzero().flatten().tolist() if k > 0]
    for c, name in enumerate(names, start=1):
        fig.add_trace(
            go.Heatmap(
                z=mats[name].tolist(),  # x, y: token 0..T-1
                colorscale="Blues",
                zmin=0,
                showscale=c == 1,
                customdata=pairs,
                hovertemplate=f"%{{customdata}}<br>weight %{{z:.3f}}<extra>{name}</extra>",
            ),
            row=1,
            col=c,
        )
        add_boundaries(fig, [k - 0.5 for k in starts], -0.5, T - 0.5, col=c)  # examples
        if query is not None:
            fig.add_shape(
                type="rect",
                x0=-0.5,
                x1=T - 0.5,
                y0=query - 0.5,
                y1=query + 0.5,
                line=dict(color=LEAK_RED, width=2),
                row=1,
                col=c,
            )
        fig.update_yaxes(
            range=[T - 0.5, -0.5], showticklabels=False, title_text="query", row=1, col=c
        )
        fig.update_xaxes(range=[-0.5, T - 0.5], showticklabels=False, title_text="key", row=1, col=c)
    return layout(
        fig,
        f"Attention of pack row {row} (layer {layer}, head {head}); lines mark example boundaries",
        480,
    )


def leakage_figure(
    examples_or_batch,
    models: dict | None = None,
    capacity: int = 64,
    seed: int = 0,
    strategy: str = "bfd",
    setups=("buggy", "correct"),
    row: int = 0,
    query: int | None = None,
    layer=MEAN,
    head=MEAN,
) -> go.Figure:
    """Static leakage figure for HTML export: one (query x key) attention heatmap per setup.

    Subplot titles give the mean share of attention outside each token's own example;
    ``query`` outlines one query row. Arguments as :func:`~packsim.viz.leakage.leakage_explorer`.
    """
    batch = as_batch(examples_or_batch, capacity, strategy=strategy)
    row = check_row(batch, row)
    models = panel_models(models, batch, seed, setups)
    maps = setup_maps(models, batch)
    return attention_heatmaps(batch, maps, row, query, layer, head)


def outside_share_figure(shares: dict, seq_ids, reference: str | None = None) -> go.Figure:
    """Share of each token's attention outside its own example, one bar series per model (notebook 02).

    ``shares``: {label: (T,) share per query token}, e.g. :func:`packsim.core.attention_share.outside_share`
    of maps (L, B, H, T, T) averaged over layers and heads, row 0; ``seq_ids`` (T,): the example of
    each token, -1 on padding (left out). ``reference``: the label drawn as a line instead of bars
    (e.g. uniform attention). Dotted lines mark where each example after the first starts.
    """
    seq = torch.as_tensor(seq_ids)  # (T,)
    real = seq >= 0  # (T,)
    if reference is not None and reference not in shares:
        raise PacksimError(f"reference {reference!r} is not a label of shares: use one of {list(shares)}.")
    for label, share in shares.items():
        if torch.as_tensor(share).shape != seq.shape:
            raise PacksimError(
                f"shares[{label!r}] has shape {tuple(torch.as_tensor(share).shape)}; it must be "
                f"(T,) = {tuple(seq.shape)} like seq_ids."
            )
    x = torch.arange(len(seq))[real].tolist()
    bars = [label for label in shares if label != reference]
    fig = go.Figure()
    for i, label in enumerate(bars):
        alpha = 1.0 if len(bars) == 1 else 0.4 + 0.6 * i / (len(bars) - 1)  # darker = later
        colour = "rgba({}, {}, {}, {:.2f})".format(*hex_to_rgb(LEAK_RED), alpha)  # lighter first
        y = torch.as_tensor(shares[label])[real].tolist()
        fig.add_trace(go.Bar(x=x, y=y, name=label, marker_color=colour))
    if reference is not None:
        y = torch.as_tensor(shares[reference])[real].tolist()
        fig.add_trace(go.Scatter(x=x, y=y, name=reference, mode="lines",
                                 line=dict(color="dimgray", shape="hvh")))  # fmt: skip
    starts = (run_starts(seq) & real).nonzero().flatten().tolist()  # each example's first token
    for k in starts[1:]:
        fig.add_vline(x=k - 0.5, line=dict(color="dimgray", dash="dot"))
    return layout(
        fig,
        "Share of each token's attention outside its example (dotted: boundaries)",
        340,
        xaxis_title="token in the row",
        yaxis_title="outside share",
        yaxis_tickformat=".0%",
        barmode="group",
    )
