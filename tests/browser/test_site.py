"""The static HTML build (``make html``, packsim.site): a built page works with the network cut off.

One small notebook with a plain plotly figure, a packsim widget (whose figure lives inside an
ipywidgets ``Output``) and a plain ipywidgets slider is built with :func:`packsim.site.build_site`
and opened in Chromium, where every request that is not a local file is aborted and recorded.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from packsim.site import DEFAULT_NPM_DIR, build_site

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "browser"

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def _notebook(path):
    nb = new_notebook(
        cells=[
            new_markdown_cell("# Site test page"),
            new_code_cell(
                "import plotly.graph_objects as go\n"
                "go.Figure(go.Bar(x=[1, 2, 3], y=[3, 1, 2]), layout_title_text='bars')"
            ),
            new_code_cell("import packsim\npacksim.viz.packing_playground(n=40)"),
            new_code_cell("import ipywidgets\nipywidgets.IntSlider(value=7, description='slider')"),
        ]
    )
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    needs_npm = not (DEFAULT_NPM_DIR / "node_modules").exists()
    if needs_npm and shutil.which("npm") is None:
        pytest.skip("the static build needs npm (Node.js) to fetch the Jupyter widget manager")
    root = tmp_path_factory.mktemp("site")
    rows = build_site([_notebook(root / "demo.ipynb")], root / "site", timeout=300)
    return root / "site", rows


def test_build_writes_pages_and_offline_assets(site):
    out, rows = site
    assert [(p.name, t) for p, _, t in rows] == [("demo.html", "Site test page")]
    page = (out / "demo.html").read_text()
    assert "_static/html-manager/embed-amd.js" in page and "_static/require.js" in page
    assert "application/vnd.jupyter.widget-state+json" in page  # widget state saved
    assert re.findall(r"<(?:script|link)[^>]*(?:src|href)=\"https?://", page) == []  # no CDN
    assert (out / "_static" / "html-manager" / "embed-amd.js").stat().st_size > 1e6
    assert "demo.html" in (out / "index.html").read_text()


def test_page_draws_figures_and_widgets_offline(site, browser):
    out, _ = site
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
    try:
        page.goto((out / "demo.html").as_uri())
        # two figures drawn by plotly.js: the plain one and the one inside the widget's Output
        page.wait_for_function(
            "document.querySelectorAll('.plotly-graph-div .main-svg').length >= 4", timeout=20000
        )
        assert page.locator(".packsim-playground").count() == 1
        assert page.locator(".packsim-playground .plotly-graph-div .main-svg").count() >= 2
        assert page.locator(".widget-slider").count() >= 1
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "site-demo.png"), full_page=True)
    finally:
        page.close()
    assert remote == [], f"the page asked the network for {remote}"
    assert errors == [], errors
