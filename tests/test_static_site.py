"""The static site's slimming (packsim.course.tools.static_site), without building a page.

The browser checks of a built site are in tests/browser/test_site.py.
"""

from __future__ import annotations

import json

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from packsim.course.tools.static_site import _minify_css, share_equal_models, slim_outputs

_BASE = {"model_module": "@jupyter-widgets/base", "model_module_version": "2.0.0"}
_CONTROLS = {"model_module": "@jupyter-widgets/controls", "model_module_version": "2.0.0"}


def _layout(width):
    return {**_BASE, "model_name": "LayoutModel", "state": {"_view_name": "LayoutView", "width": width}}


def _button(text, layout, style):
    return {**_CONTROLS, "model_name": "ButtonModel",
            "state": {"description": text, "layout": f"IPY_MODEL_{layout}", "style": f"IPY_MODEL_{style}",
                      "_view_count": None}}  # fmt: skip


def _state():
    style = {**_CONTROLS, "model_name": "ButtonStyleModel", "state": {"button_color": "#8dd3c7"}}
    return {
        "l1": _layout("auto"), "l2": _layout("auto"), "l3": _layout("30px"),
        "s1": style, "s2": json.loads(json.dumps(style)),
        "b1": _button("a", "l1", "s1"), "b2": _button("b", "l2", "s2"), "b3": _button("c", "l3", "s2"),
        "box": {**_CONTROLS, "model_name": "BoxModel",
                "state": {"children": ["IPY_MODEL_b1", "IPY_MODEL_b2", "IPY_MODEL_b3"], "layout": "IPY_MODEL_l2"}},
    }  # fmt: skip


def test_equal_layouts_and_styles_are_shared_and_references_follow():
    states = _state()
    removed = share_equal_models(states)
    assert set(states) == {"l1", "l3", "s1", "b1", "b2", "b3", "box"} and removed > 0
    assert [states[b]["state"]["layout"] for b in ("b1", "b2", "b3")] == [
        "IPY_MODEL_l1", "IPY_MODEL_l1", "IPY_MODEL_l3"]
    assert {states[b]["state"]["style"] for b in ("b1", "b2", "b3")} == {"IPY_MODEL_s1"}
    assert states["box"]["state"]["layout"] == "IPY_MODEL_l1"
    assert states["box"]["state"]["children"] == ["IPY_MODEL_b1", "IPY_MODEL_b2", "IPY_MODEL_b3"]
    # every reference left points at a model that exists
    refs = [r[10:] for r in json.dumps(states).split('"') if r.startswith("IPY_MODEL_")]
    assert refs and all(r in states for r in refs)


def test_slim_outputs_drops_null_view_counts_and_shares_models():
    nb = new_notebook(cells=[new_code_cell("x")])
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": _state()}}
    assert slim_outputs(nb) > 0
    states = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    assert all("_view_count" not in m["state"] for m in states.values()) and len(states) == 7
    nbformat.validate(nb)


def test_css_minified_keeps_rules():
    css = "/* a comment */\n.a {\n    color: red;\n}\n\n\n/* b\n c */ .b{x:1}\n"
    assert _minify_css(css) == ".a {\ncolor: red;\n}\n.b{x:1}\n"


def test_figure_html_is_rebuilt_with_short_floats():
    import plotly.graph_objects as go
    import plotly.io as pio
    from nbformat.v4 import new_output

    fig = go.Figure(go.Scatter(x=[0, 1, 2], y=[0.123456789, 1 / 3, 2.0]))
    bundle = {"application/vnd.plotly.v1+json": {**fig.to_plotly_json(), "config": {"displaylogo": False}},
              "text/html": pio.to_html(fig, include_plotlyjs=False, full_html=False)}
    nb = new_notebook(cells=[new_code_cell("fig", outputs=[new_output("display_data", bundle)])])
    assert "0.123456789" in bundle["text/html"]
    assert slim_outputs(nb) > 0
    html = nb.cells[0].outputs[0]["data"]["text/html"]
    assert "Plotly.newPlot" in html and "0.12346" in html and "0.33333" in html
    assert "0.123456789" not in html and "0.3333333" not in html and '"displaylogo": false' in html


def test_index_lists_core_lessons_and_appendices(tmp_path):
    from packsim.course.tools.static_site import _index

    rows = [(tmp_path / "01_why_pack.html", 3.0, "01 · Why pack"), (tmp_path / "A1_packing_stopwatch.html", 2.0, "A1 · x")]
    page = _index(rows, fast=True)
    assert "<td>core</td><td>01 · Why pack</td>" in page and "<td>appendix</td><td>A1 · x</td>" in page
