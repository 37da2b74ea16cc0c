"""Build the executed course as static HTML that works offline: ``make html`` -> ``site/``.

``python -m packsim.course.tools.static_site [NOTEBOOK_OR_FOLDER ...] [--out site] [--timeout S]``
executes every notebook (``PACKSIM_FAST`` passed through) and writes one page per notebook plus
``index.html``. Offline means no CDN at view time; small means every large asset exists once, in
``site/_static/``: plotly.js (figures draw with the page's global ``Plotly``; :func:`slim_outputs`
drops the per-kernel copies), the Jupyter widget manager's standalone ``embed.js`` and its fonts
(from npm, into ``build/web``), JupyterLab's CSS. Widgets' saved state keeps only what the widget
manager draws, and ``PACKSIM_STATIC=1`` shows each widget's static figure under it (see the
functions). ``tests/browser/test_site.py`` opens two pages in Chromium with the network cut off.

Lessons: none directly.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import plotly
from plotly.offline import get_plotlyjs

from packsim.core.errors import PacksimError
from packsim.course.tools.lesson_time import is_core
from packsim.course.tools.notebook_tools import NotebookRunError, execute, find_notebooks

__all__ = ["NPM_PACKAGES", "build_page", "build_site", "slim_outputs", "share_equal_models", "install_widget_assets", "main"]

NPM_PACKAGES = ("@jupyter-widgets/html-manager@^1.0.15",)
ROOT = Path(__file__).resolve().parents[3]  # packsim/course/tools/static_site.py -> the repository
DEFAULT_NPM_DIR = ROOT / "build" / "web"
STATIC = "_static"
MANAGER_JS = f"{STATIC}/html-manager/embed.js"
PLOTLY_JS = f"{STATIC}/plotly.min.js"
LAB_CSS = f"{STATIC}/jupyterlab.css"
_LAB_STYLES = ("static/index.css", "static/theme-light.css")  # what the lab template inlines
# The lab template with plotly.js loaded first (a page whose only figures sit inside widgets gets
# none from plotly's renderer) instead of requirejs (the standalone widget manager needs none),
# JupyterLab's style linked from _static instead of inlined, and without its MathJax and mermaid
# scripts (CDNs; the lessons use neither LaTeX nor diagrams) ...
_TEMPLATE = (
    "{%- extends 'lab/index.html.j2' -%}"
    "{%- block html_head_js_requirejs -%}"
    f'<script src="{PLOTLY_JS}"></script>'
    "{%- endblock html_head_js_requirejs -%}"
    "{%- block notebook_css -%}"
    f'<link rel="stylesheet" href="{LAB_CSS}">'
    "{{ super() | replace(resources.include_css('static/index.css'), '')"
    " | replace(resources.include_css('static/theme-light.css'), '') }}"
    "{%- endblock notebook_css -%}"
    "{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}"
    "{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}"
)
# ... and plotly's own MathJax <script src=CDN> that its `notebook` renderer puts by each figure.
_MATHJAX_CDN = re.compile(r'<script[^>]*src="https://[^"]*mathjax[^"]*"[^>]*>\s*</script>', re.I)
KERNEL_ENV = {"PACKSIM_STATIC": "1", "PLOTLY_RENDERER": "plotly_mimetype+notebook"}
_PLOTLY_MIME = "application/vnd.plotly.v1+json"
_WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def install_widget_assets(site: Path, npm_dir: Path = DEFAULT_NPM_DIR) -> None:
    """Copy the widget manager, plotly.js and JupyterLab's page style into ``site/_static``, the
    one copy every page shares (npm runs on first use).

    Raises PacksimError naming the fix when npm is missing or the install fails.
    """
    modules = npm_dir / "node_modules"
    dist = modules / "@jupyter-widgets" / "html-manager" / "dist"
    if not (dist / "embed.js").exists():
        npm = shutil.which("npm")
        if npm is None:
            raise PacksimError(
                "the offline HTML build needs npm (Node.js) to fetch the Jupyter widget manager: "
                "install Node.js (e.g. `apt install npm` or https://nodejs.org), then rerun."
            )
        npm_dir.mkdir(parents=True, exist_ok=True)
        cmd = [npm, "install", "--no-audit", "--no-fund", "--silent", "--prefix", str(npm_dir)]
        done = subprocess.run([*cmd, *NPM_PACKAGES], capture_output=True, text=True)
        if done.returncode != 0:
            raise PacksimError(
                f"`{' '.join(cmd)} {' '.join(NPM_PACKAGES)}` failed:\n{done.stderr.strip()}\n"
                "check that this machine can reach the npm registry, then rerun."
            )
    target = site / STATIC / "html-manager"
    target.mkdir(parents=True, exist_ok=True)
    # The bundle the pages load and the icon fonts its CSS points at, woff2 only (every current
    # browser takes the woff2 source first); not the AMD bundles, older font formats, source maps.
    for f in dist.iterdir():
        if f.name in ("embed.js", "embed.js.LICENSE.txt") or f.suffix == ".woff2":
            shutil.copy2(f, target / f.name)
    shutil.copy2(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", site / PLOTLY_JS)
    env = _exporter().environment
    css = "\n".join(env.loader.get_source(env, name)[0] for name in _LAB_STYLES)
    (site / LAB_CSS).write_text(_minify_css(css), encoding="utf-8")


def _minify_css(css: str) -> str:
    """``css`` without comments, blank lines and indentation (JupyterLab's style: 256 -> 210 kB)."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    return re.sub(r"^\s+", "", re.sub(r"\n\s*\n+", "\n", css), flags=re.M)


@contextmanager
def _kernel_env():
    """Set the static-build variables for kernels started inside the block."""
    saved = {k: os.environ.get(k) for k in KERNEL_ENV}
    os.environ.update(KERNEL_ENV)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _title(nb) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return ""


def _exporter():
    """nbconvert's HTML exporter with packsim's template and the widget assets in _static."""
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    return HTMLExporter(
        extra_loaders=[DictLoader({"packsim.html.j2": _TEMPLATE})],
        template_file="packsim.html.j2",
        widget_renderer_url=MANAGER_JS,
    )


def _output_bundles(nb):
    """``(data, in_widget)`` for every output: the cells' own, then those in widgets' state."""
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if "data" in output:
                yield output["data"], False
    states = nb.metadata.get("widgets", {}).get(_WIDGET_STATE, {}).get("state", {})
    for model in states.values():
        for output in model.get("state", {}).get("outputs", None) or []:
            if isinstance(output, dict) and "data" in output:
                yield output["data"], True


def slim_outputs(nb) -> int:
    """Remove from an executed notebook what every page gets from ``_static`` or never uses.

    That is the copy of plotly.js that plotly's ``notebook`` renderer displays once per kernel
    (about 4.6 MB), the plotly JSON next to an HTML version of the same figure in a widget's
    saved outputs (the page's widget manager draws the HTML), every unset (null) property of
    a saved ``LayoutModel`` (null is its default in ``@jupyter-widgets/base``; about 300 bytes
    per widget) and every null ``_view_count``, and all but one of equal layout / style models
    (:func:`share_equal_models`); a figure's HTML version is rebuilt from its plotly JSON with
    floats cut to ``FLOAT_DIGITS`` significant digits. Returns the characters removed.
    """
    plotlyjs, removed = get_plotlyjs(), 0
    for data, in_widget in _output_bundles(nb):
        html = data.get("text/html")
        if isinstance(html, list):
            html = "".join(html)
        if isinstance(html, str) and plotlyjs in html:
            data["text/html"] = html.replace(plotlyjs, "")
            removed += len(html) - len(data["text/html"])
        if isinstance(html, str) and "Plotly.newPlot" in html and isinstance(data.get(_PLOTLY_MIME), dict):
            # the page draws the HTML version: rebuild it from the figure with short floats
            before = len(data["text/html"])
            data["text/html"] = _figure_html(data[_PLOTLY_MIME])
            removed += before - len(data["text/html"])
        if in_widget and html and _PLOTLY_MIME in data:
            removed += len(json.dumps(data.pop(_PLOTLY_MIME)))
    states = nb.metadata.get("widgets", {}).get(_WIDGET_STATE, {}).get("state", {})
    for model in states.values():
        state = model.get("state", {})
        if "_view_count" in state and state["_view_count"] is None:  # null: its default everywhere
            removed += len(json.dumps({"_view_count": None})) - 1
            del state["_view_count"]
        if model.get("model_name") == "LayoutModel" and model.get("model_module") == "@jupyter-widgets/base":
            unset = [k for k, v in state.items() if v is None and not k.startswith("_")]
            removed += sum(len(json.dumps({k: None})) - 1 for k in unset)
            for k in unset:
                del state[k]
    return removed + share_equal_models(states)


FLOAT_DIGITS = 5  # significant digits a figure's floats keep on a page (a pixel is ~1/1000 of an axis)


def _short_floats(value):
    """``value`` (a figure's JSON) with every float rounded to FLOAT_DIGITS significant digits."""
    if isinstance(value, float):
        return float(f"{value:.{FLOAT_DIGITS}g}")
    if isinstance(value, list):
        return [_short_floats(v) for v in value]
    if isinstance(value, dict):
        return {k: _short_floats(v) for k, v in value.items()}
    return value


def _figure_html(figure: dict) -> str:
    """The HTML version of a plotly figure dict (no plotly.js: the page loads it once), its floats
    shortened; about half of a training-curves figure's characters were float digits (06)."""
    import plotly.io as pio

    fig = _short_floats({k: v for k, v in figure.items() if k != "config"})
    return pio.to_html(fig, include_plotlyjs=False, full_html=False, config=figure.get("config"),
                       validate=False)


def _is_leaf(model: dict) -> bool:
    """A layout or style model: it refers to no other model, so equal ones are interchangeable."""
    return model.get("model_name", "").endswith(("LayoutModel", "StyleModel"))


def _renamed(value, names: dict):
    if isinstance(value, str) and value.startswith("IPY_MODEL_"):
        return f"IPY_MODEL_{names.get(value[10:], value[10:])}"
    if isinstance(value, list):
        return [_renamed(v, names) for v in value]
    if isinstance(value, dict):
        return {k: _renamed(v, names) for k, v in value.items()}
    return value


def share_equal_models(states: dict) -> int:
    """Keep one of every set of equal layout / style models in a saved widget state and point
    every widget at it (``IPY_MODEL_<id>`` references rewritten); returns the characters removed.

    ipywidgets lets widgets share one ``Layout`` or style, and the widget manager draws each view
    from the shared model. A leakage explorer's token chips, a quiz's word buttons and every
    control carry their own equal copies otherwise (07: 147 layouts and 128 button styles).
    """
    first: dict[str, str] = {}
    names: dict[str, str] = {}
    for mid, model in states.items():
        if _is_leaf(model):
            key = json.dumps([model.get(k) for k in ("model_module", "model_module_version",
                                                     "model_name", "state")], sort_keys=True)
            names[mid] = first.setdefault(key, mid)
    dupes = [mid for mid, keep in names.items() if mid != keep]
    removed = sum(len(json.dumps({mid: states[mid]})) for mid in dupes)
    for mid in dupes:
        del states[mid]
    if dupes:
        for model in states.values():
            model["state"] = _renamed(model.get("state", {}), names)
    return removed


def build_page(notebook: Path | str, site: Path | str, timeout: float = 600) -> tuple[Path, float, str]:
    """Execute one notebook and write ``site/<name>.html``; return (page, seconds, title).

    The shared assets must already be in ``site/_static`` (:func:`install_widget_assets`).
    """
    notebook, site = Path(notebook), Path(site)
    with _kernel_env():
        nb, seconds = execute(notebook, timeout=timeout, store_widget_state=True)
    slim_outputs(nb)
    body, _ = _exporter().from_notebook_node(nb)
    body = _MATHJAX_CDN.sub("", body)
    page = site / f"{notebook.stem}.html"
    page.write_text(body, encoding="utf-8")
    return page, seconds, _title(nb) or notebook.stem


def _index(rows: list[tuple[Path, float, str]], fast: bool) -> str:
    items = "\n".join(
        f'<tr><td><a href="{html.escape(p.name)}">{html.escape(p.stem)}</a></td>'
        f"<td>{'core' if is_core(p) else 'appendix'}</td><td>{html.escape(t)}</td><td>{s:.0f} s</td></tr>"
        for p, s, t in rows
    )
    mode = "fast mode (PACKSIM_FAST=1)" if fast else "full mode"
    return (
        "<!doctype html><meta charset='utf-8'><title>packsim course</title>"
        "<style>body{font-family:sans-serif;max-width:52em;margin:2em auto}"
        "td{padding:2px 12px}</style>"
        "<h1>packsim: pack sequences for LLM fine-tuning correctly</h1>"
        f"<p>The course notebooks, executed in {mode}. Figures and widgets are static here: "
        "open the notebooks in JupyterLab (<code>make lab</code>) to click and train.</p>"
        "<p>The core path (lessons 00-09) tells the story end to end; the appendices are its deep dives.</p>"
        f"<table><tr><th>notebook</th><th>part</th><th>lesson</th><th>built in</th></tr>{items}</table>"
    )


def build_site(
    paths=("notebooks",), out: Path | str = "site", timeout: float = 600,
    npm_dir: Path = DEFAULT_NPM_DIR,
) -> list[tuple[Path, float, str]]:
    """Build every notebook under ``paths`` into ``out``; return (page, seconds, title) rows."""
    from packsim.experiment.run_mode import fast_mode

    site = Path(out)
    site.mkdir(parents=True, exist_ok=True)
    install_widget_assets(site, npm_dir)
    rows = []
    for nb in find_notebooks(paths):
        print(f"building {nb} ...", flush=True)
        rows.append(build_page(nb, site, timeout))
        print(f"  -> {rows[-1][0]} ({rows[-1][1]:.0f} s)", flush=True)
    (site / "index.html").write_text(_index(rows, fast_mode()), encoding="utf-8")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packsim.course.tools.static_site", description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", default=["notebooks"])
    parser.add_argument("--out", default="site", help="output folder (default: site)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per notebook")
    args = parser.parse_args(argv)
    try:
        rows = build_site(args.paths, args.out, args.timeout)
    except (PacksimError, NotebookRunError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"wrote {len(rows)} page(s) and {Path(args.out) / 'index.html'}; open it in a browser")
    return 0


if __name__ == "__main__":
    sys.exit(main())
