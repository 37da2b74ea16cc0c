"""The widgets' front end is package data (issue 29): HTML and CSS in packsim/viz/frontend/.

Every file there is used by a module of packsim.viz, every ``template("...")`` call names a file
that exists, each file is a valid :class:`string.Template`, and no string in packsim/viz/*.py
holds a block of markup (a ``<style>`` or ``<script>``, or more than 3 HTML tags): markup goes to
a file, not an f-string.
"""

from __future__ import annotations

import ast
import re
import string
from pathlib import Path

import pytest

from packsim.viz.assets import template

VIZ = Path(__file__).resolve().parents[1] / "packsim" / "viz"
FRONTEND = VIZ / "frontend"
MODULES = sorted(VIZ.glob("*.py"))
TAG = re.compile(
    r"</?(?:a|b|i|p|br|hr|div|span|sup|sub|code|pre|em|strong|small|ul|ol|li|table|thead|tbody|tr"
    r"|td|th|h[1-6]|img|svg|html|head|body|meta|title|style|script|link|button|input|label)\b[^<>]*>",
    re.I,
)
MAX_TAGS = 3


def frontend_files() -> list[Path]:
    return sorted(p for p in FRONTEND.iterdir() if p.is_file())


def template_calls() -> list[tuple[str, int, str]]:
    """``(module, line, file name)`` of every ``template("<literal>")`` call in packsim/viz."""
    calls = []
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call)
                    and getattr(node.func, "id", getattr(node.func, "attr", None)) == "template"
                    and node.args and isinstance(node.args[0], ast.Constant)):  # fmt: skip
                calls.append((path.name, node.lineno, node.args[0].value))
    return calls


def markup_blocks(source: str) -> list[tuple[int, str]]:
    """``(line, start of text)`` of each string constant (f-string parts too) holding markup."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if "<style" in text.lower() or "<script" in text.lower() or len(TAG.findall(text)) > MAX_TAGS:
                found.append((node.lineno, text[:60]))
    return found


def test_the_folder_holds_data_only():
    files = frontend_files()
    assert len(files) >= 10, files
    assert not [p for p in files if p.suffix == ".py"], "frontend/ is package data, not a package"
    assert {p.suffix for p in files} <= {".html", ".css", ".js"}


@pytest.mark.parametrize("path", frontend_files(), ids=lambda p: p.name)
def test_every_file_is_used_by_a_module(path):
    users = [m.name for m in MODULES if path.name in m.read_text()]
    assert users, f"frontend/{path.name} is named by no module of packsim/viz: delete it or use it"


def test_every_template_call_names_an_existing_file():
    calls = template_calls()
    assert len(calls) >= 21, calls  # widget, report, leakage, tiles and training call it
    missing = [f"{m}:{line} template({name!r})" for m, line, name in calls
               if not (FRONTEND / name).is_file()]  # fmt: skip
    assert not missing, f"no such file in packsim/viz/frontend: {missing}"


@pytest.mark.parametrize("path", frontend_files(), ids=lambda p: p.name)
def test_each_file_is_a_valid_template(path):
    text = template(path.name).template
    bad = [m.start() for m in string.Template.pattern.finditer(text) if m.group("invalid") is not None]
    assert not bad, f"frontend/{path.name}: a '$' that is no placeholder at {bad} (write '$$')"
    assert not text.endswith("\n"), "the file's final newline is not part of the template"
    assert template(path.name) is template(path.name)  # read once


def test_the_markup_check_sees_a_block():
    """Negative control: the forms the widgets' and the report's markup had are caught."""
    source = (
        "A = f\"\"\"<style>\n.x {{ color: {RED}; }}\n</style>\"\"\"\n"
        "B = f'<table><thead><tr><th>{h}</th>'\n"
        "C = ('<div>x</div>'\n     '<p>y</p>')\n"
        "D = '<bos> <pad> <extra></extra> <br>'\n"  # tokens, plotly's hover tag: no markup
        "E = f'<b>{a}</b>: {b}<br>' + f'<i>{c}</i>'\n"  # 3 tags a piece: short enough
    )
    assert sorted(line for line, _ in markup_blocks(source)) == [1, 4, 5]  # A, B, C


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_module_holds_markup_in_a_string(path):
    found = markup_blocks(path.read_text())
    assert not found, (
        f"{path.name} holds markup in strings {found}: put it in a packsim/viz/frontend/ file "
        "and fill it with packsim.viz.assets.template(name).substitute(...)"
    )
