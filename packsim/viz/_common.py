"""Shared pieces of the widgets: colours, token glyphs, figure display, the widget base class.

Every widget in :mod:`packsim.viz` is an ipywidgets composition; plotly figures are shown in an
``ipywidgets.Output`` as a plotly mime bundle (``application/vnd.plotly.v1+json``), which
JupyterLab (the ``jupyterlab-plotly`` extension ships with plotly), VS Code and nteract render.
The bundle is set on ``Output.outputs`` directly, so a redraw is one widget message and works
the same with or without a running kernel (the Python tests read it back).
"""

from __future__ import annotations

import html
import os
import sys
import zlib
from collections.abc import Sequence

import ipywidgets as widgets
import plotly.graph_objects as go
import plotly.io as pio

from packsim.core.batch import PackedBatch
from packsim.core.errors import PacksimError

__all__ = [
    "EXAMPLE_COLOURS",
    "SETUP_COLOURS",
    "example_colour",
    "setup_colour",
    "token_glyphs",
    "as_batch",
    "check_row",
    "show_figure",
    "shown_figure",
    "style_html",
    "PacksimWidget",
]

# Light colours for examples (text stays readable on them); padding is grey.
EXAMPLE_COLOURS = (
    "#8dd3c7", "#ffffb3", "#bebada", "#fdb462", "#80b1d3", "#b3de69",
    "#fccde5", "#ccebc5", "#ffed6f", "#bc80bd", "#a6cee3", "#fb8072",
)  # fmt: skip
PAD_COLOUR = "#f0f0f0"
SETUP_COLOURS = {
    "buggy": "#d62728",
    "correct": "#2ca02c",
    "padded": "#7f7f7f",
    "mask_fix": "#1f77b4",
    "loss_fix": "#ff7f0e",
    "positions_only": "#9467bd",
}
_OTHER_SETUP_COLOURS = ("#8c564b", "#e377c2", "#17becf", "#bcbd22", "#393b79", "#637939")
LEAK_RED = "#d62728"

_GLYPHS = {"<pad>": "·pad", " ": "␣"}


def example_colour(example: int) -> str:
    """Chip colour of an example index (``-1`` = padding, grey)."""
    return PAD_COLOUR if example < 0 else EXAMPLE_COLOURS[example % len(EXAMPLE_COLOURS)]


def setup_colour(name: str, order: Sequence[str] = ()) -> str:
    """Line colour of a setup: fixed for the presets, else by position in ``order``."""
    if name in SETUP_COLOURS:
        return SETUP_COLOURS[name]
    i = list(order).index(name) if name in order else zlib.crc32(name.encode())
    return _OTHER_SETUP_COLOURS[i % len(_OTHER_SETUP_COLOURS)]


def token_glyphs(ids) -> list[str]:
    """Short display text per token id: characters as is, ``<bos>``, ``<eos>``, ``·pad``, ``␣``.

    ``ids``: a list of ints or a 1-D tensor (T,). Ids outside packsim's vocabulary show as ``#id``.
    """
    from packsim.core.tokenizer import build_tokenizer

    ids = [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
    toks = build_tokenizer().convert_ids_to_tokens(ids)
    return [f"#{i}" if t is None else _GLYPHS.get(t, t) for i, t in zip(ids, toks, strict=True)]


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


def figure_bundle(fig: go.Figure) -> dict:
    """The mime bundle ``fig.show()`` sends with the ``plotly_mimetype`` renderer, plus text.

    Colab has no renderer for the plotly mime type: there (only) an HTML version is added that
    loads plotly.js from its CDN, as plotly's own ``colab`` renderer does. In a static HTML
    build (``PACKSIM_STATIC=1``, :mod:`packsim.course.static_site`) an HTML version without plotly.js is
    added, which the page's widget manager draws with the plotly.js the page embeds.
    """
    bundle = pio.renderers["plotly_mimetype"].to_mimebundle(fig.to_dict())
    title = fig.layout.title.text or "plotly figure"
    bundle["text/plain"] = f"<plotly figure: {title}>"
    if "google.colab" in sys.modules:
        bundle["text/html"] = fig.to_html(include_plotlyjs="cdn", full_html=False)
    elif os.environ.get("PACKSIM_STATIC") == "1":  # static build: the page already has plotly.js
        bundle["text/html"] = fig.to_html(include_plotlyjs=False, full_html=False)
    return bundle


def show_figure(out: widgets.Output, fig: go.Figure) -> None:
    """Replace what ``out`` shows by ``fig`` (one widget message; no kernel needed)."""
    out.outputs = ({"output_type": "display_data", "data": figure_bundle(fig), "metadata": {}},)


def shown_figure(out: widgets.Output) -> dict | None:
    """The plotly figure dict (``data``, ``layout``) ``out`` shows, or None (for tests)."""
    for o in out.outputs:
        fig = o.get("data", {}).get("application/vnd.plotly.v1+json")
        if fig is not None:
            return fig
    return None


_CSS = f"""<style>
.packsim-token.packsim-selected {{ outline: 3px solid #222; outline-offset: -1px;
  font-weight: bold; }}
.packsim-ex-start {{ border-left: 3px solid #444 !important; }}
.packsim-token.packsim-pad {{ color: #999; }}
.packsim-quiz-word.packsim-marked {{ outline: 2px solid {LEAK_RED};
  background: #ffe08a !important; }}
.packsim-quiz-word.packsim-hit {{ background: #b7e4b7 !important; }}
.packsim-quiz-word.packsim-miss {{ background: #ffd8a8 !important; }}
.packsim-quiz-word.packsim-wrong {{ background: #f5b7b1 !important; }}
.packsim-key, .packsim-label-token {{ display: inline-block; min-width: 1.1em; padding: 1px 2px;
  margin: 1px 0;  font-family: monospace; text-align: center; border-top: 4px solid transparent; }}
.packsim-key.packsim-key-query {{ outline: 2px solid #222; }}
.packsim-key.packsim-key-future {{ opacity: 0.35; }}
.packsim-key.packsim-key-outside {{ border-bottom: 3px solid {LEAK_RED}; color: {LEAK_RED}; }}
.packsim-table {{ border-collapse: collapse; margin-top: 4px; }}
.packsim-table td, .packsim-table th {{ padding: 1px 10px; text-align: right; }}
.packsim-table td:first-child, .packsim-table th:first-child {{ text-align: left; }}
.packsim-key sup {{ font-size: 0.6em; color: {LEAK_RED}; }}
</style>"""


def style_html() -> widgets.HTML:
    """An HTML widget holding the shared CSS (selected chip, boundaries, leak underline)."""
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


# Heatmap colours of a (query block, key block) grid: skipped | partial | full (mask and tile views).
TILE_SCALE = [
    [0, "#f4f4f4"],
    [0.33, "#f4f4f4"],
    [0.33, "#9ecae1"],
    [0.66, "#9ecae1"],
    [0.66, "#08519c"],
    [1, "#08519c"],
]


def tile_colorbar(length: float, x: float, y: float) -> dict:
    """Horizontal colorbar labelling :data:`TILE_SCALE` (skipped / partial / full)."""
    return dict(tickvals=[0.33, 1, 1.67], ticktext=["skipped", "partial", "full"],
                orientation="h", len=length, thickness=12, x=x, y=y)


def row_dropdown(batch, row: int):
    """Dropdown over the rows of a batch (disabled when there is only one)."""
    import ipywidgets as widgets

    B = batch.shape[0]
    return widgets.Dropdown(options=list(range(B)), value=check_row(batch, row), description="row",
                            disabled=B == 1, layout=widgets.Layout(width="160px"))

