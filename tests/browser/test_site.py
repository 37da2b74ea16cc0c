"""The static HTML build (``make html``, packsim.course.tools.static_site): a built page works with the network cut off.

One small notebook with a plain plotly figure, a packsim widget (whose figure lives inside an
ipywidgets ``Output``) and a plain ipywidgets slider is built with :func:`packsim.course.tools.static_site.build_site`
and opened in Chromium, where every request that is not a local file is aborted and recorded.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from packsim.course.tools.static_site import DEFAULT_NPM_DIR, build_site

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "browser"

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def _notebook(path, title, *sources):
    nb = new_notebook(cells=[new_markdown_cell(f"# {title}"), *map(new_code_cell, sources)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


FIGURE = "import plotly.graph_objects as go\ngo.Figure(go.Bar(x=[1, 2, 3], y=[3, 1, 2]))"
PLAYGROUND = "import packsim\npacksim.viz.packing_playground(n=40)"
SLIDER = "import ipywidgets\nipywidgets.IntSlider(value=7, description='slider')"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    needs_npm = not (DEFAULT_NPM_DIR / "node_modules").exists()
    if needs_npm and shutil.which("npm") is None:
        pytest.skip("the static build needs npm (Node.js) to fetch the Jupyter widget manager")
    root = tmp_path_factory.mktemp("site")
    pages = [  # a plain figure, a widget holding a figure, a plain widget; then a widget alone
        _notebook(root / "a_demo.ipynb", "Site test page", FIGURE, PLAYGROUND, SLIDER),
        _notebook(root / "b_widget_only.ipynb", "Widget only", PLAYGROUND),
    ]
    rows = build_site(pages, root / "site", timeout=300)
    return root / "site", rows


def test_build_writes_pages_and_offline_assets(site):
    out, rows = site
    assert [(p.name, t) for p, _, t in rows] == [
        ("a_demo.html", "Site test page"),
        ("b_widget_only.html", "Widget only"),
    ]
    page = (out / "a_demo.html").read_text()
    assert "_static/html-manager/embed.js" in page and "require.js" not in page
    assert "application/vnd.jupyter.widget-state+json" in page  # widget state saved
    assert re.findall(r"<(?:script|link)[^>]*(?:src|href)=\"https?://", page) == []  # no CDN
    assert (out / "_static" / "html-manager" / "embed.js").stat().st_size > 1e6
    assert (out / "_static" / "plotly.min.js").exists()
    assert "b_widget_only.html" in (out / "index.html").read_text()


def test_pages_share_one_copy_of_each_asset(site):
    """plotly.js, the widget manager and JupyterLab's style exist once, in _static; a page holds
    its own content only, and the whole site stays small."""
    out, _ = site
    static = {p.relative_to(out / "_static").as_posix(): p.stat().st_size
              for p in (out / "_static").rglob("*") if p.is_file()}
    assert {"plotly.min.js", "jupyterlab.css", "html-manager/embed.js"} <= set(static)
    assert sum(static.values()) < 7.5e6, static  # plotly.js 4.8 MB + widget manager 1.9 MB + ...
    manager = {name.split("/")[1] for name in static if name.startswith("html-manager/")}
    assert {n for n in manager if not n.endswith((".woff2", ".LICENSE.txt"))} == {"embed.js"}
    plotlyjs_head = (out / "_static" / "plotly.min.js").read_text()[:2000]
    for page in ("a_demo.html", "b_widget_only.html"):
        text = (out / page).read_text()
        assert len(text.encode()) < 200_000, page  # a page embedding plotly.js is > 4.8 MB
        assert plotlyjs_head not in text
        assert re.search(r'<link[^>]*href="_static/jupyterlab.css"', text)
        assert "application/vnd.plotly.v1+json" not in text  # widgets keep the HTML version only
        assert '"align_content": null' not in text  # layouts keep their set properties only
        state = _widget_state(text)
        leaves = [json.dumps([m["model_name"], m["state"]], sort_keys=True)
                  for m in state.values() if m["model_name"].endswith(("LayoutModel", "StyleModel"))]
        assert leaves and len(leaves) == len(set(leaves)), page  # equal layouts / styles shared
        refs = set(re.findall(r"IPY_MODEL_([0-9a-f]+)", json.dumps(state)))
        assert refs <= set(state), page  # ... and every reference still resolves
    # The shared assets are 7.1 MB (plotly.js 4.8, widget manager 1.9, JupyterLab's CSS 0.2), so
    # the eleven-lesson course fits its 10 MB budget only if a page stays a few hundred kB.
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    assert total < 7.5e6, total


def _widget_state(page_text: str) -> dict:
    found = re.search(r'<script type="application/vnd.jupyter.widget-state\+json">(.*?)</script>',
                      page_text, re.S)
    assert found, "no saved widget state in the page"
    return json.loads(found.group(1))["state"]


def _open_offline(browser, page_path):
    """Open a built page with every non-file request aborted; return (page, remote, errors)."""
    page = browser.new_page()
    remote, errors = [], []

    def only_files(route):
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            remote.append(route.request.url)
            route.abort()

    page.route("**/*", only_files)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(page_path.as_uri())
    return page, remote, errors


def _drawn(page, count, where=""):
    page.wait_for_function(
        f"document.querySelectorAll('{where} .plotly-graph-div .main-svg').length >= {count}",
        timeout=20000,
    )


def test_page_draws_figures_and_widgets_offline(site, browser):
    out, _ = site
    page, remote, errors = _open_offline(browser, out / "a_demo.html")
    try:
        _drawn(page, 4)  # the plain figure and the one inside the widget's Output (2 svgs each)
        assert page.locator(".packsim-playground").count() == 1
        _drawn(page, 2, ".packsim-playground")
        assert page.locator(".widget-slider").count() >= 1
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "site-demo.png"), full_page=True)
    finally:
        page.close()
    assert remote == [], f"the page asked the network for {remote}"
    assert errors == [], errors


def test_widget_figure_draws_on_a_page_without_plain_figures(site, browser):
    out, _ = site
    page, remote, errors = _open_offline(browser, out / "b_widget_only.html")
    try:
        _drawn(page, 2, ".packsim-playground")
    finally:
        page.close()
    assert remote == [] and errors == [], (remote, errors)
