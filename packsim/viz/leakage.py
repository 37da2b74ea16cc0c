"""Leakage explorer (notebooks 02, 06, 07): click a token, see where its attention goes.

The same pack is shown in one panel per setup (``buggy`` and ``correct`` by default). Clicking a
token chip selects it as the *query* in every panel; each panel then shades every key token by
the attention weight the query gives it (layer and head selectable, or averaged) and prints the
share of that attention landing outside the query's own example. Keys of another example that
get any weight are underlined in red with their weight: under ``buggy`` every example after the
first in a row reads its neighbours; under ``correct`` the share is exactly 0.

Attention comes from :func:`packsim.core.model.attention_maps` (``(L, B, H, T, T)``) under each
panel's setup, computed once when the widget is built (packs here are short: 48-96 tokens).

Lessons: 02, 06, 07.
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from packsim.core.attention_share import mean_outside_share, outside_share
from packsim.core.batch import PackedBatch
from packsim.core.device import model_device
from packsim.core.errors import PacksimError
from packsim.core.loss import Role
from packsim.core.model import attention_maps, build_model
from packsim.core.segments import run_starts
from packsim.core.setups import get_setup
from packsim.viz.style import LEAK_RED, add_boundaries, example_colour, layout
from packsim.viz.widget import (
    PacksimWidget,
    as_batch,
    check_row,
    escape,
    example_name,
    row_dropdown,
    style_html,
    token_glyphs,
)

__all__ = [
    "LeakageExplorer",
    "leakage_explorer",
    "leakage_figure",
    "key_weights",
]

MEAN = "mean"
_MASK_TEXT = {
    "causal": "causal mask over the whole pack: each example also sees the ones before it",
    "block_diagonal": "block-diagonal mask: each example sees only itself",
}


def _check_choice(value, n: int, what: str):
    """``value`` is ``"mean"`` or an index in ``[0, n)``; PacksimError otherwise."""
    if value == MEAN:
        return MEAN
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
        raise PacksimError(f"{what}={value!r} is not valid: use 'mean' or an int in 0..{n - 1}.")
    return value


def key_weights(maps: torch.Tensor, row: int, query: int, layer=MEAN, head=MEAN) -> torch.Tensor:
    """Attention of one query token over the keys of its row: maps (L, B, H, T, T) -> (T,).

    ``layer`` / ``head``: an index or ``"mean"`` (average over layers / heads). The result sums
    to 1 over the keys the query may see. Used by the leakage explorer (notebooks 02, 06, 07).
    """
    L, _, H, T, _ = maps.shape
    layer, head = _check_choice(layer, L, "layer"), _check_choice(head, H, "head")
    if isinstance(query, bool) or not isinstance(query, int) or not 0 <= query < T:
        raise PacksimError(f"query={query!r} is not a token of the row: pick 0..{T - 1}.")
    return _pick(maps[:, row, :, query, :], layer, head)  # (L, H, T) -> (T,)


def _pick(m: torch.Tensor, layer, head) -> torch.Tensor:
    """One layer and head (or the mean over them) of attention ``m`` (L, H, ...) -> (...)."""
    m = m.mean(0) if layer == MEAN else m[layer]  # (H, ...)
    return m.mean(0) if head == MEAN else m[head]


def _query_share(weights: torch.Tensor, seq_row: torch.Tensor, query: int) -> float:
    """:func:`~packsim.core.attention_share.outside_share` of one query: its ``weights`` (T,) over row ``seq_row`` (T,)."""
    T = weights.shape[-1]
    rows = weights.expand(T, T)[None, None]  # (1, 1, T, T): this query's weights in every row
    return float(outside_share(rows, seq_row[None])[0, 0, query])


def _models_for(models, batch: PackedBatch, seed: int, setups) -> dict:
    """``{setup name: model}``; None -> one untrained tiny model shared by every setup."""
    if models is None:
        from packsim.core.tokenizer import VOCAB_SIZE

        vocab = max(VOCAB_SIZE, int(batch.input_ids.max()) + 1)
        model = build_model("tiny", vocab_size=vocab, seed=seed)
        return {name: model for name in setups}
    if not isinstance(models, dict) or not models:
        raise PacksimError(
            "models must be a dict {setup name: model}, e.g. {'buggy': m1, 'correct': m2}, "
            f"or None for one untrained tiny model; got {type(models).__name__}."
        )
    for name in models:
        get_setup(name)  # raises with the list of presets
    return dict(models)


def _maps(model, batch: PackedBatch, setup: str) -> torch.Tensor:
    """Attention maps (L, B, H, T, T), float on CPU, of ``batch`` under ``setup`` (any device)."""
    device = model_device(model)
    return attention_maps(model, batch.with_setup(setup).to(device)).float().cpu()


def _token_desc(glyph: str, k: int, ex: int, role: int, seq_row: torch.Tensor) -> str:
    where = "padding" if ex < 0 else f"{example_name(ex, seq_row)}, {Role(role).label}"
    return f"token {k} {glyph!r} ({where})"


def attention_html(glyphs, seq_row, weights, query: int | None) -> str:
    """HTML of one row's keys shaded by ``weights`` (T,) of ``query``; leaks underlined in red."""
    T = len(glyphs)
    q_ex = int(seq_row[query]) if query is not None else None
    w = weights.tolist() if weights is not None else [0.0] * T
    w_max = max(w) or 1.0
    spans = []
    starts = run_starts(seq_row).tolist()  # (T,): a new example (or padding run) begins here
    for k in range(T):
        ex = int(seq_row[k])
        cls = ["packsim-key"]
        if starts[k]:
            cls.append("packsim-ex-start")
        sup = ""
        if query is not None:
            if k == query:
                cls.append("packsim-key-query")
            elif k > query:
                cls.append("packsim-key-future")
            if ex != q_ex and w[k] > 0:
                cls.append("packsim-key-outside")
                sup = f"<sup>{w[k]:.1%}</sup>"
        alpha = 0.75 * w[k] / w_max
        style = f"background: rgba(31,119,180,{alpha:.3f}); border-top-color: {example_colour(ex)};"
        where = example_name(ex, seq_row)
        title = f"key {k} {glyphs[k]!r} ({where})" + ("" if query is None else f": {w[k]:.2%}")
        spans.append(
            f'<span class="{" ".join(cls)}" style="{style}" title="{escape(title)}">'
            f"{escape(glyphs[k])}{sup}</span>"
        )
    if query is None:
        caption = "Click a token above to see where its attention goes."
    else:
        caption = (
            "Shading: attention weight of the outlined query token. "
            f'<span style="color:{LEAK_RED}">Red underline: weight on another example.</span>'
        )
    return (
        f'<div style="font-size:12px;color:#555">{caption}</div>'
        f'<div style="line-height:2.1;font-size:13px">{"".join(spans)}</div>'
    )


def share_html(share: float | None, query: int | None, desc: str) -> str:
    """The outside-share line, e.g. ``outside its example: 37.2%``; 0.0% only when exactly 0."""
    if query is None:
        return "outside its example: (click a token)"
    note = " (padding: its output is never used)" if "(padding)" in desc else ""
    colour = LEAK_RED if share > 0 else "#2ca02c"
    text = "&lt;0.05%" if 0 < share < 0.0005 else f"{share:.1%}"  # a leak never reads as 0.0%
    return (
        f'<span style="color:{colour};font-weight:bold;font-size:15px">'
        f"outside its example: {text}</span>"
        f'<span style="color:#555"> &nbsp;query: {escape(desc)}{note}</span>'
    )


class _Panel:
    """One setup's view: title, token chips, attention view, outside share."""

    def __init__(self, name: str, explorer: LeakageExplorer):
        self.name = name
        self.explorer = explorer
        setup = get_setup(name)
        self.title = widgets.HTML(f"<b>{escape(name)}</b>: {_MASK_TEXT[setup.mask]}")
        self.chips: list[widgets.Button] = []
        self.chip_box = widgets.Box(layout=widgets.Layout(flex_flow="row wrap"))
        self.attention = widgets.HTML()
        self.attention.add_class("packsim-attention")
        self.share = widgets.HTML()
        self.share.add_class("packsim-outside-share")
        self.box = widgets.VBox(
            [self.title, self.chip_box, self.share, self.attention],
            layout=widgets.Layout(width="50%", padding="0 6px"),
        )
        self.box.add_class("packsim-leakage-panel")
        self.box.add_class(f"packsim-panel-{name}")

    def build_chips(self) -> None:
        """New chips for the explorer's current row (old ones are closed)."""
        ex = self.explorer
        for chip in self.chips:
            chip.close()
        seq, roles = ex.batch.seq_ids[ex.row], ex.batch.roles[ex.row]
        self.chips = []
        starts = run_starts(seq).tolist()  # (T,)
        for k, glyph in enumerate(ex.glyphs):
            e = int(seq[k])
            chip = widgets.Button(
                description=glyph,
                tooltip=_token_desc(glyph, k, e, int(roles[k]), seq),
                layout=widgets.Layout(
                    width="auto", min_width="22px", height="26px", padding="0 3px", margin="1px"
                ),
            )
            chip.style.button_color = example_colour(e)
            chip.add_class("packsim-token")
            if starts[k]:
                chip.add_class("packsim-ex-start")
            if e < 0:
                chip.add_class("packsim-pad")
            chip.on_click(lambda _b, k=k: ex.select(k))
            self.chips.append(chip)
        self.chip_box.children = self.chips

    def render(self, previous: int | None) -> None:
        """Show the explorer's current query; move the selected-chip outline from ``previous``."""
        ex = self.explorer
        q = ex.query
        if previous is not None and previous != q and previous < len(self.chips):
            self.chips[previous].remove_class("packsim-selected")
        if q is not None:
            self.chips[q].add_class("packsim-selected")
        w = None if q is None else ex.weights(self.name, q)
        seq = ex.batch.seq_ids[ex.row]
        self.attention.value = attention_html(ex.glyphs, seq, w, q)
        share = None if q is None else _query_share(w, seq, q)
        desc = (
            ""
            if q is None
            else _token_desc(ex.glyphs[q], q, int(seq[q]), int(ex.batch.roles[ex.row, q]), seq)
        )
        self.share.value = share_html(share, q, desc)


class LeakageExplorer(PacksimWidget):
    """Click-a-token leakage explorer; build it with :func:`leakage_explorer`.

    Attributes: ``batch`` (the pack), ``maps`` (``{setup: (L, B, H, T, T)}``), ``panels``
    (``{setup: panel}`` with ``.chips``, ``.attention``, ``.share``), ``query`` (selected token or
    None), ``row``; controls ``layer``, ``head``, ``row_picker``.
    """

    def __init__(self, batch: PackedBatch, models: dict, row: int = 0):
        self.batch = batch
        self.models = models
        self.maps = {name: _maps(m, batch, name) for name, m in models.items()}
        L, _, H = next(iter(self.maps.values())).shape[:3]
        self.row = check_row(batch, row)
        self.query: int | None = None
        self.layer, self.head = (
            widgets.Dropdown(
                options=[("mean", MEAN)] + [(f"{what} {i}", i) for i in range(n)],
                value=MEAN, description=what, layout=widgets.Layout(width="180px"),
            )
            for what, n in (("layer", L), ("head", H))
        )  # fmt: skip
        self.row_picker = row_dropdown(batch, self.row)
        self.layer.observe(lambda _c: self._render_all(self.query), names="value")
        self.head.observe(lambda _c: self._render_all(self.query), names="value")
        self.row_picker.observe(lambda c: self.set_row(c["new"]), names="value")
        self.header = widgets.HTML()
        self.panels = {name: _Panel(name, self) for name in models}
        self.widget = widgets.VBox(
            [
                style_html(),
                self.header,
                widgets.HBox([self.row_picker, self.layer, self.head]),
                widgets.HBox([p.box for p in self.panels.values()]),
            ]
        )
        self.widget.add_class("packsim-leakage")
        self.set_row(self.row, force=True)

    # ---- state ---------------------------------------------------------------------------

    @property
    def glyphs(self) -> list[str]:
        return self._glyphs

    def weights(self, setup: str, query: int) -> torch.Tensor:
        """(T,) attention of ``query`` (current row) under ``setup``, current layer/head choice."""
        return key_weights(self.maps[setup], self.row, query, self.layer.value, self.head.value)

    def outside_share(self, setup: str, query: int | None = None) -> float | None:
        """Share of ``query``'s (default: the selected token's) attention outside its example."""
        q = self.query if query is None else query
        if q is None:
            return None
        return _query_share(self.weights(setup, q), self.batch.seq_ids[self.row], q)

    def select(self, query: int | None) -> None:
        """Select token ``query`` of the current row in every panel (what a chip click does)."""
        T = self.batch.shape[1]
        if query is not None and (
            isinstance(query, bool) or not isinstance(query, int) or not 0 <= query < T
        ):
            raise PacksimError(
                f"query={query!r} is not a token of the row: pick 0..{T - 1} or None."
            )
        if query == self.query:
            return  # repeated click: nothing changes, send nothing
        previous, self.query = self.query, query
        self._render_all(previous)

    def set_row(self, row: int, force: bool = False) -> None:
        """Show row ``row`` of the batch (chips rebuilt, selection cleared)."""
        row = check_row(self.batch, row)
        if row == self.row and not force:
            return
        self.row, self.query = row, None
        if self.row_picker.value != row:
            self.row_picker.value = row
        self._glyphs = token_glyphs(self.batch.input_ids[row])
        seq = self.batch.seq_ids[row]
        n_ex = len({int(s) for s in seq.tolist() if s >= 0})
        shared = len({id(m) for m in self.models.values()}) == 1
        model_text = (
            "the same model in every panel: only the mask differs"
            if shared
            else "each panel uses the model trained under its setup"
        )
        self.header.value = (
            f"<b>Pack row {row}</b>: {int((seq >= 0).sum())} tokens of {n_ex} example(s), "
            f"{int((seq < 0).sum())} padding; {model_text}. Each colour is one example; a thick "
            "left border marks where an example starts. Examples are numbered by their index in "
            "the batch (hover a token: e.g. 'example 3 of the batch (2nd in this row)'). Click "
            "any token: every panel shows where that token looks under its setup."
        )
        for panel in self.panels.values():
            panel.build_chips()
        self._render_all(None)

    def _render_all(self, previous: int | None) -> None:
        for panel in self.panels.values():
            panel.render(previous)

    def figure(self) -> go.Figure:
        """Static version of the current view (see :func:`leakage_figure`)."""
        return _figure(
            self.batch, self.maps, self.row, self.query, self.layer.value, self.head.value
        )


def leakage_explorer(
    examples_or_batch,
    models: dict | None = None,
    capacity: int = 64,
    seed: int = 0,
    strategy: str = "bfd",
    setups=("buggy", "correct"),
    row: int = 0,
) -> LeakageExplorer:
    """Click-a-token leakage explorer over a pack (notebooks 02, 06, 07).

    ``examples_or_batch``: examples (packed here into rows of ``capacity`` tokens with
    ``strategy``) or a packed :class:`PackedBatch`. ``models``: ``{setup name: model}`` (one
    panel per entry, e.g. the trained ``buggy`` and ``correct`` models of notebook 06) or None:
    one untrained tiny model (``seed``) shared by ``setups``, so only the mask differs.
    """
    batch = as_batch(examples_or_batch, capacity, strategy=strategy)
    return LeakageExplorer(batch, _models_for(models, batch, seed, setups), row=row)


def _figure(batch, maps: dict, row: int, query, layer, head) -> go.Figure:
    seq = batch.seq_ids[row]  # (T,)
    glyphs = token_glyphs(batch.input_ids[row])
    T = len(glyphs)
    names = list(maps)
    mats = {}
    for name, m in maps.items():
        L, _, H = m.shape[:3]
        layer_, head_ = _check_choice(layer, L, "layer"), _check_choice(head, H, "head")
        mats[name] = _pick(m[:, row], layer_, head_)  # (L, H, T, T) -> (T, T)
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
    ``query`` outlines one query row. Arguments as :func:`leakage_explorer`.
    """
    batch = as_batch(examples_or_batch, capacity, strategy=strategy)
    row = check_row(batch, row)
    models = _models_for(models, batch, seed, setups)
    maps = {name: _maps(m, batch, name) for name, m in models.items()}
    return _figure(batch, maps, row, query, layer, head)
