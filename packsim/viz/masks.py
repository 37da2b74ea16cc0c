"""Mask explorer (notebook 03): causal vs block-diagonal masks of a pack, and Flex block sparsity.

Three heatmaps for one packed row: the plain causal mask over the pack (the bug: the lower
triangle reaches across examples), the block-diagonal causal mask (the fix), and FlexAttention's
view of the fix: per (query block, key block) of ``block_size`` tokens, whether the kernel skips
it, computes it with the mask applied per element (partial) or computes it unmasked (full). The
counts compare with the block map of the plain causal mask, which skips only blocks above the
diagonal; the score-pair counts (:func:`pair_counts`) compare causal and block-diagonal over the same
real tokens, the padding's causal pairs named apart.

Lessons: 02, 03.
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from packsim.core.data import make_examples
from packsim.core.errors import PacksimError
from packsim.core.masks import block_diagonal_mask, block_sparsity, causal_mask, flex_block_mask
from packsim.viz.style import TILE_SCALE, add_boundaries, example_colorscale, layout, tile_colorbar
from packsim.viz.widget import (
    PacksimWidget,
    as_batch,
    check_row,
    row_dropdown,
    show_figure,
    style_html,
)

__all__ = ["MaskExplorer", "mask_explorer", "mask_figure", "row_sparsity", "pair_counts", "BLOCK_SIZES",
           "allowed_pairs_figure"]

BLOCK_SIZES = (4, 8, 16, 32, 64, 128)
_BLOCK_NAMES = ("skipped", "partial (mask applied)", "full (no mask needed)")


def _check_block(block_size) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise PacksimError(f"block_size must be a positive int (e.g. 16), got {block_size!r}.")
    return block_size


def row_sparsity(seq_ids_row: torch.Tensor, block_size: int, document: bool = True):
    """:class:`~packsim.core.masks.BlockSparsity` of one row (T,): document mask, or plain causal."""
    ids = seq_ids_row if document else torch.zeros_like(seq_ids_row)  # one "document" per row
    return block_sparsity(flex_block_mask(ids, causal=True, block_size=_check_block(block_size)))


def pair_counts(seq_ids_row: torch.Tensor) -> dict[str, int]:
    """Score pairs (query, key) one row (T,) lets attend: ``causal`` over the whole row, padding
    included (what a causal kernel computes), ``causal_real`` among its real tokens only, and
    ``block_diagonal`` (real tokens of the same example): the last two count the same tokens."""
    seq = torch.as_tensor(seq_ids_row)
    T, real = seq.numel(), seq >= 0
    causal = causal_mask(T)  # (T, T)
    return {"causal": int(causal.sum()), "causal_real": int((causal & real[:, None] & real[None, :]).sum()),
            "block_diagonal": int(block_diagonal_mask(seq).sum())}


def _causal_title(pairs: dict[str, int]) -> str:
    if pairs["causal"] == pairs["causal_real"]:
        return f"causal over the pack<br>{pairs['causal']} pairs"
    return f"causal over the pack<br>{pairs['causal_real']} pairs of real tokens (+{pairs['causal'] - pairs['causal_real']} padding)"


def _default_batch(examples_or_batch, capacity: int, seed: int):
    if examples_or_batch is None:
        examples_or_batch = make_examples(6, seed=seed)
    return as_batch(examples_or_batch, capacity)


def _figure(batch, row: int, block_size: int) -> go.Figure:
    seq = batch.seq_ids[row]  # (T,)
    T = seq.numel()
    masks = {"causal": causal_mask(T), "block_diagonal": block_diagonal_mask(seq)}  # (T, T) bool
    doc, plain = row_sparsity(seq, block_size), row_sparsity(seq, block_size, document=False)
    pairs = pair_counts(seq)
    titles = (
        _causal_title(pairs),
        f"block-diagonal<br>{pairs['block_diagonal']} pairs",
        f"Flex blocks of {block_size}: {doc.skipped}/{doc.total} skipped<br>"
        f"(causal alone: {plain.skipped})",
    )
    fig = make_subplots(rows=1, cols=3, subplot_titles=titles, horizontal_spacing=0.06)
    grid_lines = [k - 0.5 for k in range(block_size, T, block_size)]
    for col, m in enumerate(masks.values(), start=1):
        fig.add_trace(
            go.Heatmap(
                z=m.int().tolist(),  # x, y: token 0..T-1
                zmin=0,
                zmax=1,
                showscale=False,
                colorscale=[[0, "#f4f4f4"], [1, "#3182bd"]],
                # token indices from x / y: a (T, T) table of hover strings would be most of
                # the figure's size (370 kB of lesson 03's static page at T = 64)
                hovertemplate="query token %{y}<br>key token %{x}<br>may attend: %{z}<extra></extra>",
            ),
            row=1,
            col=col,
        )
    grid = doc.grid[0, 0]  # (nq, nk) 0 skipped, 1 partial, 2 full
    names = [[_BLOCK_NAMES[int(c)] for c in r] for r in grid.tolist()]
    fig.add_trace(
        go.Heatmap(
            z=grid.tolist(),
            zmin=0,
            zmax=2,
            colorscale=TILE_SCALE,
            customdata=names,
            colorbar=tile_colorbar(0.25, 0.86),
            hovertemplate="query block %{y}, key block %{x}: %{customdata}<extra></extra>",
        ),
        row=1,
        col=3,
    )
    n = grid.shape[0]
    for col in (1, 2):  # the block grid over the token maps
        add_boundaries(fig, grid_lines, -0.5, T - 0.5, col=col, colour="#bbb", width=0.5)
    every = -(-n // 8)  # a tick every `every` blocks (at most ~8 a side), at whole blocks only
    for col in (1, 2, 3):
        hi = (T if col < 3 else n) - 0.5  # each panel spans exactly its tokens (or blocks)
        # token panels: a tick at each block start they show; block panel: block 0, 1, ...
        ticks = dict(tickmode="linear", tick0=0, dtick=every if col == 3 else every * block_size,
                     showticklabels=True)  # fmt: skip
        unit = f" ({block_size} tokens each)" if col == 3 else ""
        fig.update_yaxes(range=[hi, -0.5], row=1, col=col, **ticks,
                         title_text=("query block" if col == 3 else "query token") + unit)
        fig.update_xaxes(range=[-0.5, hi], row=1, col=col, **ticks,
                         title_text=("key block" if col == 3 else "key token") + unit)
    return layout(
        fig,
        f"Row {row}: {doc.full} full + {doc.partial} partial blocks computed, "
        f"{doc.skipped} of {doc.total} skipped ({doc.skipped_fraction:.0%}); "
        f"plain causal skips {plain.skipped} ({plain.skipped_fraction:.0%})",
        500,
        below="colorbar",
    )


def mask_figure(
    examples_or_batch=None, capacity: int = 64, block_size: int = 16, row: int = 0, seed: int = 0
) -> go.Figure:
    """Static mask figure (notebook 03): causal, block-diagonal and Flex block map of one row.

    ``examples_or_batch``: examples, a packed PackedBatch, or None for ``make_examples(6, seed)``
    packed at ``capacity``.
    """
    batch = _default_batch(examples_or_batch, capacity, seed)
    return _figure(batch, check_row(batch, row), _check_block(block_size))


class MaskExplorer(PacksimWidget):
    """Mask explorer widget; build it with :func:`mask_explorer`. Controls: ``row``, ``block``."""

    def __init__(self, batch, block_size: int = 16, row: int = 0):
        self.batch = batch
        blocks = sorted(set(BLOCK_SIZES) | {_check_block(block_size)})
        self.row = row_dropdown(batch, row)
        self.block = widgets.Dropdown(
            options=blocks,
            value=block_size,
            description="block size",
            layout=widgets.Layout(width="200px"),
        )
        self.out = widgets.Output(layout=widgets.Layout(min_height="510px"))
        self.counts = widgets.HTML()
        for w in (self.row, self.block):
            w.observe(lambda _c: self.update(), names="value")
        self.widget = widgets.VBox(
            [style_html(), widgets.HBox([self.row, self.block]), self.out, self.counts]
        )
        self.widget.add_class("packsim-mask-explorer")
        self.update()

    def figure(self) -> go.Figure:
        return _figure(self.batch, self.row.value, self.block.value)

    def update(self) -> None:
        """Redraw for the current row and block size."""
        seq = self.batch.seq_ids[self.row.value]
        doc = row_sparsity(seq, self.block.value)
        plain = row_sparsity(seq, self.block.value, document=False)
        show_figure(self.out, self.figure())
        pairs = pair_counts(seq)
        self.counts.value = (
            f"Score pairs among the row's real tokens: <b>causal</b> {pairs['causal_real']}, "
            f"<b>block-diagonal</b> {pairs['block_diagonal']} "
            f"({pairs['block_diagonal'] / max(pairs['causal_real'], 1):.0%} of them)"
            + (f"; a causal kernel over the whole row also computes the padding's: {pairs['causal']} in all. "
               if pairs["causal"] != pairs["causal_real"] else ". ")
            +
            f"<b>block-diagonal</b>: {doc.full} full, {doc.partial} partial, {doc.skipped} skipped "
            f"of {doc.total} blocks ({doc.skipped_fraction:.1%} skipped). "
            f"<b>plain causal</b>: {plain.full} full, {plain.partial} partial, {plain.skipped} "
            f"skipped ({plain.skipped_fraction:.1%}). A dense mask with SDPA skips none."
        )


def mask_explorer(
    examples_or_batch=None, capacity: int = 64, block_size: int = 16, row: int = 0, seed: int = 0
) -> MaskExplorer:
    """Mask explorer widget (notebook 03): pick a row and a block size; see what Flex skips.

    ``examples_or_batch``: examples, a packed PackedBatch, or None for ``make_examples(6, seed)``
    packed at ``capacity``.
    """
    batch = _default_batch(examples_or_batch, capacity, seed)
    return MaskExplorer(batch, block_size=_check_block(block_size), row=row)


def allowed_pairs_figure(masks: dict, seq_ids) -> go.Figure:
    """Who may attend to whom: one (query x key) panel per mask of ``masks`` (notebook 02).

    ``masks``: {panel title: (T, T) bool, [query, key], True = allowed}; ``seq_ids`` (T,): the
    example of each token (-1 padding). An allowed pair is coloured by its key's example (the
    widgets' example colours, :func:`~packsim.viz.style.example_colour`); a masked pair is blank.
    """
    seq = torch.as_tensor(seq_ids)  # (T,)
    if not masks:
        raise PacksimError("masks is empty: pass {title: (T, T) bool mask}, e.g. {'causal': causal_mask(T)}.")
    T = len(seq)
    for name, allowed in masks.items():
        if tuple(torch.as_tensor(allowed).shape) != (T, T):
            raise PacksimError(
                f"mask {name!r} has shape {tuple(torch.as_tensor(allowed).shape)}; seq_ids has {T} "
                f"tokens, so each mask must be ({T}, {T})."
            )
    fig = make_subplots(rows=1, cols=len(masks), subplot_titles=list(masks), horizontal_spacing=0.08)
    n_ex = int(seq.max()) + 1 if T else 0
    for c, allowed in enumerate(masks.values(), start=1):
        z = torch.where(torch.as_tensor(allowed), seq[None, :].float() + 1, float("nan"))  # (T, T)
        fig.add_trace(go.Heatmap(z=z.tolist(), colorscale=example_colorscale(n_ex), zmin=-0.5,
                                 zmax=n_ex + 0.5, showscale=False,
                                 hovertemplate="query %{y}<br>key %{x}<extra></extra>"), row=1, col=c)
        fig.update_yaxes(autorange="reversed", title_text="query token", row=1, col=c)
        fig.update_xaxes(title_text="key token", row=1, col=c)
    return layout(fig, "Who may attend to whom (colour = the key's example)", 380)  # fmt: skip
