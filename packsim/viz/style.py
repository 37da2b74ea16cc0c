"""How packsim's figures look: colours, the offline plotly config, and the shared layout helpers.

- Colours: :func:`example_colour` per example (grey padding; plotly's colour-blind-safe
  qualitative ``Safe`` palette, the one example palette: chips, bars, :func:`example_colorscale`
  for heatmaps) with :func:`chip_text` (dark or white text, whichever reads on the chip),
  :func:`setup_colour` with
  :func:`setup_dash` and :func:`setup_symbol` (an Okabe-Ito colour, dash and marker per setup:
  buggy vs correct never by colour alone), ``LEAK_RED`` / ``NO_LEAK``, the widgets' HTML colours
  (JupyterLab's CSS variables, so they read under its dark theme too; ``OK_TEXT`` / ``BAD_TEXT``:
  the verdict text colours per theme, CSS classes ``packsim-ok`` / ``packsim-bad``), ``GUIDE``
  (reference lines on a plot: >= 3:1 on the plot area of either theme) and ``TILE_SCALE`` with
  :func:`tile_colorbar` for tile maps (skipped / partial / full).
- Numbers: :func:`sci` writes a number as plotly's ``exponentformat="e"`` axis does (``1e-5``).
- ``FIGURE_CONFIG``: the plotly.js config of every figure, offline: no vendor logo, no button
  that uploads the figure to a cloud service. :func:`use_figure_config` puts it on every
  :mod:`plotly.io` renderer (each lesson calls it in its first cell; importing packsim changes
  nothing global); the widgets' mime bundles and the HTML report carry it too.
- :func:`layout` (title, height, margins, legend; titles wrapped at ``DESIGN_WIDTH`` so none
  collide) and :func:`add_boundaries` (example boundaries of a (T, T) map as one line trace).

Lessons: 01, 02, 03, 04, 05, 06, 07, 08, 10, A1, A2, A3, A4, A5, A6, A7.
"""

from __future__ import annotations

import re
import textwrap
import zlib
from collections.abc import Sequence
from types import MappingProxyType

import plotly.colors as plotly_colors
import plotly.graph_objects as go
import plotly.io as pio

__all__ = [
    "EXAMPLE_COLOURS",
    "PAD_COLOUR",
    "CHIP_TEXT_ON_DARK",
    "OK_TEXT",
    "BAD_TEXT",
    "GUIDE",
    "chip_text",
    "example_colorscale",
    "sci",
    "SETUP_COLOURS",
    "SETUP_DASHES",
    "SETUP_SYMBOLS",
    "OKABE_ITO",
    "LEAK_RED",
    "NO_LEAK",
    "CHIP_TEXT",
    "TEXT",
    "TEXT_MUTED",
    "BORDER",
    "COUNTED_FILL",
    "IGNORED_FILL",
    "MARK_FILL",
    "TILE_SCALE",
    "FIGURE_CONFIG",
    "figure_config",
    "DESIGN_WIDTH",
    "example_colour",
    "setup_colour",
    "setup_dash",
    "setup_symbol",
    "tile_colorbar",
    "use_figure_config",
    "layout",
    "add_boundaries",
    "text_lines",
]

# ----------------------------------------------------------------------------- colours

# One colour per example: plotly's qualitative "Safe" palette (Paul Tol's colour-blind-safe
# "muted" scheme, from CARTO), without its last colour, a grey that would read as padding. Its
# colours differ in hue and lightness, also under deuteranopia (tests/test_viz_style.py: every pair
# >= 15 CIELAB units apart, simulated; the pastel Set3 it replaces had pairs 3 apart, e.g. lavender
# and light blue). Text drawn on a chip is chip_text(colour): dark on the light colours, white on
# the dark ones, so a chip reads the same under JupyterLab's light and dark themes. Padding is grey.
EXAMPLE_COLOURS = tuple(
    "#{:02x}{:02x}{:02x}".format(*(int(v) for v in c[4:-1].split(",")))
    for c in plotly_colors.qualitative.Safe[:-1]
)  # fmt: skip
PAD_COLOUR = "#f0f0f0"
CHIP_TEXT = "#111111"  # dark text on a light chip (EXAMPLE_COLOURS / PAD_COLOUR)
CHIP_TEXT_ON_DARK = "#ffffff"  # ... and on a dark one; chip_text() picks (contrast >= 5:1 each)

# Okabe & Ito's colour-blind-safe palette (https://jfly.uni-koeln.de/color/): buggy vs correct is
# vermillion vs blue, which stay apart under red-green colour blindness (tests/test_viz_style.py
# simulates deuteranopia), and every setup also has its own dash and marker, so no line is told
# apart by colour alone.
OKABE_ITO = MappingProxyType({
    "orange": "#e69f00", "sky_blue": "#56b4e9", "bluish_green": "#009e73", "yellow": "#f0e442",
    "blue": "#0072b2", "vermillion": "#d55e00", "reddish_purple": "#cc79a7", "grey": "#999999",
})  # fmt: skip
SETUP_COLOURS = {
    "buggy": OKABE_ITO["vermillion"],
    "correct": OKABE_ITO["blue"],
    "padded": OKABE_ITO["grey"],
    "mask_fix": OKABE_ITO["sky_blue"],
    "loss_fix": OKABE_ITO["orange"],
    "positions_only": OKABE_ITO["reddish_purple"],
}
SETUP_DASHES = {"buggy": "dash", "correct": "solid", "padded": "dot", "mask_fix": "dashdot",
                "loss_fix": "longdash", "positions_only": "longdashdot"}  # fmt: skip
SETUP_SYMBOLS = {"buggy": "x", "correct": "circle", "padded": "square", "mask_fix": "diamond",
                 "loss_fix": "triangle-up", "positions_only": "star"}  # fmt: skip
_OTHER_SETUP_COLOURS = (OKABE_ITO["bluish_green"], OKABE_ITO["yellow"], "#8c564b", "#393b79")
_OTHER_DASHES = ("solid", "dot", "dash", "dashdot")
_OTHER_SYMBOLS = ("cross", "pentagon", "hexagon", "triangle-down")
LEAK_RED = OKABE_ITO["vermillion"]  # a leak (attention or weight on another example)
NO_LEAK = OKABE_ITO["blue"]  # isolated / correct
# Verdict text (isolated / leaks, found / missed) per theme {"light": on white, "dark": on
# JupyterLab dark's #111 / #212121}: Okabe-Ito blue and a darker vermillion on light (>= 5:1),
# sky blue and a lighter vermillion on dark (>= 6.9:1); widget.css sets them as --packsim-ok /
# --packsim-bad from the theme (body[data-jp-theme-light]), used through the classes
# packsim-ok / packsim-bad. (NO_LEAK itself is 3.1:1 on #212121: fine for a line, not for text.)
OK_TEXT = MappingProxyType({"light": OKABE_ITO["blue"], "dark": OKABE_ITO["sky_blue"]})
BAD_TEXT = MappingProxyType({"light": "#b34a00", "dark": "#ff8c52"})
# A reference line on a plot (tolerance, threshold): >= 3:1 (WCAG non-text) on plotly's light plot
# area (#e5ecf6) and on the dark theme's (widget.css: --jp-layout-color1, #212121).
GUIDE = "#7a7a7a"
# Text and backgrounds of widget HTML come from JupyterLab's theme (light or dark), with the
# light theme's value as the fallback outside JupyterLab.
TEXT = "var(--jp-ui-font-color1, rgba(0,0,0,0.87))"
TEXT_MUTED = "var(--jp-ui-font-color2, rgba(0,0,0,0.54))"
BORDER = "var(--jp-ui-font-color1, #222)"  # outlines that must stand out (selected token)
# Translucent fills read on either theme: the theme's background shows through.
COUNTED_FILL = "rgba(0,114,178,0.35)"  # Okabe-Ito blue
IGNORED_FILL = "rgba(128,128,128,0.15)"
MARK_FILL = "rgba(230,159,0,0.45)"  # a marked quiz word (Okabe-Ito orange)

# Heatmap colours of a (query block, key block) grid: skipped | partial | full (mask and tile views).
TILE_SCALE = [
    [0, "#f4f4f4"],
    [0.33, "#f4f4f4"],
    [0.33, "#9ecae1"],
    [0.66, "#9ecae1"],
    [0.66, "#08519c"],
    [1, "#08519c"],
]


def example_colour(example: int) -> str:
    """Chip colour of an example index (``-1`` = padding, grey)."""
    return PAD_COLOUR if example < 0 else EXAMPLE_COLOURS[example % len(EXAMPLE_COLOURS)]


def _luminance(hex_colour: str) -> float:
    """WCAG relative luminance of ``#rrggbb``."""
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
           for c in (int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5))]  # fmt: skip
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def chip_text(colour: str) -> str:
    """The text colour for a chip filled with ``colour`` (``#rrggbb``): of :data:`CHIP_TEXT`
    (dark) and :data:`CHIP_TEXT_ON_DARK` (white), the one with the higher WCAG contrast."""
    bg = _luminance(colour)
    dark, white = _luminance(CHIP_TEXT), _luminance(CHIP_TEXT_ON_DARK)
    return CHIP_TEXT if (bg + 0.05) / (dark + 0.05) >= (white + 0.05) / (bg + 0.05) else CHIP_TEXT_ON_DARK


def example_colorscale(n_examples: int) -> list:
    """A stepped plotly colorscale for a heatmap whose ``z`` is ``example + 1`` (``0``: padding):
    each integer 0..n_examples gets :func:`example_colour`; use with ``zmin=-0.5``,
    ``zmax=n_examples + 0.5``."""
    n = max(int(n_examples), 1) + 1  # values 0..n_examples
    scale = []
    for v in range(n):
        colour = example_colour(v - 1)
        scale += [[v / n, colour], [(v + 1) / n, colour]]
    return scale


def sci(x: float, digits: int = 0) -> str:
    """``x`` as plotly's ``exponentformat="e"`` axis writes it: ``1e-5``, ``3.2e-7`` (no zero
    padding of the exponent, unlike Python's ``1e-05``), so a label matches the axis beside it."""
    mantissa, exponent = f"{x:.{digits}e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _setup_style(name: str, order: Sequence[str], fixed: dict, other: tuple):
    if name in fixed:
        return fixed[name]
    i = list(order).index(name) if name in order else zlib.crc32(name.encode())
    return other[i % len(other)]


def setup_colour(name: str, order: Sequence[str] = ()) -> str:
    """Line colour of a setup: fixed for the presets, else by position in ``order``."""
    return _setup_style(name, order, SETUP_COLOURS, _OTHER_SETUP_COLOURS)


def setup_dash(name: str, order: Sequence[str] = ()) -> str:
    """Line dash of a setup (the second cue besides colour): ``buggy`` dashed, ``correct`` solid."""
    return _setup_style(name, order, SETUP_DASHES, _OTHER_DASHES)


def setup_symbol(name: str, order: Sequence[str] = ()) -> str:
    """Marker symbol of a setup (a third cue): ``buggy`` x, ``correct`` circle."""
    return _setup_style(name, order, SETUP_SYMBOLS, _OTHER_SYMBOLS)


def tile_colorbar(length: float, x: float) -> dict:
    """Horizontal colorbar labelling :data:`TILE_SCALE`, in the bottom margin (see :func:`layout`)."""
    return dict(tickvals=[0.33, 1, 1.67], ticktext=["skipped", "partial", "full"],
                orientation="h", len=length, thickness=12, x=x, xanchor="center",
                yref="container", y=0, yanchor="bottom", ypad=6)  # fmt: skip


# ----------------------------------------------------------------------------- plotly config

FIGURE_CONFIG = MappingProxyType({  # read-only: plotly's to_html adds keys to a config it is given
    "displaylogo": False,  # no vendor logo in the modebar
    "showSendToCloud": False,  # no "share chart" button (it opens a cloud upload dialog)
    "modeBarButtonsToRemove": ("sendChartToCloud",),  # ... even where a host turns it back on
})  # fmt: skip


def figure_config() -> dict:
    """A fresh copy of :data:`FIGURE_CONFIG` to hand to plotly (``to_html(config=...)``)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in FIGURE_CONFIG.items()}


def use_figure_config() -> None:
    """Put :data:`FIGURE_CONFIG` on every plotly.io renderer that takes a config (idempotent)."""
    for name in pio.renderers:
        renderer = pio.renderers[name]
        if hasattr(renderer, "config"):
            renderer.config = {**(renderer.config or {}), **figure_config()}


# ----------------------------------------------------------------------------- layout

DESIGN_WIDTH = 900  # px: the narrowest notebook output area the titles are wrapped for
MARGIN = dict(l=60, r=40)
TITLE_SIZE, SUBPLOT_TITLE_SIZE = 16, 13
LINE_HEIGHT = 1.3  # a text line is about 1.3 x its font size tall
CHAR_WIDTH = 0.55  # and a character about 0.55 x the font size wide on average (sans-serif)
_TITLE_PAD = 10  # px above the figure title
_GAP = 8  # px between the figure title and the subplot titles
_BELOW = {None: 50, "legend": 95, "colorbar": 105}  # bottom margin: axis title (+ legend/colorbar)


def text_lines(text: str | None) -> list[str]:
    """The lines of a plotly text (``<br>`` breaks), tags removed: what is drawn."""
    if not text:
        return []
    return [re.sub(r"<[^>]+>", "", line) for line in re.split(r"<br\s*/?>", text)]


def _is_subplot_title(a: dict) -> bool:
    """Is this annotation (a dict) one make_subplots added as a subplot title (above a panel)?"""
    return (a.get("xref"), a.get("yref"), a.get("yanchor")) == ("paper", "paper", "bottom") and (
        a.get("showarrow") is False
    )


def _column_width(lay: dict, x_centre: float) -> float:
    """Paper width of the x axis domain (layout dict) centred at ``x_centre`` (1.0: none)."""
    for name, axis in lay.items():
        if name.startswith("xaxis"):
            lo, hi = axis.get("domain", (0, 1))
            if abs((lo + hi) / 2 - x_centre) < 1e-6:
                return hi - lo
    return 1.0


def _wrap(text: str, chars: int) -> str:
    """``text`` with ``<br>`` breaks so that no drawn line is longer than ``chars`` characters.

    Lines that fit are kept as they are (with their tags); longer ones are split at spaces.
    """
    lines = []
    for line in re.split(r"<br\s*/?>", text):
        fits = len(re.sub(r"<[^>]+>", "", line)) <= chars
        lines += [line] if fits else (textwrap.wrap(line, max(chars, 8)) or [""])
    return "<br>".join(lines)


def layout(
    fig: go.Figure, title: str, height: int, below: str | None = None, **extra
) -> go.Figure:
    """Title, height, margins (and legend) of ``fig``; returns it. One call per figure builder.

    ``below``: what sits under the plot, in the bottom margin: None, ``"legend"`` (horizontal) or
    ``"colorbar"`` (place it with :func:`tile_colorbar`). Subplot titles are set in
    ``SUBPLOT_TITLE_SIZE`` and wrapped to fit their column at ``DESIGN_WIDTH``; the figure title
    is pinned to the top and the top margin holds both, so they never overlap. The legend's box
    is transparent (the page shows through, light or dark). ``extra`` goes to
    ``fig.update_layout`` (``barmode``, axis titles, ...).
    """
    plot_px = DESIGN_WIDTH - MARGIN["l"] - MARGIN["r"]
    lay = fig.layout.to_plotly_json()  # plain dicts: reading them is cheap, plotly objects are not
    sub_lines = 0
    for obj, ann in zip(fig.layout.annotations, lay.get("annotations", []), strict=True):
        if _is_subplot_title(ann):
            width = _column_width(lay, ann.get("x", 0.5)) * plot_px
            text = _wrap(ann.get("text", ""), int(width / (CHAR_WIDTH * SUBPLOT_TITLE_SIZE)))
            if text != ann.get("text"):
                obj.text = text
            obj.font.size = SUBPLOT_TITLE_SIZE  # (setting one property is cheap, replacing all is not)
            sub_lines = max(sub_lines, len(text_lines(text)))
    title = _wrap(title, int(DESIGN_WIDTH / (CHAR_WIDTH * TITLE_SIZE)))
    top = _TITLE_PAD + len(text_lines(title)) * LINE_HEIGHT * TITLE_SIZE + _GAP
    top += sub_lines * LINE_HEIGHT * SUBPLOT_TITLE_SIZE
    if below == "legend":
        extra.setdefault("legend", dict(orientation="h", yref="container", y=0, yanchor="bottom", x=0))
    if isinstance(extra.get("legend", {}), dict):  # no white legend box on a dark page
        extra["legend"] = {"bgcolor": "rgba(0,0,0,0)", **extra.get("legend", {})}
    fig.update_layout(
        title=dict(text=title, font=dict(size=TITLE_SIZE), yref="container", y=1,
                   yanchor="top", pad=dict(t=_TITLE_PAD)),
        height=height,
        margin=dict(**MARGIN, t=int(top + 6), b=_BELOW[below]),
        **extra,
    )  # fmt: skip
    return fig


def add_boundaries(
    fig: go.Figure, positions, lo: float, hi: float, row: int = 1, col: int = 1,
    colour: str = "#444", width: float = 1, dash: str | None = None,
) -> None:  # fmt: skip
    """Lines across a (T, T) map at each of ``positions``, from ``lo`` to ``hi``: one trace.

    A vertical and a horizontal line per position (e.g. each example start ``k - 0.5`` on a
    heatmap of tokens ``0..T-1``, or each ``cu_seqlens`` offset on a token axis); one Scatter
    trace per panel of a ``make_subplots`` figure, much faster to draw than a shape per line.
    """
    xs, ys = [], []
    for p in positions:
        xs += [p, p, None, lo, hi, None]
        ys += [lo, hi, None, p, p, None]
    if xs:
        fig.add_trace(
            go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=colour, width=width, dash=dash),
                       hoverinfo="skip", showlegend=False),
            row=row, col=col,
        )  # fmt: skip
