"""Every packsim widget under JupyterLab's dark theme, read, driven from the keyboard and
announced to screen readers (issues 23, 32).

A second JupyterLab (fixture ``dark_lab_server``) starts with ``JupyterLab Dark`` set in its
user settings and runs a notebook (built here, ``_DARK_CELLS``) showing the leakage explorer, the
quiz, the packing playground, the training curves (fed step records, no training), the tile
map, the trap explorer, the mask explorer, a check's verdict boxes and, outside any widget, every
figure a lesson shows on its own (``STANDALONE_FIGURES``: each builder whose call ends a lesson
cell, and lesson 01's plain plotly histogram, from tiny made-up inputs; no widget CSS around them,
so they keep plotly's template paper). For every visible piece of HTML text in a widget
the test computes, from the browser's computed styles, the text colour and the background it
sits on (ancestors' backgrounds composited, the element's opacity applied) and checks WCAG's
contrast ratio (4.5:1; 3:1 for large text: 24 px, or bold from 18.66 px; disabled controls are
exempt, as WCAG says). For every text of each plotly figure (ticks, axis titles of every subplot,
titles, legend, colorbar, annotations) it does the same with the SVG fill over what lies under
the text: the figure's paper over the page, a plot area or the legend box; no legend box is
opaque (layout() makes it transparent: it was white on the dark page). Then the keyboard: Tab
to the leakage explorer's query slider, arrow keys move the query; Tab to quiz words, Enter /
Space mark them, Enter on Submit grades. Screen readers: quiz words carry ``aria-pressed`` that
follows the marks, the query slider's handle an ``aria-label``, toggle buttons ``aria-pressed``.
The trap explorer's tolerance line stands out from its plot area (3:1), its picked options differ
from the others by more than a shade, and its log axis is in exponent format like the tolerance
label.
Screenshots: ``test-artifacts/browser/test_dark_*.png``; each check prints its lowest ratio.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.browser]

TIMEOUT_MS = 15_000
PERCENT = re.compile(r"(\d+(?:\.\d+)?)\s*%")

# WCAG 2 contrast in the browser: colour parsing, alpha compositing, relative luminance, the
# ratio, and the opaque background an element's text sits on (its ancestors' backgrounds composited).
_WCAG_JS = r"""
  const parse = c => { const m = (c || '').match(/rgba?\(([^)]*)\)/); if (!m) return [0, 0, 0, 0];
    const p = m[1].split(/[ ,\/]+/).filter(Boolean).map(Number); return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; };
  const over = (top, base) => [0, 1, 2].map(i => top[3] * top[i] + (1 - top[3]) * base[i]).concat([1]);
  const lin = c => { c /= 255; return c <= 0.04045 ? c / 12.92 : Math.pow((c + 0.055) / 1.055, 2.4); };
  const lum = c => 0.2126 * lin(c[0]) + 0.7152 * lin(c[1]) + 0.0722 * lin(c[2]);
  const ratio = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
  const background = el => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = parse(getComputedStyle(e).backgroundColor);
      if (c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
    }
    let bg = [255, 255, 255, 1];
    for (let i = layers.length - 1; i >= 0; i--) bg = over(layers[i], bg);
    return bg;
  };
"""

# Worst text contrast inside a root element: [ratio, needed, text, colour, background] rows.
_CONTRAST_JS = r"""root => {""" + _WCAG_JS + r"""
  const rows = [];
  const all = [root, ...root.querySelectorAll('*')];
  for (const el of all) {
    const own = [...el.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent).join('').trim();
    if (!own || !el.getClientRects().length) continue;
    if (el.closest('[disabled], .mod-disabled, :disabled')) continue;
    const st = getComputedStyle(el);
    if (st.visibility === 'hidden' || st.display === 'none') continue;
    let opacity = 1;
    for (let e = el; e; e = e.parentElement) opacity *= Number(getComputedStyle(e).opacity);
    const bg = background(el);
    const fg = parse(st.color);
    const text = over([fg[0], fg[1], fg[2], fg[3] * opacity], bg);
    const size = parseFloat(st.fontSize), bold = Number(st.fontWeight) >= 600;
    const needed = (size >= 24 || (bold && size >= 18.66)) ? 3 : 4.5;  // WCAG 'large text' or not
    rows.push([ratio(text, bg), needed, own.slice(0, 40), st.color, 'rgb(' + bg.slice(0, 3).map(Math.round) + ')']);
  }
  return rows;
}"""


# The cells of the dark-theme notebook: every widget whose look the theme can break, and every
# figure builder whose figure a lesson shows on its own (the cell ends with it; tiny made-up inputs).
DONE_MARKER = "packsim-e2e: all cells ran"  # what conftest's runner waits for
_CURVES = """from packsim.experiment.results import StepRecord
live = viz.curves()
for seed in (0, 1):  # made-up records: the figure's look is under test, not training
    for setup in ("buggy", "correct"):
        for step in range(1, 7):
            live.callback(StepRecord("train", setup, seed, step,
                                     {"reported_loss": 3 / step + seed + (setup == "buggy"),
                                      "response_loss": 2 / step}))
            if step % 3 == 0:
                live.callback(StepRecord("eval", setup, seed, step, {
                    "isolated_response_loss": 1 / step, "isolated_exact_match": step / 10}))
live.redraw()
live"""
_FEEDBACK = """from IPython.display import display
from packsim.course.exercises import Feedback
for fb in (Feedback(True, "your share 0.25 is the padding's", exercise="padding_share"),
           Feedback(False, "you returned 0.75, the share of real tokens", "one minus it", "padding_share"),
           Feedback(False, "not done yet", "write the function", "padding_share", attempted=False)):
    display(fb)  # a check's verdict box, outside any widget"""
_FIGURE_INPUTS = """import plotly.graph_objects as go
import torch
from types import SimpleNamespace
from packsim.core.data import long_tailed_lengths
from packsim.core.masks import block_diagonal_mask, causal_mask
from packsim.experiment.results import Results, RunResult, StepRecord
from packsim.viz import comparison_report as report
viz.use_figure_config()  # as each lesson's first cell
SEQ = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, -1, -1])  # (T,): three examples, then padding
runs = []  # made-up records (facts design): the figures' look is under test, not training
for setup in ("buggy", "correct"):
    for seed in (0, 1):
        run = RunResult(setup=setup, seed=seed, data="facts")
        for s in range(1, 7):
            run.add(StepRecord("train", setup, seed, s, {
                "reported_loss": 3 / s + seed, "response_loss": 2 / s + (setup == "buggy"),
                "response_loss_first": 2 / s, "response_loss_repeat": 2 / s - (setup == "buggy") / 2}))
            if s % 3 == 0:
                run.add(StepRecord("eval", setup, seed, s, {
                    "isolated_response_loss": 1 / s, "isolated_exact_match": s / 10}))
        runs.append(run)
results = Results(runs=runs, config={}, env={})
def train_output(losses, normalise, weight):  # what load_output returns, reduced to what is drawn
    return {"losses": {"response_loss": losses}, "run": SimpleNamespace(extra={"normalise": normalise}),
            "state": {"w": torch.tensor([weight])}}"""
# (builder, cell, a text the figure shows): every figure a lesson displays on its own, outside any
# widget (the builders' calls that end a cell in notebooks/*.ipynb): lesson 01's histogram (plain
# plotly, no builder), 02 allowed_pairs_figure and reported_loss_figure, 06 and A5
# report.curves_figure, A5 report.copies_figure, A2 outside_share_figure, 10 ranks_vs_one_figure and
# rank_loads_figure, A7 tile_figure (colorbar) and varlen_bench_figure.
STANDALONE_FIGURES = (
    ("lesson01_histogram", """lengths = long_tailed_lengths(2000, median=90, sigma=0.9, max_len=1024, seed=0)
fig = go.Figure(go.Histogram(x=lengths, nbinsx=80, marker_color="#1f77b4"))  # lesson 01's own figure
fig.update_layout(title="Example lengths: most are short, a few are long",
                  xaxis_title="tokens per example", yaxis_title="examples", height=300)
fig""", "Example lengths"),
    ("allowed_pairs_figure", """viz.allowed_pairs_figure({"causal (buggy)": causal_mask(len(SEQ)),
                          "block-diagonal (correct)": block_diagonal_mask(SEQ)}, SEQ)""", "Who may attend"),
    ("reported_loss_figure", "viz.reported_loss_figure(runs[0])", "Loss reported"),
    ("report.curves_figure", "report.curves_figure(results)", "Training side by side"),
    ("report.copies_figure", "report.copies_figure(results)", "repeated copy"),
    ("outside_share_figure", """shares = {"buggy, 20 steps": torch.linspace(0, 0.6, len(SEQ)),
          "buggy, fully trained": torch.linspace(0, 0.9, len(SEQ)), "uniform attention": torch.arange(len(SEQ)) / 10}
viz.outside_share_figure(shares, SEQ, reference="uniform attention")""", "outside its example"),
    ("ranks_vs_one_figure", """viz.ranks_vs_one_figure({"one": train_output([2.0, 1.5, 1.2], None, 0.0),
                         "2x2-global": train_output([2.0, 1.5, 1.2], "global", 1e-7),
                         "2x2-local": train_output([2.0, 1.7, 1.3], "local", 0.01),
                         "2x2-mean": train_output([2.0, 1.6, 1.25], "mean", 0.003)}, reference="one")""",
     "R ranks"),
    ("rank_loads_figure", """viz.rank_loads_figure({"each rank packs its share": [9, 3, 5, 7], "round_robin": [6, 7, 5, 6],
                        "attention": [6, 6, 6, 6]})""", "per rank"),
    ("tile_figure", "viz.tile_figure([300, 40, 500, 120, 64], tile=32)", "skipped"),
    ("varlen_bench_figure", """sizes = [256, 512, 1024]
bench = {(p, n): {"times": [n * (4e-6 if p == "dense" else 1e-6) * k for k in (1, 1.1, 0.9)],
                  "mem": n * (0.02 if p == "dense" else 0.004)} for p in ("dense", "blocked") for n in sizes}
viz.varlen_bench_figure(bench, sizes)""", "measured here"),
)

_DARK_CELLS = (
    "from packsim import viz\nfrom packsim.core.data import make_examples",
    "viz.leakage_explorer(make_examples(6, seed=0))  # untrained tiny model: only the mask differs",
    "viz.quiz(0)",
    "viz.packing_playground(n=40)  # a plotly figure inside a widget",
    _CURVES,
    "viz.tile_map()",
    "viz.trap_explorer()",
    "viz.mask_explorer()",
    _FEEDBACK,
    _FIGURE_INPUTS,
    *(cell for _, cell, _ in STANDALONE_FIGURES),
    f"print({DONE_MARKER!r})",
)
FIGURE_WIDGETS = ("packsim-playground", "packsim-curves", "packsim-tiles", "packsim-traps",
                  "packsim-mask-explorer")


def _browser_conftest(config):
    """tests/browser/conftest.py as loaded by pytest (its notebook runner, ``_open_and_run``)."""
    here = Path(__file__).with_name("conftest.py")
    for plugin in config.pluginmanager.get_plugins():
        if getattr(plugin, "__file__", None) and Path(plugin.__file__) == here:
            return plugin
    raise RuntimeError(f"{here} is not loaded as a pytest plugin")


@pytest.fixture(scope="module")
def dark_notebook_page(browser, dark_lab_server, request):
    """The widgets of ``_DARK_CELLS``, run in the dark-theme JupyterLab (overrides conftest's
    two-widget notebook of the same name)."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    lab = _browser_conftest(request.config)
    assert lab.DONE_MARKER == DONE_MARKER
    nb = new_notebook(cells=[new_code_cell(src) for src in _DARK_CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, dark_lab_server.root / "notebooks" / "dark_all_widgets.ipynb")
    # a second kernel next to the first server's, and a model build per widget: allow it time
    yield from lab._open_and_run(browser, dark_lab_server, "dark_all_widgets.ipynb", "dark",
                                 run_s=4 * lab.RUN_ALL_S)


# Worst contrast of the text of the plotly figures in a root element (or of the root, a figure):
# rows as _CONTRAST_JS. A text's background is the figure's paper (the first svg.main-svg's
# background: transparent in a widget, the template's white in a figure shown on its own) over the
# page under the figure, with, where the text's centre lies inside them, the plot areas
# (.bglayer .bg) and the legend box on top.
_SVG_CONTRAST_JS = r"""root => {""" + _WCAG_JS + r"""
  const fillOf = el => { const st = getComputedStyle(el); const c = parse(st.fill);
    c[3] *= Number(st.fillOpacity); return c; };
  const rows = [];
  const plots = root.matches('.js-plotly-plot') ? [root] : root.querySelectorAll('.js-plotly-plot');
  for (const plot of plots) {
    const base = background(plot.querySelector('svg.main-svg') || plot);
    const boxes = [...plot.querySelectorAll('.bglayer .bg, .legend .bg')].map(r => [r.getBoundingClientRect(), fillOf(r)]);
    for (const t of plot.querySelectorAll('text')) {
      const own = t.textContent.trim();
      if (!own || t.closest('.hoverlayer')) continue;
      const b = t.getBoundingClientRect();
      const st = getComputedStyle(t);
      if (!b.width || st.visibility === 'hidden' || st.display === 'none') continue;
      const cx = b.x + b.width / 2, cy = b.y + b.height / 2;
      let bg = base;
      for (const [r, c] of boxes) {
        if (cx >= r.left && cx <= r.right && cy >= r.top && cy <= r.bottom) bg = over(c, bg);
      }
      let opacity = 1;  // the text's fill-opacity (in fillOf) and every ancestor's opacity
      for (let e = t; e && e !== plot; e = e.parentElement) opacity *= Number(getComputedStyle(e).opacity);
      const fg = fillOf(t);
      const text = over([fg[0], fg[1], fg[2], fg[3] * opacity], bg);
      const size = parseFloat(st.fontSize), bold = Number(st.fontWeight) >= 600;
      const needed = (size >= 24 || (bold && size >= 18.66)) ? 3 : 4.5;
      rows.push([ratio(text, bg), needed, own.slice(0, 40), st.fill, 'rgb(' + bg.slice(0, 3).map(Math.round) + ')']);
    }
  }
  return rows;
}"""


def expect(locator):
    from playwright.sync_api import expect as _expect

    return _expect(locator)


def _check_contrast(root, what: str, script: str = _CONTRAST_JS) -> float:
    """Every text of ``root`` (HTML, or with ``_SVG_CONTRAST_JS`` its figures') reads; the lowest
    ratio, printed."""
    rows = root.evaluate(script)
    assert len(rows) >= 5, f"{what}: only {len(rows)} text elements found"
    bad = [r for r in rows if r[0] < r[1]]
    assert not bad, f"{what}: text below WCAG contrast under the dark theme: " + "; ".join(
        f"{t!r} {c} on {b}: {ratio:.2f} < {need}" for ratio, need, t, c, b in bad[:8])
    worst = min(rows, key=lambda r: r[0])
    print(f"contrast {what}: {len(rows)} texts, lowest {worst[0]:.2f} ({worst[2]!r} {worst[3]} on {worst[4]})")
    return worst[0]


def test_lab_runs_the_dark_theme(dark_notebook_page, request):
    page = dark_notebook_page.page
    assert page.evaluate("document.body.dataset.jpThemeLight") == "false"
    assert "Dark" in page.evaluate("document.body.dataset.jpThemeName")
    assert not dark_notebook_page.errors(), dark_notebook_page.errors()
    dark_notebook_page.screenshot(request.node.name, "page")


def test_leakage_explorer_reads_and_works_from_the_keyboard(dark_notebook_page, request):
    nb = dark_notebook_page
    page = nb.page
    root = page.locator(".packsim-leakage")
    expect(root).to_be_visible(timeout=TIMEOUT_MS)
    nb.screenshot(request.node.name, "before", root)
    _check_contrast(root, "leakage explorer before a query")

    share = root.locator(".packsim-panel-buggy .packsim-outside-share")
    expect(share).to_contain_text("click a token")
    # Keyboard only: focus the 'head' control, Tab moves on to the query slider's handle.
    root.locator("select").last.focus()
    page.keyboard.press("Tab")
    focused = page.evaluate("document.activeElement.closest('.packsim-query-slider') !== null")
    assert focused, "Tab from the head control did not reach the query token slider"
    # a screen reader names the handle it landed on (packsim/viz/frontend/aria.js)
    assert page.evaluate("document.activeElement.getAttribute('role')") == "slider"
    assert page.evaluate("document.activeElement.getAttribute('aria-label')") == "query token"
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    expect(share).to_have_text(PERCENT, timeout=TIMEOUT_MS)
    buggy = root.locator(".packsim-panel-buggy")
    # each key press round-trips through the kernel: wait for the third, not just any, selection
    expect(buggy.locator(".packsim-token").nth(3)).to_have_class(re.compile(r"\bpacksim-selected\b"),
                                                                timeout=TIMEOUT_MS)
    expect(buggy.locator(".packsim-token.packsim-selected")).to_have_count(1, timeout=TIMEOUT_MS)
    page.keyboard.press("End")  # the row's last token: a later example, so buggy leaks
    expect(share).not_to_contain_text("outside its example: 0.0%", timeout=TIMEOUT_MS)
    expect(buggy.locator(".packsim-key-outside").first).to_be_visible(timeout=TIMEOUT_MS)
    correct = root.locator(".packsim-panel-correct .packsim-outside-share")
    expect(correct).to_contain_text("outside its example: 0.0%", timeout=TIMEOUT_MS)
    nb.screenshot(request.node.name, "keyboard-query", root)
    _check_contrast(root, "leakage explorer with a query")


def test_quiz_reads_and_works_from_the_keyboard(dark_notebook_page, request):
    nb = dark_notebook_page
    page = nb.page
    quiz = page.locator(".packsim-quiz")
    expect(quiz).to_be_visible(timeout=TIMEOUT_MS)
    _check_contrast(quiz, "quiz before marking")
    words = quiz.locator(".packsim-quiz-word")
    n_words = words.count()
    pressed = words.evaluate_all("ws => ws.map(w => w.getAttribute('aria-pressed'))")
    assert pressed == ["false"] * n_words, pressed  # every word says it is a toggle, not pressed
    words.nth(0).focus()
    page.keyboard.press("Enter")  # mark the first word
    expect(words.nth(0)).to_have_class(re.compile(r"\bpacksim-marked\b"), timeout=TIMEOUT_MS)
    expect(words.nth(0)).to_have_attribute("aria-pressed", "true", timeout=TIMEOUT_MS)
    page.keyboard.press("Tab")
    page.keyboard.press("Space")  # and the next one
    expect(words.nth(1)).to_have_class(re.compile(r"\bpacksim-marked\b"), timeout=TIMEOUT_MS)
    expect(words.nth(1)).to_have_attribute("aria-pressed", "true", timeout=TIMEOUT_MS)
    assert "marked as wrong" in (words.nth(1).get_attribute("title") or "")
    page.keyboard.press("Enter")  # unmark it again
    expect(words.nth(1)).not_to_have_class(re.compile(r"\bpacksim-marked\b"), timeout=TIMEOUT_MS)
    expect(words.nth(1)).to_have_attribute("aria-pressed", "false", timeout=TIMEOUT_MS)
    quiz.locator(".packsim-quiz-submit").focus()
    page.keyboard.press("Enter")
    expect(quiz.locator(".packsim-quiz-result")).to_contain_text(re.compile(r"Score:\s*\d+\s*/\s*\d+"),
                                                                 timeout=TIMEOUT_MS)
    nb.screenshot(request.node.name, "graded", quiz)
    _check_contrast(quiz, "quiz after grading")


def test_plotly_figure_in_a_widget_follows_the_theme(dark_notebook_page, request):
    """The figure's paper is transparent and its axis text takes the theme's font colour, so
    the playground's figure reads on the dark page too (the CSS in packsim.viz.widget)."""
    nb = dark_notebook_page
    root = nb.page.locator(".packsim-playground")
    plot = root.locator(".js-plotly-plot svg.main-svg").first
    expect(plot).to_be_visible(timeout=TIMEOUT_MS)
    nb.screenshot(request.node.name, "figure", root)
    paper = plot.evaluate("s => getComputedStyle(s).backgroundColor")
    assert paper in ("rgba(0, 0, 0, 0)", "transparent"), paper
    fills = root.locator(".xtick text, .ytick text, text.gtitle").evaluate_all(
        "ts => ts.map(t => getComputedStyle(t).fill)")
    theme = nb.page.evaluate(
        "getComputedStyle(document.body).getPropertyValue('--jp-ui-font-color1').trim()")
    assert fills and theme, (fills, theme)
    probe = nb.page.evaluate(
        "c => { const d = document.createElement('div'); d.style.color = c; document.body.append(d);"
        " const v = getComputedStyle(d).color; d.remove(); return v; }", theme)
    assert set(fills) == {probe}, (set(fills), probe)
    _check_contrast(root.locator(".packsim-table").first, "playground table")


@pytest.mark.parametrize("widget", FIGURE_WIDGETS)
def test_figure_and_html_text_reads_under_the_dark_theme(dark_notebook_page, request, widget):
    """Every text of the widget's plotly figure (all subplots' ticks and axis titles, legend,
    colorbar, annotations) and of its HTML reads on what lies under it; no legend box is
    left opaque (it was white, its labels in the theme's light text)."""
    nb = dark_notebook_page
    root = nb.page.locator(f".{widget}").first
    plot = root.locator(".js-plotly-plot svg.main-svg").first
    expect(plot).to_be_visible(timeout=TIMEOUT_MS)
    root.scroll_into_view_if_needed()
    nb.screenshot(request.node.name, "figure", root)
    _check_contrast(root, f"{widget} figure", _SVG_CONTRAST_JS)
    legends = root.locator(".legend .bg").evaluate_all("rs => rs.map(r => getComputedStyle(r).fill)")
    assert all(f in ("rgba(0, 0, 0, 0)", "transparent", "none") for f in legends), legends
    if root.locator(".widget-html-content").count():
        rows = root.evaluate(_CONTRAST_JS)
        if len(rows) >= 5:  # the widget's own HTML (status, numbers, verdict)
            _check_contrast(root, f"{widget} HTML")


# A figure shown on its own: the output itself is the plot (plotly's mime renderer,
# .jp-RenderedPlotly), not inside a packsim widget.
STANDALONE_PLOT = '.jp-OutputArea-output.js-plotly-plot:not([class*="packsim-"] *)'
_PAPER_JS = r"""plot => {""" + _WCAG_JS + r"""
  const svg = plot.querySelector('svg.main-svg');
  return ['rgb(' + background(svg).slice(0, 3).map(Math.round) + ')',
          'rgb(' + background(plot).slice(0, 3).map(Math.round) + ')',
          lum(background(plot)) < 0.2];
}"""


@pytest.mark.parametrize("builder", [name for name, _, _ in STANDALONE_FIGURES])
def test_standalone_figure_reads_under_the_dark_theme(dark_notebook_page, request, builder):
    """A figure a lesson shows on its own (no widget CSS around it): every text (ticks and axis
    titles of every subplot, titles, legend, colorbar, annotations) reads on what lies under it,
    its paper included, and no legend box is an opaque box on the dark page."""
    nb = dark_notebook_page
    plots = nb.page.locator(STANDALONE_PLOT)
    expect(plots).to_have_count(len(STANDALONE_FIGURES), timeout=TIMEOUT_MS)  # in cell order
    index = [name for name, _, _ in STANDALONE_FIGURES].index(builder)
    plot = plots.nth(index)
    plot.scroll_into_view_if_needed()
    expect(plot.locator("svg.main-svg").first).to_be_visible(timeout=TIMEOUT_MS)
    shows = STANDALONE_FIGURES[index][2]
    texts = plot.locator("svg text").evaluate_all("ts => ts.map(t => t.textContent)")
    assert any(shows in t for t in texts), (builder, shows, texts[:12])  # the cell's figure
    nb.screenshot(request.node.name, "figure", plot)
    paper, page, dark = plot.evaluate(_PAPER_JS)
    assert dark, f"the page under {builder} is {page}: not the dark theme's"
    print(f"{builder}: paper {paper} on the page's {page}")
    _check_contrast(plot, f"{builder} standalone figure", _SVG_CONTRAST_JS)
    opaque = _drawn_legend_boxes(plot)
    assert not opaque, f"{builder}: a legend box is drawn ({opaque}), not transparent"


def _drawn_legend_boxes(plot) -> list:
    """The figure's legend boxes that are drawn: [fill, fill-opacity] of each (plotly draws
    layout()'s rgba(0,0,0,0) box as fill rgb(0, 0, 0) with fill-opacity 0)."""
    legends = plot.locator(".legend .bg").evaluate_all(
        "rs => rs.map(r => [getComputedStyle(r).fill, Number(getComputedStyle(r).fillOpacity)])")
    return [[fill, alpha] for fill, alpha in legends
            if alpha > 0 and fill not in ("rgba(0, 0, 0, 0)", "transparent", "none")]


def test_standalone_checks_catch_a_transparent_paper_and_a_white_legend(dark_notebook_page):
    """The cases the standalone figure checks are for: with its paper made transparent, a figure's
    template text (#2a3f5f) falls below 4.5:1 on the dark page; a legend box filled white is found.
    (The page is restored afterwards.)"""
    plots = dark_notebook_page.page.locator(STANDALONE_PLOT)
    plot = plots.nth([name for name, _, _ in STANDALONE_FIGURES].index("rank_loads_figure"))
    plot.scroll_into_view_if_needed()
    svg, legend = plot.locator("svg.main-svg").first, plot.locator(".legend .bg").first
    styles = [el.evaluate("e => e.getAttribute('style')") for el in (svg, legend)]  # plotly's own
    try:
        svg.evaluate("s => { s.style.background = 'transparent'; }")
        legend.evaluate("r => { r.style.fill = '#ffffff'; r.style.fillOpacity = '1'; }")
        rows = plot.evaluate(_SVG_CONTRAST_JS)
        bad = [r for r in rows if r[0] < r[1]]
        assert bad and all(r[4] == "rgb(17,17,17)" for r in bad), bad[:3]  # on the page
        assert _drawn_legend_boxes(plot) == [["rgb(255, 255, 255)", 1]]
    finally:
        for el, style in zip((svg, legend), styles, strict=True):
            el.evaluate("(e, st) => e.setAttribute('style', st)", style)
    assert not _drawn_legend_boxes(plot)
    assert all(r[0] >= r[1] for r in plot.evaluate(_SVG_CONTRAST_JS))


_LINE_VS_PLOT_JS = r"""root => {
  const parse = c => { const m = (c || '').match(/rgba?\(([^)]*)\)/); if (!m) return [0, 0, 0, 0];
    const p = m[1].split(/[ ,\/]+/).filter(Boolean).map(Number); return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; };
  const lin = c => { c /= 255; return c <= 0.04045 ? c / 12.92 : Math.pow((c + 0.055) / 1.055, 2.4); };
  const lum = c => 0.2126 * lin(c[0]) + 0.7152 * lin(c[1]) + 0.0722 * lin(c[2]);
  const ratio = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
  const line = root.querySelector('.shapelayer path');
  const area = root.querySelector('.bglayer .bg');
  const stroke = parse(getComputedStyle(line).stroke), fill = parse(getComputedStyle(area).fill);
  return [ratio(stroke, fill), getComputedStyle(line).stroke, getComputedStyle(area).fill];
}"""


def test_trap_explorer_line_toggles_and_axis_read_under_the_dark_theme(dark_notebook_page, request):
    """The tolerance line stands out from the plot area (WCAG non-text 3:1; #444 vanished), each
    toggle group's picked option is bold with a check mark and a bar and says aria-pressed (the
    others not), and the log axis writes powers of ten as the tolerance label does (1e-5, no
    SI prefix such as 100µ)."""
    nb = dark_notebook_page
    root = nb.page.locator(".packsim-traps")
    expect(root.locator(".js-plotly-plot svg.main-svg").first).to_be_visible(timeout=TIMEOUT_MS)
    root.scroll_into_view_if_needed()
    nb.screenshot(request.node.name, "traps", root)
    line_ratio, stroke, area = root.evaluate(_LINE_VS_PLOT_JS)
    print(f"contrast tolerance line {stroke} on plot area {area}: {line_ratio:.2f}")
    assert line_ratio >= 3, (line_ratio, stroke, area)
    buttons = root.locator(".widget-toggle-button").evaluate_all("""bs => bs.map(b => [
        b.classList.contains('mod-active'), b.getAttribute('aria-pressed'),
        Number(getComputedStyle(b).fontWeight), getComputedStyle(b, '::before').content,
        getComputedStyle(b).boxShadow, b.textContent.trim()])""")
    picked = [b for b in buttons if b[0]]
    assert len(picked) == 5, buttons  # one per group: attention, positions, mask, use_cache, rows
    for active, pressed, weight, before, shadow, text in buttons:
        assert pressed == ("true" if active else "false"), (text, pressed)
        if active:
            assert weight >= 600 and "\u2713" in before and "inset" in shadow, (text, weight, before, shadow)
        else:
            assert weight < 600 and before in ("none", "normal", ""), (text, weight, before)
    texts = "ts => ts.map(t => t.textContent)"  # (SVG text has no innerText)
    ticks = root.locator(".yaxislayer-above text").evaluate_all(texts)
    assert ticks and not any("\u00b5" in t or t.endswith(("m", "n", "p")) for t in ticks), ticks
    assert any(re.search(r"1e[\u2212-]5", t) for t in ticks), ticks  # as 'tolerance 1e-5'
    assert "tolerance 1e-5" in root.locator(".annotation-text").evaluate_all(texts)


def test_check_feedback_reads_under_the_dark_theme(dark_notebook_page, request):
    """A check's verdict box renders outside the widgets' CSS: its own <style> switches the verdict
    colours (packsim.viz.style OK_TEXT / BAD_TEXT) to their dark-theme values, and every text reads."""
    from packsim.viz.style import BAD_TEXT, OK_TEXT

    def rgb(hex_colour):
        return "rgb({}, {}, {})".format(*(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)))

    nb = dark_notebook_page
    boxes = nb.page.locator(".packsim-feedback")
    expect(boxes.nth(2)).to_be_visible(timeout=TIMEOUT_MS)
    area = nb.page.locator(".jp-OutputArea", has=boxes.first).first
    nb.screenshot(request.node.name, "feedback", area)
    for status, colour in (("correct", OK_TEXT["dark"]), ("wrong", BAD_TEXT["dark"])):
        word = nb.page.locator(f".packsim-feedback-{status} span").first
        assert word.evaluate("e => getComputedStyle(e).color") == rgb(colour), status
    _check_contrast(area, "check feedback")
