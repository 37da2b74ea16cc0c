"""The widgets' look is accessible (issue 23): colour-blind-safe setups, theme-following HTML.

Ground truth is computed here, independently of packsim.viz.style: sRGB -> linear RGB, the
deuteranopia simulation matrix of Machado, Oliveira & Fernandes (2009, severity 1.0), and WCAG's
relative luminance and contrast ratio. The palette test includes the case it must catch: the old
red (#d62728) vs green (#2ca02c) pair collapses under the simulation and fails the same bar.
"""

from __future__ import annotations

import re

import ipywidgets as widgets
import pytest

from packsim.viz import style
from packsim.viz.widget import _CSS

# Machado et al. 2009, deuteranomaly severity 1.0 (linear RGB in, linear RGB out).
DEUTERANOPIA = (
    (0.367322, 0.860646, -0.227968),
    (0.280085, 0.672501, 0.047413),
    (-0.011820, 0.042940, 0.968881),
)
WHITE, LAB_DARK = "#ffffff", "#212121"  # JupyterLab light / dark --jp-layout-color1
# --jp-ui-font-color1 of each theme (rgba(0,0,0,.87) / rgba(255,255,255,.87)) over that background
LIGHT_TEXT, DARK_TEXT = "#212121", "#e4e4e4"
MIN_DISTANCE = 60  # sRGB units (0-255) between simulated colours that must read as different


def _rgb(hex_colour: str) -> tuple[float, float, float]:
    h = hex_colour.lstrip("#")
    h = "".join(c * 2 for c in h) if len(h) == 3 else h
    return tuple(int(h[i : i + 2], 16) / 255 for i in (0, 2, 4))


def _linear(c: float) -> float:
    return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4


def _srgb(c: float) -> float:
    c = min(max(c, 0.0), 1.0)
    return 12.92 * c if c <= 0.0031308 else 1.055 * c ** (1 / 2.4) - 0.055


def deuteranopia(hex_colour: str) -> tuple[float, float, float]:
    """The colour a deuteranope sees, in sRGB 0-255."""
    lin = [_linear(c) for c in _rgb(hex_colour)]
    return tuple(255 * _srgb(sum(m * c for m, c in zip(row, lin, strict=True))) for row in DEUTERANOPIA)


def _distance(a, b) -> float:
    return sum((x - y) ** 2 for x, y in zip(a, b, strict=True)) ** 0.5


def luminance(hex_colour: str) -> float:
    r, g, b = (_linear(c) for c in _rgb(hex_colour))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_simulation_is_right_on_known_colours():
    """Grey stays grey; pure red and pure green land close together (what deuteranopes report)."""
    grey = deuteranopia("#808080")
    assert max(grey) - min(grey) < 2
    assert _distance(deuteranopia("#ff0000"), deuteranopia("#00ff00")) < _distance(
        (255, 0, 0), (0, 255, 0)
    ) / 3
    assert contrast("#000000", "#ffffff") == pytest.approx(21.0)


def test_buggy_vs_correct_stay_apart_under_deuteranopia():
    buggy, correct = style.SETUP_COLOURS["buggy"], style.SETUP_COLOURS["correct"]
    assert _distance(deuteranopia(buggy), deuteranopia(correct)) > MIN_DISTANCE
    # the case this must catch: the old red vs green pair fails the same bar
    assert _distance(deuteranopia("#d62728"), deuteranopia("#2ca02c")) < MIN_DISTANCE
    assert style.LEAK_RED == buggy and style.NO_LEAK == correct


def test_every_setup_has_its_own_colour_dash_and_marker():
    names = list(style.SETUP_COLOURS)
    assert len({style.setup_colour(n) for n in names}) == len(names)
    assert len({style.setup_dash(n) for n in names}) == len(names)  # not colour alone
    assert len({style.setup_symbol(n) for n in names}) == len(names)
    assert style.setup_dash("buggy") != style.setup_dash("correct")
    order = ["mine", "yours"]
    assert style.setup_dash("mine", order) != style.setup_dash("yours", order)


def test_line_colours_read_on_light_and_dark_backgrounds():
    """Leak / no-leak colours are used for bold text: >= 3:1 (WCAG large/bold) on both themes."""
    for colour in (style.LEAK_RED, style.NO_LEAK, style.SETUP_COLOURS["buggy"]):
        assert contrast(colour, WHITE) >= 3 and contrast(colour, LAB_DARK) >= 3, colour


def test_chip_text_reads_on_every_example_colour():
    for colour in (*style.EXAMPLE_COLOURS, style.PAD_COLOUR):
        assert contrast(style.CHIP_TEXT, colour) >= 4.5, colour  # WCAG AA


# ---- the widgets' HTML: no hard-coded light backgrounds or text colours -----------------------

_DECL = re.compile(r"(?<![-\w])(color|background(?:-color)?|fill)\s*:\s*([^;\"'}]+)", re.I)
_HEX = re.compile(r"#[0-9a-f]{6}\b|#[0-9a-f]{3}\b", re.I)
_RGBA = re.compile(r"rgba\(\s*\d+\s*,\s*\d+\s*,\s*\d+\s*,\s*([\d.]+)\s*\)")


def _over(rgba: str, background: str) -> str:
    *rgb, a = (float(x) for x in rgba[rgba.index("(") + 1 : -1].split(","))
    base = [255 * c for c in _rgb(background)]
    return "#" + "".join(f"{round(a * c + (1 - a) * b):02x}" for c, b in zip(rgb, base, strict=True))


def _fill_reads(rgba: str) -> bool:
    """Theme text on a translucent fill: >= 4.5:1 (WCAG AA) on the light and the dark theme."""
    return (contrast(LIGHT_TEXT, _over(rgba, WHITE)) >= 4.5
            and contrast(DARK_TEXT, _over(rgba, LAB_DARK)) >= 4.5)  # fmt: skip


def bad_declarations(html: str) -> list[str]:
    """Colour declarations that would not follow JupyterLab's theme: a background that is an
    opaque colour, or a text colour that is not a theme variable and reads on only one theme."""
    bad = []
    for prop, value in _DECL.findall(html):
        value = value.strip().removesuffix("!important").strip()
        if value.startswith("var(--jp-") or value in ("transparent", "inherit", "currentColor"):
            continue
        alpha = _RGBA.fullmatch(value)
        if prop.lower().startswith("background"):
            # only a translucent fill, and the theme's text must read on it over either theme
            if not (alpha and float(alpha.group(1)) < 1 and _fill_reads(value)):
                bad.append(f"{prop}: {value}")
        elif _HEX.fullmatch(value):
            if not (contrast(value, WHITE) >= 3 and contrast(value, LAB_DARK) >= 3):
                bad.append(f"{prop}: {value}")
        elif not value.startswith("{"):  # (a literal { only in the f-string of a test)
            bad.append(f"{prop}: {value}")
    return bad


def test_the_checker_catches_light_backgrounds_and_dark_text():
    assert bad_declarations("<span style='background:#ffe08a'>x</span>") == ["background: #ffe08a"]
    assert bad_declarations("<span style='color:#555'>x</span>") == ["color: #555"]
    assert bad_declarations("<span style='color:#d55e00;background:rgba(0,0,0,0.2)'>") == []
    assert bad_declarations("<b style='color: var(--jp-ui-font-color1)'>") == []
    assert bad_declarations("<i style='background: rgba(255,224,138,0.95)'>") != []  # ~opaque yellow


def test_shared_css_follows_the_theme():
    assert bad_declarations(_CSS) == []


def _html_and_buttons(w, html: list, buttons: list) -> None:
    if isinstance(w, widgets.HTML):
        html.append(w.value)
    if isinstance(w, widgets.Button):
        buttons.append(w)
    for child in getattr(w, "children", ()):
        _html_and_buttons(child, html, buttons)


def _controls(w, found: list) -> None:
    if isinstance(w, (widgets.ValueWidget, widgets.Button)) and not isinstance(w, widgets.HTML):
        found.append(w)
    for child in getattr(w, "children", ()):
        _controls(child, found)


@pytest.fixture(scope="module")
def shown_widgets():
    from packsim import viz
    from packsim.core.data import make_examples
    from packsim.experiment.results import StepRecord

    leak = viz.leakage_explorer(make_examples(6, seed=0))
    leak.select(leak.batch.shape[1] - 1)
    quiz = viz.quiz()
    quiz.toggle(0)
    quiz.grade()
    live = viz.curves()
    live.callback(StepRecord("train", "buggy", 0, 1, {"reported_loss": 1.0}))
    return {
        "leakage": leak,
        "labels": viz.label_viewer(),
        "masks": viz.mask_explorer(make_examples(6, seed=0)),
        "packing": viz.packing_playground(n=30),
        "tiles": viz.tile_map(),
        "quiz": quiz,
        "curves": live,
        "traps": viz.trap_explorer(),
    }


@pytest.mark.parametrize(
    "name", ["leakage", "labels", "masks", "packing", "tiles", "quiz", "curves", "traps"]
)
def test_widget_html_follows_the_theme_and_chips_pair_text_with_fill(shown_widgets, name):
    html, buttons = [], []
    _html_and_buttons(shown_widgets[name].widget, html, buttons)
    assert html
    for value in html:
        assert bad_declarations(value) == [], value[:300]
    for b in buttons:  # a coloured chip carries its own dark text; others keep the theme's
        if b.style.button_color:
            assert b.style.text_color and contrast(b.style.text_color, b.style.button_color) >= 4.5


@pytest.mark.parametrize(
    "name", ["leakage", "labels", "masks", "packing", "tiles", "quiz", "curves", "traps"]
)
def test_every_control_is_labelled(shown_widgets, name):
    """Each input has a visible label (``description``; a word chip's label is its text)."""
    found = []
    _controls(shown_widgets[name].widget, found)
    assert found
    for w in found:
        assert (w.description or "").strip() or getattr(w, "tooltip", None), w


def test_leakage_query_has_a_keyboard_control(shown_widgets):
    """The click-a-token view has a slider for the query token: moving it is the same as a click."""
    leak = shown_widgets["leakage"]
    slider = leak.query_slider
    assert slider.description == "query token" and slider.max == leak.batch.shape[1] - 1
    assert slider.value == leak.query  # a click moved the slider
    slider.value = 2
    assert leak.query == 2 and "packsim-selected" in leak.panels["buggy"].chips[2]._dom_classes
    assert "outside its example" in leak.panels["buggy"].share.value
