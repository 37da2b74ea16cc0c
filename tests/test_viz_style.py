"""The widgets' look is accessible (issues 23, 32): colour-blind-safe setups and examples,
theme-following HTML, verdict text that reads on both themes, the ARIA script.

Ground truth is computed here, independently of packsim.viz.style: sRGB -> linear RGB, the
deuteranopia simulation matrix of Machado, Oliveira & Fernandes (2009, severity 1.0), CIELAB
(D65) distances, and WCAG's relative luminance and contrast ratio. Each palette test includes
the case it must catch: the old red (#d62728) vs green (#2ca02c) setup pair collapses under the
simulation; the old Set3 example pastels had pairs (lavender #bebada vs light blue #a6cee3) that a
deuteranope barely tells apart, and they fail the same bar as the new palette passes.
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
        text = style.chip_text(colour)
        assert contrast(text, colour) >= 5, colour  # WCAG AA (4.5) with a margin
        other = style.CHIP_TEXT_ON_DARK if text == style.CHIP_TEXT else style.CHIP_TEXT
        assert contrast(text, colour) >= contrast(other, colour), colour  # the better of the two
    assert style.chip_text("#ffffff") == style.CHIP_TEXT and style.chip_text("#000000") == "#ffffff"


def _lab(srgb) -> tuple[float, float, float]:
    """CIELAB (D65) of an sRGB colour given as 0-1 floats."""
    r, g, b = (_linear(c) for c in srgb)
    xyz = (0.4124 * r + 0.3576 * g + 0.1805 * b, 0.2126 * r + 0.7152 * g + 0.0722 * b,
           0.0193 * r + 0.1192 * g + 0.9505 * b)  # fmt: skip
    f = [t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116
         for t in (xyz[0] / 0.95047, xyz[1] / 1.0, xyz[2] / 1.08883)]  # fmt: skip
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def example_gap(a: str, b: str) -> float:
    """CIELAB distance of two colours, the smaller of normal vision and deuteranopia."""
    normal = _distance(_lab(_rgb(a)), _lab(_rgb(b)))
    deut = _distance(_lab([c / 255 for c in deuteranopia(a)]), _lab([c / 255 for c in deuteranopia(b)]))
    return min(normal, deut)


MIN_EXAMPLE_GAP = 15  # CIELAB units: two chips side by side read as different examples


def test_example_colours_differ_in_hue_or_lightness_also_for_deuteranopes():
    colours = style.EXAMPLE_COLOURS
    assert len(set(colours)) == len(colours) >= 8 and style.PAD_COLOUR not in colours
    gaps = {(a, b): example_gap(a, b) for i, a in enumerate(colours) for b in colours[i + 1:]}
    worst = min(gaps, key=gaps.get)
    assert gaps[worst] >= MIN_EXAMPLE_GAP, (worst, gaps[worst])
    for c in colours:  # and none reads as padding
        assert example_gap(c, style.PAD_COLOUR) >= MIN_EXAMPLE_GAP, c
    # the case this must catch: two of the old Set3 pastels fail the same bar
    assert example_gap("#bebada", "#a6cee3") < MIN_EXAMPLE_GAP
    assert example_colour_cycle_ok()


def example_colour_cycle_ok() -> bool:
    """example_colour cycles through the palette; -1 is padding."""
    n = len(style.EXAMPLE_COLOURS)
    return (style.example_colour(-1) == style.PAD_COLOUR
            and [style.example_colour(i) for i in range(n + 2)] == [*style.EXAMPLE_COLOURS, *style.EXAMPLE_COLOURS[:2]])  # fmt: skip


def test_example_colorscale_gives_each_example_its_chip_colour():
    """A heatmap with z = example + 1 (0 padding), zmin -0.5, zmax n + 0.5: value v lands in the
    band of its own colour (plotly maps z to (z - zmin) / (zmax - zmin))."""
    n = 12
    scale = style.example_colorscale(n)
    for v in range(n + 1):
        at = (v + 0.5) / (n + 1)  # the middle of value v's band
        band = [c for (lo, c), (hi, c2) in zip(scale[::2], scale[1::2], strict=True) if lo <= at <= hi]
        assert band == [style.example_colour(v - 1)], v


def test_verdict_text_and_guide_lines_read_on_both_themes():
    """OK / BAD text (>= 4.5:1: bold under 18.66 px is not 'large' in WCAG) on the theme's page
    (light: white; dark: #111 and #212121); the guide line >= 3:1 (WCAG non-text) on the plot area
    (plotly's light #e5ecf6, the dark theme's #212121 from widget.css)."""
    for pair in (style.OK_TEXT, style.BAD_TEXT):
        assert contrast(pair["light"], WHITE) >= 4.5, pair
        assert contrast(pair["dark"], "#111111") >= 4.5 and contrast(pair["dark"], LAB_DARK) >= 4.5, pair
    for bg in ("#e5ecf6", LAB_DARK):
        assert contrast(style.GUIDE, bg) >= 3, bg
    assert contrast("#444444", LAB_DARK) < 3  # the old tolerance line, which vanished on dark
    assert contrast(style.NO_LEAK, LAB_DARK) < 4.5  # why the blue is not used for dark text


def test_sci_writes_numbers_as_plotly_e_axis_does():
    assert [style.sci(1e-5), style.sci(1e-2), style.sci(3.24e-7, 1), style.sci(0.5)] == [
        "1e-5", "1e-2", "3.2e-7", "5e-1"]


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


_PACKSIM_VARS = ("var(--packsim-ok)", "var(--packsim-bad)")  # set per theme: see below


def bad_declarations(html: str) -> list[str]:
    """Colour declarations that would not follow JupyterLab's theme: a background that is an
    opaque colour, or a text colour that is not a theme variable and reads on only one theme."""
    bad = []
    for prop, value in _DECL.findall(html):
        value = value.strip().removesuffix("!important").strip()
        if value.startswith("var(--jp-") or value in ("transparent", "inherit", "currentColor"):
            continue
        if value in _PACKSIM_VARS and prop.lower() == "color":
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


def test_packsim_colour_variables_are_set_per_theme_and_read():
    """--packsim-ok / --packsim-bad: light values on :root, dark ones under JupyterLab's dark
    theme (body[data-jp-theme-light="false"]); each reads on its theme's page."""
    light = re.search(r":root\s*{([^}]*)}", _CSS).group(1)
    dark = re.search(r'body\[data-jp-theme-light="false"\][^{]*{([^}]*)}', _CSS).group(1)
    for block, bgs in ((light, (WHITE,)), (dark, ("#111111", LAB_DARK))):
        values = dict(re.findall(r"(--packsim-\w+)\s*:\s*(#[0-9a-f]{6})", block, re.I))
        assert set(values) == {"--packsim-ok", "--packsim-bad"}, block
        for colour in values.values():
            assert all(contrast(colour, bg) >= 4.5 for bg in bgs), (colour, bgs)


def test_the_style_widget_carries_the_aria_script():
    """The script runs from an image's onerror (ipywidgets' HTML view runs no <script>); it
    sets aria-pressed from packsim-marked / mod-active and aria-label on slider handles. What
    it does in a browser: tests/browser/test_dark_theme.py."""
    import html as html_lib

    (handler,) = re.findall(r'<img src="data:," alt="" hidden onerror="([^"]*)">', _CSS)
    script = html_lib.unescape(handler)
    for needle in ("aria-pressed", "packsim-marked", "mod-active", "aria-label", "role=\"slider\"",
                   "MutationObserver"):
        assert needle in script, needle
    assert "<script" not in _CSS.lower()


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
