"""Leakage explorer (notebooks 02, 06, 07): click a token, see where its attention goes.

The same pack is shown in one panel per setup (``buggy`` and ``correct`` by default). Clicking a
token chip (or moving the ``query token`` slider from the keyboard) selects it as the *query* in
every panel; each panel then shades every key token by
the attention weight the query gives it (layer and head selectable, or averaged) and prints the
share of that attention landing outside the query's own example. Keys of another example that
get any weight are underlined in vermillion with their weight: under ``buggy`` every example after the
first in a row reads its neighbours; under ``correct`` the share is exactly 0.

Attention comes from :func:`packsim.core.model.attention_maps` (``(L, B, H, T, T)``) under each
panel's setup, computed once when the widget is built (packs here are short: 48-96 tokens); the
numbers it shows are computed in :mod:`packsim.viz.leakage_data`, and its static figure is
:mod:`packsim.viz.leakage_heatmap`. Its HTML is in the ``leakage_*`` files of
``packsim/viz/frontend/`` (:mod:`packsim.viz.assets`).

Lessons: 02, 06.
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go
import torch

from packsim.core.batch import PackedBatch
from packsim.core.errors import PacksimError
from packsim.core.loss import Role
from packsim.core.segments import run_starts
from packsim.core.setups import get_setup
from packsim.viz.assets import template
from packsim.viz.leakage_data import (
    MEAN,
    key_weights,
    panel_models,
    query_share,
    setup_maps,
)
from packsim.viz.leakage_heatmap import attention_heatmaps
from packsim.viz.style import chip_text, example_colour
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

__all__ = ["LeakageExplorer", "leakage_explorer"]

_MASK_TEXT = {
    "causal": "causal mask over the whole pack: each example also sees the ones before it",
    "block_diagonal": "block-diagonal mask: each example sees only itself",
}


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
    key = template("leakage_key.html").substitute
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
                sup = template("leakage_weight.html").substitute(weight=f"{w[k]:.1%}")
        where = example_name(ex, seq_row)
        title = f"key {k} {glyphs[k]!r} ({where})" + ("" if query is None else f": {w[k]:.2%}")
        spans.append(key(classes=" ".join(cls), alpha=f"{0.75 * w[k] / w_max:.3f}",
                         colour=example_colour(ex), title=escape(title),
                         glyph=escape(glyphs[k]), weight=sup))  # fmt: skip
    if query is None:
        caption = template("leakage_caption_none.html").template
    else:
        caption = template("leakage_caption.html").template
    return template("leakage_attention.html").substitute(caption=caption, keys="".join(spans))


def share_html(share: float | None, query: int | None, desc: str) -> str:
    """The outside-share line, e.g. ``outside its example: 37.2%``; 0.0% only when exactly 0."""
    if query is None:
        return template("leakage_share_none.html").template
    note = " (padding: its output is never used)" if "(padding)" in desc else ""
    verdict_class = "packsim-bad" if share > 0 else "packsim-ok"  # theme colours (widget.css)
    mark = "&#10007; leak" if share > 0 else "&#10003; isolated"  # the verdict in words too
    text = "&lt;0.05%" if 0 < share < 0.0005 else f"{share:.1%}"  # a leak never reads as 0.0%
    return template("leakage_share.html").substitute(
        verdict_class=verdict_class, share=text, verdict=mark, query=escape(desc), note=note
    )


class _Panel:
    """One setup's view: title, token chips, attention view, outside share."""

    def __init__(self, name: str, explorer: LeakageExplorer):
        self.name = name
        self.explorer = explorer
        setup = get_setup(name)
        title = template("leakage_title.html")
        self.title = widgets.HTML(title.substitute(setup=escape(name), mask=_MASK_TEXT[setup.mask]))
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
            chip.style.text_color = chip_text(example_colour(e))  # set with the fill: any theme
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
        share = None if q is None else query_share(w, seq, q)
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
        self.maps = setup_maps(models, batch)
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
        # The keyboard way to pick the query (Tab to it, then the arrow keys): same as a click.
        self.query_slider = widgets.IntSlider(
            value=0, min=0, max=batch.shape[1] - 1, description="query token",
            continuous_update=True, layout=widgets.Layout(width="360px"),
        )  # fmt: skip
        self.query_slider.add_class("packsim-query-slider")
        self._syncing = False
        self.query_slider.observe(self._slider_moved, names="value")
        self.layer.observe(lambda _c: self._render_all(self.query), names="value")
        self.head.observe(lambda _c: self._render_all(self.query), names="value")
        self.row_picker.observe(lambda c: self.set_row(c["new"]), names="value")
        self.header = widgets.HTML()
        self.panels = {name: _Panel(name, self) for name in models}
        self.widget = widgets.VBox(
            [
                style_html(),
                self.header,
                widgets.HBox([self.row_picker, self.layer, self.head, self.query_slider]),
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
        return query_share(self.weights(setup, q), self.batch.seq_ids[self.row], q)

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
        if query is not None and self.query_slider.value != query:
            self._syncing = True
            try:
                self.query_slider.value = query
            finally:
                self._syncing = False
        self._render_all(previous)

    def _slider_moved(self, change) -> None:
        if not self._syncing:
            self.select(int(change["new"]))

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
        self.header.value = template("leakage_header.html").substitute(
            row=row, tokens=int((seq >= 0).sum()), examples=n_ex, padding=int((seq < 0).sum()),
            models=model_text,
        )
        for panel in self.panels.values():
            panel.build_chips()
        self._render_all(None)

    def _render_all(self, previous: int | None) -> None:
        for panel in self.panels.values():
            panel.render(previous)

    def figure(self) -> go.Figure:
        """Static version of the current view (see :func:`~packsim.viz.leakage_heatmap.leakage_figure`)."""
        return attention_heatmaps(
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
    return LeakageExplorer(batch, panel_models(models, batch, seed, setups), row=row)
