"""The widgets in a real browser: JupyterLab + Chromium, clicking like a learner (issue 5).

``widgets_e2e.ipynb`` (run by the ``notebook_page`` fixture) displays every ``packsim.viz`` widget;
these tests click them and read the DOM through the CSS classes the widgets promise
(``packsim-token``, ``packsim-attention``, ``packsim-quiz-word``, ...). Screenshots of every
state go to ``test-artifacts/browser/<test name>-<step>.png``.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from packsim.course.tools.notebook_tools import has_outputs

NOTEBOOK = Path(__file__).resolve().parent / "widgets_e2e.ipynb"

PERCENT = re.compile(r"(\d+(?:\.\d+)?)\s*%")
SCORE = re.compile(r"Score:\s*(\d+)\s*/\s*(\d+)")
TIMEOUT_MS = 15_000


def expect(locator):
    from playwright.sync_api import expect as _expect

    return _expect(locator)


def _percent(text: str) -> float:
    match = PERCENT.search(text)
    assert match, f"no percentage in the outside-share text {text!r}"
    return float(match.group(1))


def _shaded_keys(attention) -> int:
    """How many ``.packsim-key`` spans of an attention view have a visible background."""
    return attention.locator(".packsim-key").evaluate_all(
        """spans => spans.filter(s => {
            const c = getComputedStyle(s).backgroundColor;
            const m = c.match(/rgba?\\(([^)]*)\\)/);
            if (!m) { return false; }
            const parts = m[1].split(',').map(Number);
            const alpha = parts.length > 3 ? parts[3] : 1;
            const white = parts[0] === 255 && parts[1] === 255 && parts[2] === 255;
            return alpha > 0 && !white;
        }).length"""
    )


def test_notebook_is_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert not has_outputs(nb), (
        f"{NOTEBOOK} carries outputs; run `python -m packsim.course.tools.notebook_tools strip {NOTEBOOK}`"
    )


@pytest.mark.browser
def test_notebook_runs_without_errors(lab, request):
    """Run All (done by the fixture) left no error output and no widget that failed to render."""
    assert not lab.errors(), "\n\n".join(lab.errors())
    page = lab.page
    for bad in ("Error displaying widget", "Error rendering output", "Failed to load model class"):
        expect(page.get_by_text(bad)).to_have_count(0)
    lab.screenshot(request.node.name, "all")


@pytest.mark.browser
def test_leakage_explorer_click_shows_the_leak(lab, request):
    """A token of a later example: buggy attends outside its example, correct exactly 0.0%."""
    root = lab.page.locator(".packsim-leakage")
    expect(root).to_be_visible(timeout=TIMEOUT_MS)
    lab.screenshot(request.node.name, "before", root)

    buggy = root.locator(".packsim-panel-buggy")
    tokens = buggy.locator(".packsim-token")
    n_tokens = tokens.count()
    assert n_tokens >= 3, f"the buggy panel shows {n_tokens} token chips"
    attention = buggy.locator(".packsim-attention")
    before = attention.inner_html()
    # The notebook packs several examples into one full row: the last token is in a later example.
    tokens.nth(n_tokens - 1).click()
    expect(attention).not_to_have_js_property("innerHTML", before, timeout=TIMEOUT_MS)
    expect(attention.locator(".packsim-key-outside").first).to_be_visible(timeout=TIMEOUT_MS)
    share = buggy.locator(".packsim-outside-share")
    expect(share).to_have_text(PERCENT, timeout=TIMEOUT_MS)
    assert _shaded_keys(attention) > 0, "no key token is shaded after the click"
    assert _percent(share.inner_text()) > 0, f"buggy outside share: {share.inner_text()!r}"
    lab.screenshot(request.node.name, "buggy-clicked", root)

    correct = root.locator(".packsim-panel-correct")
    correct_tokens = correct.locator(".packsim-token")
    assert correct_tokens.count() == n_tokens, "the two panels should show the same pack"
    correct_tokens.nth(n_tokens - 1).click()
    correct_share = correct.locator(".packsim-outside-share")
    expect(correct_share).to_have_text(re.compile(r"(?<![\d.])0\.0\s*%"), timeout=TIMEOUT_MS)
    correct_attention = correct.locator(".packsim-attention")
    expect(correct_attention.locator(".packsim-key").first).to_be_attached(timeout=TIMEOUT_MS)
    expect(correct_attention.locator(".packsim-key-outside")).to_have_count(0)
    assert _shaded_keys(correct_attention) > 0, "the correct panel shades no key token"
    lab.screenshot(request.node.name, "correct-clicked", root)

    # Rapid clicks, then a double click on token 0: the last click wins. Token 0 starts the row's
    # first example, which has nothing before it to read: 0.0% even under the causal mask.
    for k in (n_tokens - 2, n_tokens - 3, n_tokens - 2, 1):
        tokens.nth(k).click()
    tokens.nth(0).dblclick()
    expect(share).to_have_text(re.compile(r"(?<![\d.])0\.0\s*%"), timeout=TIMEOUT_MS)
    expect(attention.locator(".packsim-key-outside")).to_have_count(0, timeout=TIMEOUT_MS)
    lab.screenshot(request.node.name, "first-token", root)


@pytest.mark.browser
def test_quiz_mark_unmark_submit(lab, request):
    """Mark two words, unmark one, submit: the result shows a score."""
    quiz = lab.page.locator(".packsim-quiz").first
    expect(quiz).to_be_visible(timeout=TIMEOUT_MS)
    words = quiz.locator(".packsim-quiz-word")
    assert words.count() >= 3, f"the quiz shows {words.count()} words"
    marked = quiz.locator(".packsim-marked")
    expect(marked).to_have_count(0)
    lab.screenshot(request.node.name, "before", quiz)

    first, second = words.nth(0), words.nth(2)
    first.click()
    expect(first).to_have_class(re.compile(r"\bpacksim-marked\b"), timeout=TIMEOUT_MS)
    second.click()
    expect(second).to_have_class(re.compile(r"\bpacksim-marked\b"), timeout=TIMEOUT_MS)
    expect(marked).to_have_count(2)
    lab.screenshot(request.node.name, "two-marked", quiz)

    first.click()
    expect(first).not_to_have_class(re.compile(r"\bpacksim-marked\b"), timeout=TIMEOUT_MS)
    expect(marked).to_have_count(1)
    lab.screenshot(request.node.name, "one-unmarked", quiz)

    quiz.locator(".packsim-quiz-submit").click()
    result = quiz.locator(".packsim-quiz-result")
    expect(result).to_contain_text(SCORE, timeout=TIMEOUT_MS)
    got, out_of = map(int, SCORE.search(result.inner_text()).groups())
    assert out_of > 0 and 0 <= got <= out_of, result.inner_text()
    lab.screenshot(request.node.name, "submitted", quiz)


# Root class of every widget the notebook shows, and whether it draws a plotly figure.
WIDGETS = {
    "leakage": False,
    "quiz": False,
    "curves": True,
    "playground": True,
    "mask-explorer": True,
    "labels": False,
    "tiles": True,
}


@pytest.mark.browser
@pytest.mark.parametrize("name", list(WIDGETS))
def test_widget_renders(lab, request, name):
    """Each widget's root box is on the page (with its plotly figure drawn, where it has one)."""
    root = lab.page.locator(f".packsim-{name}")
    expect(root).to_have_count(1)
    expect(root).to_be_visible(timeout=TIMEOUT_MS)
    if WIDGETS[name]:
        expect(root.locator(".js-plotly-plot svg.main-svg").first).to_be_visible(
            timeout=TIMEOUT_MS
        )
    lab.screenshot(request.node.name, "shown", root)


@pytest.mark.browser
def test_plotly_figure_renders(lab, request):
    """plotly.js drew the live training curves: one line per setup at least, in an svg."""
    plot = lab.page.locator(".packsim-curves .js-plotly-plot").first
    expect(plot).to_be_visible(timeout=TIMEOUT_MS)
    expect(plot.locator("svg.main-svg").first).to_be_visible(timeout=TIMEOUT_MS)
    lines = plot.locator(".scatterlayer .trace")
    assert lines.count() >= 2, f"the curves figure draws {lines.count()} line traces"
    lab.screenshot(request.node.name, "figure", plot)
