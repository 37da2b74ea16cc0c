"""The layering the README states, enforced: each layer imports only from the layers below it.

Every ``import`` and ``from ... import`` in every module counts, lazy ones inside functions and
``TYPE_CHECKING`` blocks included, and so does ``importlib.import_module("packsim...")`` with a
literal name, and so does ``resources.files("packsim...")`` (a package-data tie: reading another
package's files is depending on it). The order (bottom first) is the README's architecture section::

    core < reference < auditing < exhibits < experiment < scaling < viz < course < course.tools < commands < top

Inside ``auditing`` the floors of its docstring's table (verdict < evidence < forward < entry < gate)
hold the same way: a module imports no module of a floor above its own.

``course.tools`` is tooling for ``make`` and the tests (static site, notebook checks, lesson map):
no other module and no notebook imports it. No two modules import each other, directly or
through others. And no module is over 400 lines (one idea per module).
"""

from __future__ import annotations

import ast
import json
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "packsim"
LAYERS = ["core", "reference", "auditing", "exhibits", "experiment", "scaling", "viz", "course", "course.tools", "commands", "top"]
FLOORS = ["verdict", "evidence", "forward", "entry", "gate"]  # inside auditing, bottom first


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _in_package(path: Path) -> bool:
    """A file of the package itself: every folder from packsim/ down to it has an __init__.py."""
    return all((d / "__init__.py").exists() for d in path.parents if d.is_relative_to(PACKAGE))


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if _in_package(p)}


def layer(module: str) -> str:
    """The layer a packsim module belongs to (``top`` for packsim/__init__, cli, testing, ...)."""
    parts = module.split(".")
    if parts[1:3] == ["course", "tools"]:
        return "course.tools"
    if len(parts) > 1 and parts[1] in LAYERS and (PACKAGE / parts[1]).is_dir():
        return parts[1]
    return "top"


def resolve(target: str, names: list[str]) -> list[str]:
    """The packsim modules an import statement loads (a name that is a submodule counts as one)."""
    known = modules()
    found = [target] if target in known else []
    found += [f"{target}.{n}" for n in names if f"{target}.{n}" in known]
    return found or [target]


def imports_of(module: str) -> list[tuple[str, int]]:
    """``(imported packsim module, line)`` for every import in ``module``, lazy ones included."""
    path = modules()[module]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    return imports_in(path.read_text(), package)


def imports_in(source: str, package: str) -> list[tuple[str, int]]:
    """The imports of a module's source; ``package`` resolves relative imports."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "packsim"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "packsim":
                out += [(m, node.lineno) for m in resolve(target, [a.name for a in node.names])]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "files") and node.args and isinstance(node.args[0], ast.Constant)
              and str(node.args[0].value).startswith("packsim")):
            out.append((node.args[0].value, node.lineno))
    return out


def test_the_modules_are_found():
    names = modules()
    assert "packsim.core.batch" in names and "packsim.cli" in names and len(names) > 60


def test_the_reader_sees_lazy_relative_and_dynamic_imports():
    """Negative control: the forms the last layout's hidden cycles used are all read."""
    source = (
        "import importlib\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from packsim.viz import style\n"
        "def f():\n    from ..experiment.results import Results\n"
        "    import packsim.cli\n"
        "    return importlib.import_module('packsim.course.paths')\n"
        "from importlib import resources\n"
        "QUIZ = resources.files('packsim.course') / 'quizzes'\n"
    )
    found = [m for m, _ in imports_in(source, "packsim.core")]
    assert found == ["packsim.viz", "packsim.viz.style", "packsim.experiment.results",
                     "packsim.cli", "packsim.course.paths", "packsim.course"]
    assert [layer(m) for m in found] == ["viz", "viz", "experiment", "top", "course", "course"]


@pytest.mark.parametrize("module", sorted(modules()))
def test_each_module_imports_only_downwards(module):
    mine = LAYERS.index(layer(module))
    wrong = [f"{module}:{line} imports {target} (layer {layer(target)})"
             for target, line in imports_of(module)
             if target.startswith("packsim.") and LAYERS.index(layer(target)) > mine]
    assert not wrong, "upward import: " + "; ".join(wrong)


def test_course_tools_are_imported_by_no_library_module_and_no_notebook():
    users = [f"{m}:{line}" for m in modules() if layer(m) not in ("course.tools",)
             for target, line in imports_of(m) if layer(target) == "course.tools"]
    assert not users, f"course.tools is for make and the tests only: {users}"
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        code = "".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"]
                       if c["cell_type"] == "code")
        assert "packsim.course.tools" not in code, f"{nb.name} imports packsim.course.tools"


def test_no_import_cycle_between_modules():
    graph = {m: sorted({t for t, _ in imports_of(m) if t in modules() and t != m}) for m in modules()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in graph[m]:
            if state.get(t) == 1:
                return stack[stack.index(t):] + [t]
            if t not in state and (cycle := visit(t)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in graph:
        if m not in state and (cycle := visit(m)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


@cache
def floors() -> dict[str, str]:
    """auditing module -> its floor, read from the table in ``packsim/auditing/__init__.py``."""
    table = {}
    for line in (PACKAGE / "auditing" / "__init__.py").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in FLOORS and parts[1].startswith("``"):
            table[f"packsim.auditing.{parts[1].strip('`')}"] = parts[0]
    return table


def test_every_audit_module_has_one_floor():
    audit = {m for m in modules() if m.startswith("packsim.auditing.")}
    assert set(floors()) == audit, (f"not in the floor table: {sorted(audit - set(floors()))}; "
                                    f"in the table, no such module: {sorted(set(floors()) - audit)}")


@pytest.mark.parametrize("module", sorted(m for m in modules() if m.startswith("packsim.auditing.")))
def test_each_audit_module_imports_only_its_floor_and_below(module):
    mine = FLOORS.index(floors()[module])
    wrong = [f"{module}:{line} ({floors()[module]}) imports {t} ({floors()[t]})"
             for t, line in imports_of(module) if t in floors() and FLOORS.index(floors()[t]) > mine]
    assert not wrong, "upward import inside the audit: " + "; ".join(wrong)


def test_the_floor_check_catches_an_upward_import():
    """Negative control: ``report`` (verdict) importing the auditor (entry) is refused."""
    found = imports_in("from packsim.auditing.auditor import audit\n", "packsim.auditing")
    assert found == [("packsim.auditing.auditor", 1)]
    assert FLOORS.index(floors()["packsim.auditing.auditor"]) > FLOORS.index(floors()["packsim.auditing.report"])


def test_the_audit_room_never_imports_the_exhibits_or_the_course():
    """What ``pip install packsim`` users run: the audit reaches core and the reference kernels only (and itself)."""
    wrong = [f"{m}:{line} imports {t}" for m in modules() if m.startswith("packsim.auditing")
             for t, line in imports_of(m) if layer(t) not in ("core", "reference", "auditing")]
    assert not wrong, "; ".join(wrong)


# ----------------------------------------------------------------------------- one idea per module

MAX_LINES = 400  # the house rule: a module over it holds more than one idea; split it by idea


def test_no_module_is_over_the_house_size():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert sizes and max(sizes.values()) > 100  # negative control: the reader sees the big modules
    assert not {p: n for p, n in sizes.items() if n > MAX_LINES}, "split these by idea"
