"""Lessons import the faces (issue 42 item 1): at most six packsim modules per notebook, no private name,
no solution module; every face's names resolve, none shadowed by a submodule of the same name."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
MOST = 6
FACES = ("packsim", "packsim.core", "packsim.auditing", "packsim.exhibits", "packsim.experiment",
         "packsim.reference", "packsim.scaling", "packsim.viz")


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def lesson_imports(source_cells: list[str]) -> tuple[set[str], list[str], list[str]]:
    """(packsim modules the cells import, private names imported, solution modules imported).

    A module counts once whichever way it is reached: ``import packsim.x``, ``from packsim.x import
    name``, and ``from packsim import x`` where ``x`` is itself a module (it counts as ``packsim.x``)."""
    modules, private, solutions = set(), [], []
    for source in source_cells:
        code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules |= {a.name for a in node.names if a.name.split(".")[0] == "packsim"}
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "packsim":
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    modules.add(full if _is_module(full) else node.module)
                    if alias.name.startswith("_"):
                        private.append(full)
                solutions += [node.module] if ".solutions" in node.module else []
    return modules, private, solutions


def test_the_counter_counts_modules_names_that_are_modules_privates_and_solutions():
    cells = ["import packsim\nfrom packsim import build_model\nfrom packsim.core import forward",
             "from packsim.scaling import normalisation, plan_step\n%time x = 1",
             "from packsim.core.masks import _private\nfrom packsim.course.solutions.lesson01_why_pack import ffd_pack"]
    modules, private, solutions = lesson_imports(cells)
    assert modules == {"packsim", "packsim.core", "packsim.scaling", "packsim.scaling.normalisation",
                       "packsim.core.masks", "packsim.course.solutions.lesson01_why_pack"}
    assert private == ["packsim.core.masks._private"] and solutions == ["packsim.course.solutions.lesson01_why_pack"]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_a_lesson_imports_at_most_six_packsim_modules_no_private_name_and_no_solution(notebook):
    cells = [c.source for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code"]
    modules, private, solutions = lesson_imports(cells)
    assert len(modules) <= MOST, (f"{notebook.stem} imports {len(modules)} packsim modules (at most {MOST}): "
                                  f"{sorted(modules)}; import the names from their room's face")
    assert not private, f"{notebook.stem} imports private names: {private}"
    assert not solutions, f"{notebook.stem} imports a solution module: {solutions} (show_solution prints one)"


@pytest.mark.parametrize("face", FACES)
def test_every_face_name_resolves_and_no_submodule_shadows_one(face):
    module = importlib.import_module(face)
    subs = {m.name for m in pkgutil.iter_modules(module.__path__)}
    assert not set(module.__all__) & subs, f"{face}: a name that is also a submodule is ambiguous"
    for name in module.__all__:
        assert getattr(module, name) is not None, (face, name)
