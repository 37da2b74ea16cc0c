"""Two widgets under JupyterLab's dark theme, read and driven from the keyboard (issue 23).

A second JupyterLab (fixture ``dark_lab_server``) starts with ``JupyterLab Dark`` set in its
user settings and runs a notebook showing the leakage explorer and the spot-the-bug quiz. For
every visible piece of text in each widget the test computes, from the browser's computed
styles, the text colour and the background it sits on (ancestors' backgrounds composited, the
element's opacity applied) and checks WCAG's contrast ratio (4.5:1, or 3:1 for bold or large
text; disabled controls are exempt, as WCAG says). Then it uses only the keyboard: Tab to the
leakage explorer's query slider, arrow keys move the query; Tab to quiz words, Enter / Space
mark them, Enter on Submit grades. Screenshots: ``test-artifacts/browser/test_dark_*.png``.
"""

from __future__ import annotations

import re

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.browser]

TIMEOUT_MS = 15_000
PERCENT = re.compile(r"(\d+(?:\.\d+)?)\s*%")

# Worst text contrast inside a root element: [ratio, needed, text, colour, background] rows.
_CONTRAST_JS = r"""root => {
  const parse = c => { const m = c.match(/rgba?\(([^)]*)\)/); if (!m) return [0, 0, 0, 0];
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
    const needed = (size >= 24 || (bold && size >= 18.66)) ? 3 : (bold ? 3 : 4.5);
    rows.push([ratio(text, bg), needed, own.slice(0, 40), st.color, 'rgb(' + bg.slice(0, 3).map(Math.round) + ')']);
  }
  return rows;
}"""


def expect(locator):
    from playwright.sync_api import expect as _expect

    return _expect(locator)


def _check_contrast(root, what: str) -> int:
    rows = root.evaluate(_CONTRAST_JS)
    assert len(rows) >= 5, f"{what}: only {len(rows)} text elements found"
    bad = [r for r in rows if r[0] < r[1]]
    assert not bad, f"{what}: text below WCAG contrast under the dark theme: " + "; ".join(
        f"{t!r} {c} on {b}: {ratio:.2f} < {need}" for ratio, need, t, c, b in bad[:8])
    return len(rows)


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
    words.nth(0).focus()
    page.keyboard.press("Enter")  # mark the first word
    expect(words.nth(0)).to_have_class(re.compile(r"\bpacksim-marked\b"), timeout=TIMEOUT_MS)
    page.keyboard.press("Tab")
    page.keyboard.press("Space")  # and the next one
    expect(words.nth(1)).to_have_class(re.compile(r"\bpacksim-marked\b"), timeout=TIMEOUT_MS)
    assert "marked as wrong" in (words.nth(1).get_attribute("title") or "")
    page.keyboard.press("Enter")  # unmark it again
    expect(words.nth(1)).not_to_have_class(re.compile(r"\bpacksim-marked\b"), timeout=TIMEOUT_MS)
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
