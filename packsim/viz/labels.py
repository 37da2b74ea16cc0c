"""Label viewer (notebook 05): which tokens of a pack the loss counts, per loss setup, and why.

For each setup (``buggy`` = loss on all tokens, ``correct`` = completion-only by default) the
tokens of one packed row are drawn as chips: green when the token is a counted target, grey when
ignored (label ``-100``). Hovering a chip gives the reason, from the token's
:class:`~packsim.core.loss.Role` (prompt, padding, boundary, response, EOS, first token of the row).
A token ``t`` is a target when ``labels[t] != -100`` and ``t > 0`` (the model predicts token
``t`` from position ``t - 1``; the first token of a row has nothing before it).

Lessons: 05.
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go

from packsim.core.data import make_examples
from packsim.core.loss import IGNORE_INDEX, Role
from packsim.core.segments import run_starts
from packsim.core.setups import get_setup
from packsim.viz.style import COUNTED_FILL, IGNORED_FILL, example_colour, layout
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

__all__ = ["LabelViewer", "label_viewer", "labels_figure", "label_reason", "counted_targets"]

# Heatmap cells of the static figure (plotly picks dark or light text per cell); the widget's
# HTML uses the translucent COUNTED_FILL / IGNORED_FILL instead, which read on either theme,
# and an ignored token is also struck through (not told by colour alone).
COUNTED, IGNORED = "#56b4e9", "#e0e0e0"

_REASONS = {
    (Role.PAD, True): "padding, counted: the model is trained to predict padding (loss='all')",
    (Role.PAD, False): "padding: ignored (-100), it is not data",
    (Role.FIRST, False): "first token of the row: nothing precedes it, so it is never a target",
    (Role.BOUNDARY, True): "boundary: the previous example's last token is trained to predict "
    "this example's <bos> (the boundary bug, loss='all')",
    (Role.BOUNDARY, False): "boundary: ignored, no example predicts the next one's first token",
    (Role.PROMPT, True): "prompt, counted: the model learns to write prompts (loss='all')",
    (Role.PROMPT, False): "prompt: ignored, completion-only loss trains on responses only",
    (Role.RESPONSE, True): "response: counted, this is what fine-tuning should learn",
    (Role.RESPONSE, False): "response: ignored (check your labels: the response should count)",
    (Role.EOS, True): "EOS: counted, so the model learns to stop",
    (Role.EOS, False): "EOS: ignored, the model never learns to stop (a common template trap)",
}


def counted_targets(labels_row) -> list[bool]:
    """Per token (T,): is it a counted target (label != -100 and not the first of the row)?"""
    labels = labels_row.tolist()
    return [k > 0 and lab != IGNORE_INDEX for k, lab in enumerate(labels)]


def label_reason(role: int, counted: bool) -> str:
    """Why a token with ``role`` is counted or ignored (hover text of the label viewer)."""
    return _REASONS[(Role(int(role)), bool(counted))]


def _row_html(glyphs, seq, roles, counted) -> str:
    spans = []
    starts = run_starts(seq).tolist()  # (T,): a new example (or padding run) begins here
    for k, g in enumerate(glyphs):
        ex = int(seq[k])
        start = starts[k]
        reason = label_reason(int(roles[k]), counted[k])
        where = example_name(ex, seq)
        style = (
            f"background:{COUNTED_FILL if counted[k] else IGNORED_FILL};"
            f"border-top-color:{example_colour(ex)};"
        )  # an ignored token is also struck through and muted (packsim-ignored, in widget.py)
        cls = "packsim-label-token" + (" packsim-ex-start" if start else "")
        cls += " packsim-counted" if counted[k] else " packsim-ignored"
        spans.append(
            f'<span class="{cls}" style="{style}" '
            f'title="{escape(f"token {k} {g!r} ({where}): {reason}")}">{escape(g)}</span>'
        )
    return f'<div style="line-height:2.1;font-size:13px">{"".join(spans)}</div>'


def _resolve(setups) -> dict:
    """``{name: Setup}`` of preset names or Setup objects, in the given order."""
    return {st.name: st for st in (get_setup(s) for s in setups)}


def _setup_html(batch, row: int, setup) -> str:
    b = batch.with_setup(setup)
    name = b.setup.name
    counted = counted_targets(b.labels[row])
    glyphs = token_glyphs(b.input_ids[row])
    n = sum(counted)
    resp = [int(r) in (Role.RESPONSE, Role.EOS) for r in b.roles[row]]
    n_resp = sum(r and c for r, c in zip(resp, counted, strict=True))
    return (
        f"<div style='margin-top:6px'><b>{escape(name)}</b> (loss = {escape(b.setup.loss)}): "
        f"{n} counted targets, {n_resp} of them response/EOS, {n - n_resp} other</div>"
        + _row_html(glyphs, b.seq_ids[row], b.roles[row], counted)
    )


_LEGEND = (
    f"<span class='packsim-label-token packsim-counted' style='background:{COUNTED_FILL};"
    "padding:0 4px'>counted</span> "
    f"<span class='packsim-label-token packsim-ignored' style='background:{IGNORED_FILL};"
    "padding:0 4px'>ignored (-100)</span> &nbsp;Hover a token for the reason; the coloured top edge marks its "
    "example, a thick left border the start of an example."
)


class LabelViewer(PacksimWidget):
    """Label viewer widget; build it with :func:`label_viewer`. Controls: ``row``, ``setups``."""

    def __init__(self, batch, setups=("buggy", "correct"), row: int = 0):
        self.batch = batch
        self._setups = _resolve(list(setups) + ["buggy", "loss_fix", "mask_fix", "correct"])
        names = list(_resolve(setups))
        options = list(self._setups)
        self.row = row_dropdown(batch, row)
        self.setups = widgets.SelectMultiple(
            options=options, value=tuple(names), description="setups", rows=min(4, len(options))
        )
        self.view = widgets.HTML()
        self.view.add_class("packsim-label-view")
        for w in (self.row, self.setups):
            w.observe(lambda _c: self.update(), names="value")
        self.widget = widgets.VBox(
            [style_html(), widgets.HBox([self.row, self.setups]), widgets.HTML(_LEGEND), self.view]
        )
        self.widget.add_class("packsim-labels")
        self.update()

    def update(self) -> None:
        """Redraw the rows for the selected setups."""
        if not self.setups.value:
            self.view.value = "<i>Select at least one setup.</i>"
            return
        self.view.value = "".join(
            _setup_html(self.batch, self.row.value, self._setups[s]) for s in self.setups.value
        )

    def figure(self) -> go.Figure:
        names = self.setups.value or ("buggy", "correct")
        return _figure(self.batch, self.row.value, [self._setups[s] for s in names])


def _figure(batch, row: int, setups) -> go.Figure:
    glyphs = token_glyphs(batch.input_ids[row])
    z, hover, names = [], [], []
    for setup in setups:
        b = batch.with_setup(setup)
        name = b.setup.name
        counted = counted_targets(b.labels[row])
        z.append([int(c) for c in counted])
        hover.append(
            [
                f"token {k} {g!r}: {label_reason(int(b.roles[row, k]), counted[k])}"
                for k, g in enumerate(glyphs)
            ]
        )
        names.append(f"{name} ({sum(counted)} counted)")
    fig = go.Figure(
        go.Heatmap(
            z=z,
            y=names,
            text=[glyphs] * len(z),
            texttemplate="%{text}",
            customdata=hover,
            hovertemplate="%{customdata}<extra></extra>",
            zmin=0,
            zmax=1,
            xgap=1,
            ygap=4,
            colorscale=[[0, IGNORED], [1, COUNTED]],
            showscale=False,
        )
    )
    fig.update_yaxes(autorange="reversed")
    return layout(
        fig,
        f"Which tokens of row {row} the loss counts (blue) or ignores (grey)",
        140 + 70 * len(z),
        xaxis_title="token",
    )


def _default_batch(examples_or_batch, capacity: int, seed: int):
    if examples_or_batch is None:
        examples_or_batch = make_examples(5, seed=seed)
    return as_batch(examples_or_batch, capacity)


def labels_figure(
    examples_or_batch=None,
    setups=("buggy", "correct"),
    capacity: int = 64,
    row: int = 0,
    seed: int = 0,
) -> go.Figure:
    """Static label figure (notebook 05): one strip per setup, counted vs ignored, reason on hover.

    ``examples_or_batch``: examples, a packed PackedBatch, or None for ``make_examples(5, seed)``.
    """
    batch = _default_batch(examples_or_batch, capacity, seed)
    return _figure(batch, check_row(batch, row), list(_resolve(setups).values()))


def label_viewer(
    examples_or_batch=None,
    setups=("buggy", "correct"),
    capacity: int = 64,
    row: int = 0,
    seed: int = 0,
) -> LabelViewer:
    """Label viewer widget (notebook 05): tokens coloured counted / ignored per loss setup.

    ``examples_or_batch``: examples, a packed PackedBatch, or None for ``make_examples(5, seed)``
    packed at ``capacity``. ``setups``: preset names (their loss switch decides the labels).
    """
    batch = _default_batch(examples_or_batch, capacity, seed)
    return LabelViewer(batch, setups=setups, row=row)
