"""Which library modules each lesson uses, read from the notebooks' code (their imports and calls).

``modules_used(notebook)`` resolves every ``from packsim... import name``, ``import packsim...``
and ``packsim.<attr>`` in a notebook's code cells to the module that defines it (``pack`` ->
``packsim.core.packing``). ``lessons_by_module(root)`` inverts that over all notebooks, and
``docstring_lessons(module)`` reads the ``Lessons: 01, 06.`` line every library module carries in
its docstring (lesson numbers and appendix names such as ``A6``, or 'none directly', then an
optional note in parentheses).
tests/test_lesson_map.py keeps the two in step, so a docstring never names a lesson
that no longer uses the module, nor misses one that does.

Lessons: none directly.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from collections import defaultdict
from pathlib import Path

import nbformat

_LESSONS_RE = re.compile(r"^Lessons:\s*(.*?)\.?\s*$", re.M)


def _defining_module(obj, fallback: str) -> str:
    if inspect.ismodule(obj):
        return obj.__name__
    mod = getattr(obj, "__module__", None)
    return mod if isinstance(mod, str) and mod.startswith("packsim") else fallback


def _resolve(dotted: str) -> str | None:
    """``packsim.viz.leakage_explorer`` -> ``packsim.viz.leakage`` (None if it does not resolve)."""
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    owner = parts[0]
    for part in parts[1:]:
        if not hasattr(obj, part):
            try:
                obj = importlib.import_module(f"{owner}.{part}")
            except ModuleNotFoundError:
                return None
        else:
            obj = getattr(obj, part)
        owner = _defining_module(obj, owner)
    return _defining_module(obj, owner)


def _cells(notebook: Path) -> list[str]:
    """The notebook's code cells as plain Python (IPython's own transformer turns ``!``/``%`` into calls)."""
    from IPython.core.inputtransformer2 import TransformerManager

    transform = TransformerManager().transform_cell
    nb = nbformat.read(notebook, as_version=4)
    return [transform(cell.source) for cell in nb.cells if cell.cell_type == "code"]


def _chain(node) -> str | None:
    """``packsim.viz.tile_map`` for an attribute chain rooted at a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not parts or not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def modules_used(notebook: Path | str) -> set[str]:
    """The packsim modules a notebook's code imports or calls into."""
    used: set[str] = set()
    for code in _cells(Path(notebook)):
        try:
            tree = ast.parse(code)
        except SyntaxError as err:
            raise SyntaxError(f"{notebook}: a code cell does not parse ({err.msg}, line {err.lineno})") from err
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("packsim"):
                for alias in node.names:
                    used.add(_resolve(f"{node.module}.{alias.name}") or node.module)
            elif isinstance(node, ast.Import):
                used.update(a.name for a in node.names if a.name.startswith("packsim."))
        chains = {c for c in map(_chain, ast.walk(tree)) if c and c.startswith("packsim.")}
        for chain in chains:
            if not any(other.startswith(chain + ".") for other in chains):  # the longest chain only
                target = _resolve(chain)
                if target:
                    used.add(target)
    return {m for m in used if m != "packsim"}


def lesson_number(notebook: Path | str) -> str:
    """``notebooks/06_train_side_by_side.ipynb`` -> ``"06"``; an appendix ``A6_real_stacks`` -> ``"A6"``."""
    return Path(notebook).name.split("_", 1)[0]


def lessons_by_module(root: Path | str) -> dict[str, set[str]]:
    """module -> lesson numbers whose notebooks use it, over every notebook under ``root``."""
    out: dict[str, set[str]] = defaultdict(set)
    notebooks = [*Path(root).glob("[0-9][0-9]_*.ipynb"), *Path(root).glob("A[0-9]_*.ipynb")]
    for nb in sorted(notebooks):
        for module in modules_used(nb):
            out[module].add(lesson_number(nb))
    return dict(out)


def docstring_lessons(module: str) -> set[str] | None:
    """The lessons a module's docstring names on its ``Lessons:`` line (None: no such line)."""
    doc = importlib.import_module(module).__doc__ or ""
    m = _LESSONS_RE.search(doc)
    if m is None:
        return None
    return set(re.findall(r"\b(?:\d\d|A\d)\b", re.sub(r"\(.*?\)", "", m.group(1))))  # a (note) may follow
