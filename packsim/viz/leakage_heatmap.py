"""The leakage explorer's static figure: one (query x key) attention heatmap per setup.

For HTML export and front ends without a kernel. Each panel is a pack row's attention under one
setup, (T, T) for one layer and head or their mean (:func:`packsim.viz.leakage_data.row_weights`
of maps (L, B, H, T, T)), with lines at example boundaries and the mean share of attention outside
each token's own example in its title; ``query`` outlines one query row. The interactive explorer
is :mod:`packsim.viz.leakage`; its ``.figure()`` draws this for its current view.

Lessons: none directly (lessons 02, 06 and 07 open the interactive explorer).
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from packsim.core.attention_share import mean_outside_share
from packsim.core.segments import run_starts
from packsim.viz.leakage_data import MEAN, panel_models, row_weights, setup_maps
from packsim.viz.style import LEAK_RED, add_boundaries, layout
from packsim.viz.widget import as_batch, check_row, token_glyphs

__all__ = ["attention_heatmaps", "leakage_figure"]


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
