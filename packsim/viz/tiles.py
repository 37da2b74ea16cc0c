"""Tile map (notebook 08): which (query tile, key tile) blocks attention computes over a pack.

Two views of the same pack of ``N`` tokens, cut into ``tile x tile`` blocks:

- the pack-aligned grid (what a block-sparse kernel such as FlexAttention sees): each tile is
  *skipped* (no query may see any key in it), *partial* (computed, mask applied per element:
  a boundary or the diagonal crosses it) or *full* (computed, no mask needed);
- a flash-style varlen kernel: tiles start at each sequence's own offset (``cu_seqlens``), so
  no tile straddles two sequences and nothing across sequences is ever visited.

The tiles and the numbers come from :mod:`packsim.core.tiles` (the one tile classifier,
:func:`~packsim.core.tiles.tile_grid`, and :func:`~packsim.core.tiles.attention_work`): score
pairs of dense-mask SDPA (N^2, nothing skipped), of a causal kernel over the whole pack (the leaky
setup) and of varlen (sum of L_i^2 / 2), and the tile counts of both views. Its HTML is in the
``tiles_*`` files of ``packsim/viz/frontend/`` (:mod:`packsim.viz.assets`).

Lessons: 08, A7.
"""

from __future__ import annotations

import math
import re

import ipywidgets as widgets
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from packsim.core.batch import PackedBatch
from packsim.core.errors import PacksimError
from packsim.core.segments import check_cu_seqlens, cu_seqlens_from_lengths
from packsim.core.tiles import AttentionWork, attention_work, tile_grid, varlen_tiles
from packsim.viz.assets import template
from packsim.viz.style import LEAK_RED, TILE_SCALE, add_boundaries, layout, tile_colorbar
from packsim.viz.widget import PacksimWidget, check_row, escape, show_figure, style_html

__all__ = ["TileMap", "tile_map", "tile_figure", "as_cu_seqlens"]

DEFAULT_LENGTHS = (100, 300, 28, 340, 256)  # FlexAttention blog's document example (1024 tokens)
TILES = (16, 32, 64, 128, 256)
MAX_TILES_PER_SIDE = 256
_NAMES = ("skipped", "partial (mask per element)", "full (no mask)")


def as_cu_seqlens(pack, row: int = 0) -> torch.Tensor:
    """cu_seqlens (S+1,) int32 of a pack: lengths, cu_seqlens, or one row of a PackedBatch."""
    if isinstance(pack, PackedBatch):
        row = check_row(pack, row)
        lengths = pack.row_lengths()[row]
    elif isinstance(pack, torch.Tensor) and pack.dtype == torch.int32:
        check_cu_seqlens(pack, int(pack[-1]) if pack.numel() else 0)
        return pack
    else:
        try:
            lengths = [int(x) for x in (pack.tolist() if hasattr(pack, "tolist") else pack)]
        except (TypeError, ValueError) as err:
            raise PacksimError(
                f"cannot read sequence lengths from {pack!r}: pass a list of positive ints, a "
                "cu_seqlens int32 tensor or a PackedBatch."
            ) from err
    if not lengths or min(lengths) < 1:
        raise PacksimError(f"sequence lengths must be positive ints, at least one; got {lengths}.")
    return cu_seqlens_from_lengths(lengths)


def _check_tile(tile, N: int) -> int:
    if isinstance(tile, bool) or not isinstance(tile, int) or tile < 1:
        raise PacksimError(f"tile must be a positive int (e.g. 128), got {tile!r}.")
    if math.ceil(N / tile) > MAX_TILES_PER_SIDE:
        raise PacksimError(
            f"{N} tokens in tiles of {tile} make {math.ceil(N / tile)} tiles per side; the map "
            f"draws at most {MAX_TILES_PER_SIDE}: use a larger tile "
            f"(>= {math.ceil(N / MAX_TILES_PER_SIDE)})."
        )
    return tile


def _work_html(w: AttentionWork) -> str:
    rows = [("dense mask + SDPA (nothing skipped)", f"{w.dense_pairs:,}", f"{w.tiles_total:,}")]
    if w.causal:  # without causal, a kernel over the whole pack is the dense row again
        rows.append(("causal kernel over the whole pack (leaks)", f"{w.pack_pairs:,}", "-"))
    rows += [
        (
            "block-sparse, pack-aligned tiles (Flex)",
            "-",
            f"{w.tiles_computed:,} ({w.tiles_full} full, {w.tiles_partial} partial)",
        ),
        ("varlen kernel (per-sequence tiles)", f"{w.varlen_pairs:,}", f"{w.varlen_tiles:,}"),
    ]
    row = template("tiles_work_row.html").substitute
    body = "".join(row(how=escape(a), pairs=b, tiles=c) for a, b, c in rows)
    return template("tiles_work.html").substitute(
        tokens=w.tokens, sequences=w.num_seqs, tile=w.tile,
        mask="causal" if w.causal else "not causal", saving=f"{w.saving:.1f}",
        skipped=w.tiles_skipped, total=w.tiles_total, rows=body,
    )  # fmt: skip


def _figure(cu: torch.Tensor, tile: int, causal: bool) -> go.Figure:
    N = int(cu[-1])
    grid = tile_grid(cu, tile, causal)  # (n, n)
    work = attention_work(cu, causal=causal, tile=tile)
    n = grid.shape[0]
    fig = make_subplots(
        rows=1,
        cols=2,
        horizontal_spacing=0.08,
        subplot_titles=(
            f"pack-aligned tiles: {work.tiles_computed} computed, "
            f"{work.tiles_skipped} skipped of {n * n}",
            f"varlen kernel: {work.varlen_tiles} tiles, each inside one sequence",
        ),
    )
    edges = [min(i * tile, N) for i in range(n + 1)]  # (n+1,) tile edges in tokens: 0 .. N
    hover = [
        [
            f"query tokens {edges[i]}-{edges[i + 1] - 1}, key tokens {edges[j]}-{edges[j + 1] - 1}: "
            f"{_NAMES[int(grid[i, j])]}"
            for j in range(n)
        ]
        for i in range(n)
    ]
    fig.add_trace(
        go.Heatmap(
            z=grid.tolist(),
            x=edges,  # n+1 values: brick edges, so the cells cover exactly 0..N
            y=edges,
            zmin=0,
            zmax=2,
            colorscale=TILE_SCALE,
            xgap=1,
            ygap=1,
            customdata=hover,
            colorbar=tile_colorbar(0.35, 0.23),
            hovertemplate="%{customdata}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    xs, ys = [], []
    for q0, q1, k0, k1 in varlen_tiles(cu, tile, causal):
        xs += [k0, k1, k1, k0, k0, None]
        ys += [q0, q0, q1, q1, q0, None]
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=ys,
            fill="toself",
            mode="lines",
            line=dict(color="#fff", width=0.5),
            fillcolor="#3182bd",
            hoverinfo="skip",
            showlegend=False,
        ),
        row=1,
        col=2,
    )
    for col in (1, 2):
        add_boundaries(fig, cu.tolist()[1:-1], 0, N, col=col, colour=LEAK_RED, dash="dot")
        # constrain="domain": the square aspect shrinks the panel, never widens the token range
        fig.update_xaxes(range=[0, N], constrain="domain", title_text="key token", row=1, col=col)
        fig.update_yaxes(
            range=[N, 0],
            constrain="domain",
            title_text="query token",
            row=1,
            col=col,
            scaleanchor=f"x{col if col > 1 else ''}",
        )
    mask = "causal" if causal else "not causal"
    return layout(
        fig,
        f"{N} tokens, {work.num_seqs} sequences, tiles of {tile}, {mask}: dense "
        f"{work.dense_pairs:,} score pairs<br>vs varlen {work.varlen_pairs:,} "
        f"({work.saving:.1f}x less); dotted red lines: sequence boundaries",
        600,
        below="colorbar",
    )


def tile_figure(
    pack=DEFAULT_LENGTHS, tile: int = 128, causal: bool = True, row: int = 0
) -> go.Figure:
    """Static tile map (notebook 08) of a pack: lengths, cu_seqlens (int32) or a PackedBatch row."""
    cu = as_cu_seqlens(pack, row)
    return _figure(cu, _check_tile(tile, int(cu[-1])), causal)


def _parse_lengths(text: str) -> list[int]:
    parts = [p for p in re.split(r"[\s,;]+", text.strip()) if p]
    if not parts or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise PacksimError(f"could not read {text!r}: type positive lengths separated by commas.")
    return [int(p) for p in parts]


class TileMap(PacksimWidget):
    """Tile map widget; build it with :func:`tile_map`. Controls: lengths, tile, causal."""

    def __init__(self, cu: torch.Tensor, tile: int = 128, causal: bool = True):
        lengths = (cu[1:] - cu[:-1]).tolist()
        self.lengths = widgets.Text(
            value=", ".join(map(str, lengths)),
            description="lengths",
            continuous_update=False,
            layout=widgets.Layout(width="460px"),
        )
        self.tile = widgets.Dropdown(
            options=sorted(set(TILES) | {tile}),
            value=tile,
            description="tile",
            layout=widgets.Layout(width="160px"),
        )
        self.causal = widgets.Checkbox(value=causal, description="causal")
        self.out = widgets.Output(layout=widgets.Layout(min_height="610px"))
        self.numbers = widgets.HTML()
        self.message = widgets.HTML()
        for w in (self.lengths, self.tile, self.causal):
            w.observe(lambda _c: self.update(), names="value")
        self.widget = widgets.VBox(
            [
                style_html(),
                widgets.HBox([self.lengths, self.tile, self.causal]),
                self.message,
                self.out,
                self.numbers,
            ]
        )
        self.widget.add_class("packsim-tiles")
        self.update()

    def cu_seqlens(self) -> torch.Tensor:
        return as_cu_seqlens(_parse_lengths(self.lengths.value))

    def figure(self) -> go.Figure:
        cu = self.cu_seqlens()
        return _figure(cu, _check_tile(self.tile.value, int(cu[-1])), self.causal.value)

    def update(self) -> None:
        """Redraw; bad lengths or too small a tile show a message instead of raising."""
        try:
            cu = self.cu_seqlens()
            tile = _check_tile(self.tile.value, int(cu[-1]))
        except PacksimError as err:
            message = template("tiles_message.html")
            self.message.value = message.substitute(message=escape(err))
            return
        self.message.value = ""
        show_figure(self.out, _figure(cu, tile, self.causal.value))
        self.numbers.value = _work_html(attention_work(cu, causal=self.causal.value, tile=tile))


def tile_map(pack=DEFAULT_LENGTHS, tile: int = 128, causal: bool = True, row: int = 0) -> TileMap:
    """Tile map widget (notebook 08): computed vs skipped tiles, dense vs varlen work.

    ``pack``: sequence lengths (default: the FlexAttention blog's 1024-token document example),
    a cu_seqlens int32 tensor, or a PackedBatch (its row ``row``).
    """
    cu = as_cu_seqlens(pack, row)
    return TileMap(cu, tile=_check_tile(tile, int(cu[-1])), causal=causal)
