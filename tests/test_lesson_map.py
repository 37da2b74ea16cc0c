"""packsim.course.tools.lesson_map: every library module's docstring names exactly the lessons that use it."""

import importlib
import inspect
import pkgutil
from pathlib import Path

import nbformat
import pytest

import packsim
from packsim.course.tools.lesson_map import docstring_lessons, lessons_by_module, modules_used

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
# Course tooling documents itself by lesson in its own way (exercise modules carry the number in
# their name; solutions mirror them); every other module is library code and carries the line.
EXEMPT_PREFIXES = ("packsim.course.exercises.", "packsim.course.solutions.")


def library_modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(packsim.__path__, "packsim."):
        if info.name.startswith(EXEMPT_PREFIXES) or info.name == "packsim.__main__":
            continue
        names.append(info.name)
    return sorted(names)


USED = lessons_by_module(NOTEBOOKS)


@pytest.mark.parametrize("module", library_modules())
def test_docstring_names_the_lessons_that_use_the_module(module):
    stated = docstring_lessons(module)
    assert stated is not None, f"{module}: its docstring has no 'Lessons: ...' line"
    used = USED.get(module, set())
    assert stated == used, (
        f"{module}: the docstring says lessons {sorted(stated)} but the notebooks that import it "
        f"are {sorted(used)}; write 'Lessons: {', '.join(sorted(used)) or 'none directly'}.'"
    )


def test_modules_used_resolves_names_to_their_defining_module(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import packsim\nfrom packsim import pack\nfrom packsim.viz import tile_map"),
        nbformat.v4.new_code_cell("report = packsim.audit(model, batch)\n!packsim doctor"),
    ]
    path = tmp_path / "03_x.ipynb"
    nbformat.write(nb, path)
    assert modules_used(path) == {"packsim.core.packing", "packsim.viz.tiles", "packsim.auditing.auditor"}


def test_every_exercise_module_carries_its_lesson_number():
    exercises = importlib.import_module("packsim.course.exercises")
    names = [i.name for i in pkgutil.iter_modules(exercises.__path__)]
    lessons = {p.name.split("_", 1)[0] for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")}
    assert names and all(n.startswith("lesson") and n[6:8] in lessons for n in names), names


def test_no_public_name_shadows_a_module():
    """``import packsim.exhibits.traps`` must give the module, never a function of the same name."""
    shadowed = []
    for info in pkgutil.walk_packages(packsim.__path__, "packsim."):
        if not info.ispkg:
            continue
        pkg = importlib.import_module(info.name)
        for sub in pkgutil.iter_modules(pkg.__path__):
            obj = getattr(pkg, sub.name, None)
            if obj is not None and not inspect.ismodule(obj):
                shadowed.append(f"{info.name}.{sub.name}")
    for sub in pkgutil.iter_modules(packsim.__path__):
        obj = getattr(packsim, sub.name, None)
        if obj is not None and not inspect.ismodule(obj):
            shadowed.append(f"packsim.{sub.name}")
    assert not shadowed, f"public names that shadow a module: {shadowed}"


def test_the_readme_lesson_table_names_modules_that_exist():
    """The library column of the README's lesson table: every name a module of packsim (a room moved: its row moves)."""
    import importlib.util
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| (?:core|appendix)[^|]*\|[^|]*\|([^|]*)\|", text, re.M)
    named = {stem: re.findall(r"`([\w.]+)`", library) for stem, library in rows}
    assert len(named) == len(list(NOTEBOOKS.glob("*.ipynb"))) and all(named.values()), named
    missing = {stem: [n for n in names if importlib.util.find_spec(f"packsim.{n}") is None]
               for stem, names in named.items()}
    assert not any(missing.values()), f"the README's lesson table names modules that do not exist: {missing}"
