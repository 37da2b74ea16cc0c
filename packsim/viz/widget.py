"""The widget plumbing: the base class, figures into ``Output`` widgets, the CSS, batch inputs.

Every widget in :mod:`packsim.viz` is an ipywidgets composition deriving :class:`PacksimWidget`
(``.widget`` is its root box; a bare widget as a cell's last expression displays it). Plotly
figures are shown in an ``ipywidgets.Output`` as a plotly mime bundle
(``application/vnd.plotly.v1+json``, carrying :data:`~packsim.viz.style.FIGURE_CONFIG`), which
JupyterLab (the ``jupyterlab-plotly`` extension ships with plotly), VS Code and nteract render.
The bundle is set on ``Output.outputs`` directly (:func:`show_figure`), so a redraw is one widget
message and works the same with or without a running kernel (the tests read it back with
:func:`shown_figure`).

Inputs shared by the widgets: :func:`as_batch` (examples or a PackedBatch), :func:`check_row`,
:func:`row_dropdown`, :func:`token_glyphs` (display text of token ids) and :func:`example_name`
(how an example is named: its index in the batch and its place in the row). The shared CSS
(:func:`style_html`) is ``packsim/viz/frontend/widget.css`` and its ARIA script ``aria.js``
(:mod:`packsim.viz.assets`).

Lessons: none directly.
"""

from __future__ import annotations

import html
import os
import sys

import ipywidgets as widgets
import plotly.graph_objects as go
import plotly.io as pio

from packsim.core.batch import PackedBatch
from packsim.core.errors import PacksimError
from packsim.viz.assets import template
from packsim.viz.style import (
    BAD_TEXT,
    BORDER,
    LEAK_RED,
    MARK_FILL,
    NO_LEAK,
    OK_TEXT,
    TEXT,
    TEXT_MUTED,
    figure_config,
)

__all__ = [
    "PacksimWidget",
    "close_tree",
    "figure_bundle",
    "show_figure",
    "shown_figure",
    "style_html",
    "escape",
    "as_batch",
    "check_row",
    "row_dropdown",
    "token_glyphs",
    "example_name",
]

_GLYPHS = {"<pad>": "·pad", " ": "␣"}
_PLOTLY_MIME = "application/vnd.plotly.v1+json"

# ----------------------------------------------------------------------------- figures


def figure_bundle(fig: go.Figure) -> dict:
    """The mime bundle ``fig.show()`` sends with the ``plotly_mimetype`` renderer, plus text.

    The plotly JSON carries :data:`~packsim.viz.style.FIGURE_CONFIG` (no logo, no cloud button).
    Colab has no renderer for the plotly mime type: there (only) an HTML version is added that
    loads plotly.js from its CDN, as plotly's own ``colab`` renderer does. In a static HTML
    build (``PACKSIM_STATIC=1``, :mod:`packsim.course.tools.static_site`) an HTML version without
    plotly.js is added, which the page's widget manager draws with the plotly.js the page embeds.
    """
    bundle = pio.renderers["plotly_mimetype"].to_mimebundle(fig.to_dict())
    bundle[_PLOTLY_MIME]["config"] = {**bundle[_PLOTLY_MIME].get("config", {}), **figure_config()}
    title = fig.layout.title.text or "plotly figure"
    bundle["text/plain"] = f"<plotly figure: {title}>"
    if "google.colab" in sys.modules:
        bundle["text/html"] = fig.to_html(
            include_plotlyjs="cdn", full_html=False, config=figure_config()
        )
    elif os.environ.get("PACKSIM_STATIC") == "1":  # static build: the page already has plotly.js
        bundle["text/html"] = fig.to_html(
            include_plotlyjs=False, full_html=False, config=figure_config()
        )
    return bundle


def show_figure(out: widgets.Output, fig: go.Figure) -> None:
    """Replace what ``out`` shows by ``fig`` (one widget message; no kernel needed)."""
    out.outputs = ({"output_type": "display_data", "data": figure_bundle(fig), "metadata": {}},)


def shown_figure(out: widgets.Output) -> dict | None:
    """The plotly figure dict (``data``, ``layout``, ``config``) ``out`` shows, or None (tests)."""
    for o in out.outputs:
        fig = o.get("data", {}).get(_PLOTLY_MIME)
        if fig is not None:
            return fig
    return None


# ----------------------------------------------------------------------------- widgets

# The shared CSS: frontend/widget.css, filled with packsim.viz.style's colours. Every colour there
# follows JupyterLab's theme (its CSS variables, or the light / dark pair it picks from
# body[data-jp-theme-light]) or is translucent, so the widgets read under the light and the dark
# theme alike; leaks are Okabe-Ito vermillion and always carry a second cue (underline, outline,
# a "marked" word's dashed outline). Beside it, frontend/aria.js, run by the front end when the
# style widget is drawn (an image that fails to load: ipywidgets' HTML view sets innerHTML, which
# runs no <script>): it sets what ipywidgets does not, aria-pressed on quiz words and toggle
# buttons and aria-label on slider handles, from the widget's classes, and keeps them in step.
_CSS = template("widget_style.html").substitute(
    css=template("widget.css").substitute(
        border=BORDER, no_leak=NO_LEAK, leak_red=LEAK_RED, mark_fill=MARK_FILL, text=TEXT,
        text_muted=TEXT_MUTED, ok_light=OK_TEXT["light"], ok_dark=OK_TEXT["dark"],
        bad_light=BAD_TEXT["light"], bad_dark=BAD_TEXT["dark"],
    ),
    aria=html.escape(template("aria.js").template, quote=True),
)


def style_html() -> widgets.HTML:
    """An HTML widget holding the shared CSS (selected chip, boundaries, leak underline, verdict
    colours) and the ARIA script (aria-pressed, slider labels)."""
    return widgets.HTML(_CSS, layout=widgets.Layout(height="0px", margin="0"))


def escape(text: str) -> str:
    return html.escape(str(text), quote=True)


class PacksimWidget:
    """Base of every widget: ``.widget`` is the root ipywidgets box; a bare call displays it."""

    widget: widgets.Box

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    def close(self) -> None:
        """Close every ipywidget of this widget (frees the kernel-side comms)."""
        close_tree(self.widget)


def close_tree(w: widgets.Widget) -> None:
    """Close ``w`` and, for boxes, every widget inside it."""
    for child in getattr(w, "children", ()):
        close_tree(child)
    w.close()


# ----------------------------------------------------------------------------- inputs


def as_batch(
    examples_or_batch, capacity: int = 64, setup: str = "correct", strategy: str = "bfd"
) -> PackedBatch:
    """A packed batch from a PackedBatch (returned as is) or a list of examples (packed here)."""
    if isinstance(examples_or_batch, PackedBatch):
        if not examples_or_batch.setup.packed:
            raise PacksimError(
                "this batch has one example per row (setup 'padded'): the widgets show packs. "
                "Build it with PackedBatch.from_examples(examples, capacity, setup='correct')."
            )
        return examples_or_batch
    if examples_or_batch is None or isinstance(examples_or_batch, (str, bytes)):
        raise PacksimError(
            f"expected a list of examples or a PackedBatch, got {examples_or_batch!r}: "
            "pass e.g. packsim.core.data.make_examples(6, seed=0)."
        )
    return PackedBatch.from_examples(
        list(examples_or_batch), capacity, setup=setup, strategy=strategy
    )


def check_row(batch: PackedBatch, row: int) -> int:
    """``row`` as an int in ``[0, B)``, or a PacksimError naming the valid range."""
    B = batch.shape[0]
    if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row < B:
        raise PacksimError(f"row={row!r} is not a row of this batch: pick 0..{B - 1}.")
    return row


def row_dropdown(batch, row: int) -> widgets.Dropdown:
    """Dropdown over the rows of a batch (disabled when there is only one)."""
    B = batch.shape[0]
    return widgets.Dropdown(options=list(range(B)), value=check_row(batch, row), description="row",
                            disabled=B == 1, layout=widgets.Layout(width="160px"))  # fmt: skip


def token_glyphs(ids) -> list[str]:
    """Short display text per token id: characters as is, ``<bos>``, ``<eos>``, ``·pad``, ``␣``.

    ``ids``: a list of ints or a 1-D tensor (T,). Ids outside packsim's vocabulary show as ``#id``.
    """
    from packsim.core.tokenizer import build_tokenizer

    ids = [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
    toks = build_tokenizer().convert_ids_to_tokens(ids)
    return [f"#{i}" if t is None else _GLYPHS.get(t, t) for i, t in zip(ids, toks, strict=True)]


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def example_name(example: int, seq_row) -> str:
    """How the widgets name an example: ``"example 3 of the batch (2nd in this row)"``.

    ``example`` is a ``seq_ids`` value: the example's index in the batch (``-1``: padding);
    ``seq_row`` (T,) the ``seq_ids`` of its row, which gives its place in the row.
    """
    if example < 0:
        return "padding"
    in_row = list(dict.fromkeys(int(e) for e in seq_row.tolist() if e >= 0))
    place = f" ({_ordinal(in_row.index(example) + 1)} in this row)" if example in in_row else ""
    return f"example {example} of the batch{place}"
