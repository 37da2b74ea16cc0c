"""Keep the course notebooks clean and runnable: find outputs, strip them, execute notebooks.

The notebooks are committed without outputs, so diffs stay readable and nobody trusts a stale
result. Three commands (``python -m packsim.course.tools.notebook_tools ...``):

- ``check-clean [PATH...]``: list every notebook (folders searched recursively) that has code-cell
  outputs or execution counts; exit 1 if there is any. ``make check`` runs it on ``notebooks``.
- ``strip PATH...``: remove outputs, execution counts and saved widget state, in place.
- ``run PATH... [--timeout S]``: execute notebooks top to bottom (kernel ``python3``, working
  directory = the notebook's folder, ``PACKSIM_FAST`` passed through from the environment)
  without writing anything back; print a table of wall times; exit 1 with the failing cell's
  source and error if one fails.

The same functions back ``tests/test_notebooks.py``.

Lessons: none directly.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import nbformat

from packsim.core.text_table import column_widths, text_table

__all__ = [
    "NotebookRunError",
    "execute",
    "execute_notebook",
    "find_notebooks",
    "has_outputs",
    "main",
    "notebooks_with_outputs",
    "strip_outputs",
]

STRIP_HINT = "python -m packsim.course.tools.notebook_tools strip notebooks"


class NotebookRunError(RuntimeError):
    """A notebook failed to execute: the message names the notebook, the cell and the error."""


def find_notebooks(paths: Path | str | Iterable[Path | str]) -> list[Path]:
    """The ``.ipynb`` files among ``paths``: files as given, folders searched recursively.

    Jupyter's ``.ipynb_checkpoints`` folders are skipped. A path that does not exist raises
    ``FileNotFoundError``.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(f for f in p.rglob("*.ipynb") if ".ipynb_checkpoints" not in f.parts)
        elif p.is_file():
            found.append(p)
        else:
            raise FileNotFoundError(f"no such notebook or folder: {p}")
    return found


def has_outputs(nb: nbformat.NotebookNode) -> bool:
    """True if any code cell has outputs or an execution count, or widget state is saved."""
    if "widgets" in nb.metadata:
        return True
    return any(
        cell.get("outputs") or cell.get("execution_count") is not None
        for cell in nb.cells
        if cell.cell_type == "code"
    )


def notebooks_with_outputs(root: Path | str) -> list[Path]:
    """Every notebook under ``root`` (a folder, searched recursively, or one file) that has outputs."""
    return [p for p in find_notebooks(root) if has_outputs(nbformat.read(p, as_version=4))]


def strip_outputs(path: Path | str) -> bool:
    """Remove outputs, execution counts and widget state from one notebook, in place.

    Returns True if the file changed (it is not rewritten otherwise).
    """
    nb = nbformat.read(path, as_version=4)
    if not has_outputs(nb):
        return False
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)
    return True


def _excerpt(text: str, max_lines: int = 12) -> str:
    """The first ``max_lines`` lines of ``text`` (the last ``-max_lines`` if negative), indented."""
    lines = ["    " + line for line in text.strip("\n").splitlines()]
    n = abs(max_lines)
    if len(lines) > n:
        cut = f"    ... ({len(lines) - n} more lines)"
        lines = [*lines[:n], cut] if max_lines > 0 else [cut, *lines[-n:]]
    return "\n".join(lines)


def _run_error(path: Path, nb, index: int, err: Exception, seconds: float) -> NotebookRunError:
    """The error to raise: notebook, cell index, error line, cell source, traceback tail."""
    from nbclient.exceptions import CellExecutionError

    where = f"cell {index}" if index >= 0 else "before the first cell"
    if isinstance(err, CellExecutionError):
        tb = re.sub(r"\x1b\[[0-9;]*m", "", err.traceback)
        if tb.startswith("An error occurred"):  # nbclient's preamble repeats the source: drop it
            tb = tb.split("\n" + "-" * 18 + "\n", 2)[-1]
        what = f"{err.ename}: {err.evalue}"
    else:  # timeout, dead kernel, kernel that never started
        what, tb = f"{type(err).__name__}: {(str(err).strip() or '?').splitlines()[0]}", ""
    msg = f"{path}: {where} failed after {seconds:.1f} s\n{what}"
    if index >= 0:
        msg += f"\n--- cell {index} source ---\n{_excerpt(nb.cells[index].source)}"
    if tb:
        msg += f"\n--- traceback (end) ---\n{_excerpt(tb, max_lines=-25)}"
    return NotebookRunError(msg)


def execute_notebook(path: Path | str, timeout: float = 180, cwd: Path | str | None = None) -> float:
    """Run a notebook top to bottom and return its wall time in seconds; nothing is written back.

    Kernel ``python3`` (this interpreter), working directory ``cwd`` (default: the notebook's
    folder), and the kernel inherits this process's environment (so ``PACKSIM_FAST`` is
    honoured). ``timeout`` bounds the whole notebook, kernel start included. On failure raises
    :class:`NotebookRunError` with the failing cell's source and error.
    """
    return execute(path, timeout, cwd=cwd)[1]


def execute(
    path: Path | str, timeout: float = 180, store_widget_state: bool = False, cwd: Path | str | None = None
) -> tuple[nbformat.NotebookNode, float]:
    """Like :func:`execute_notebook`, but also return the executed notebook (outputs filled in).

    ``store_widget_state=True`` saves the widgets' state in the notebook's metadata, which the
    static HTML build (:mod:`packsim.course.tools.static_site`) needs to render widgets without a kernel.
    """
    from nbclient import NotebookClient

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    start = time.monotonic()
    deadline = start + timeout
    running = [-1]  # index of the cell being executed

    def on_cell_start(cell, cell_index):
        running[0] = cell_index

    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=int(timeout),
        startup_timeout=int(timeout),
        timeout_func=lambda cell: max(1, int(deadline - time.monotonic())),
        resources={"metadata": {"path": str(Path(cwd or path.parent).resolve())}},  # kernel's cwd
        on_cell_start=on_cell_start,
        store_widget_state=store_widget_state,
    )
    try:
        client.execute()
    except Exception as err:
        raise _run_error(path, nb, running[0], err, time.monotonic() - start) from err
    return nb, time.monotonic() - start


# ---- command line ---------------------------------------------------------------------------


def _cmd_check_clean(paths: list[str]) -> int:
    dirty = [p for root in paths for p in notebooks_with_outputs(root)]
    if not dirty:
        n = len(find_notebooks(paths))
        print(f"ok: {n} notebook(s), no outputs or execution counts")
        return 0
    print("these notebooks carry outputs or execution counts (commit them clean):")
    for p in dirty:
        print(f"  {p}")
    print(f"fix: {STRIP_HINT}")
    return 1


def _cmd_strip(paths: list[str]) -> int:
    notebooks = find_notebooks(paths)
    changed = [p for p in notebooks if strip_outputs(p)]
    for p in changed:
        print(f"stripped {p}")
    print(f"{len(changed)} of {len(notebooks)} notebook(s) changed")
    return 0


def _cmd_run(paths: list[str], timeout: float) -> int:
    notebooks = find_notebooks(paths)
    if not notebooks:
        print(f"error: no notebooks found in {' '.join(paths)}", file=sys.stderr)
        return 2
    rows: list[tuple[str, str, str]] = []
    errors: list[str] = []
    for p in notebooks:
        print(f"running {p} ...", flush=True)
        try:
            rows.append((str(p), f"{execute_notebook(p, timeout=timeout):.1f}", "ok"))
        except NotebookRunError as err:
            rows.append((str(p), "-", "FAILED"))
            errors.append(str(err))
    _print_table(rows)
    for msg in errors:
        print(f"\n{msg}", file=sys.stderr)
    return 1 if errors else 0


def _print_table(rows: list[tuple[str, str, str]]) -> None:
    table = [("notebook", "seconds", "status"), *rows]
    rule = tuple("-" * w for w in column_widths(table))
    print("\n".join(text_table([table[0], rule, *rows], right={1}, pad_last=False)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m packsim.course.tools.notebook_tools", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check-clean", help="fail if any notebook has outputs").add_argument(
        "paths", nargs="*", default=["notebooks"]
    )
    sub.add_parser("strip", help="remove outputs in place").add_argument("paths", nargs="+")
    run = sub.add_parser("run", help="execute notebooks, print wall times")
    run.add_argument("paths", nargs="+")
    run.add_argument(
        "--timeout", type=float, default=180, help="seconds per notebook (default 180)"
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "check-clean":
            return _cmd_check_clean(args.paths)
        if args.command == "strip":
            return _cmd_strip(args.paths)
        return _cmd_run(args.paths, args.timeout)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
