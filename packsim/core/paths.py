"""Find the runs the course committed, whatever the working directory.

The lessons load measured runs that live in the repository, not in the package:
``results/tasks-full`` and ``results/facts-full`` (``packsim compare`` in full mode) and
``benchmarks/results/`` (``make bench``). A path like ``"../results/tasks-full"`` only works when
the kernel starts in ``notebooks/``; a VS Code workspace root or Colab's ``/content`` after a
clone starts elsewhere. :func:`repo_path` finds them from the installed package instead: with the
editable install the course uses (``pip install -e .``), the repository root is the folder above
the ``packsim`` package. When the package was installed from a wheel, the working directory and
its parents are searched too (a clone you started Jupyter in).

Lessons: 02, 06, 07, 08, 09, 10, A1, A2, A5, A6.
"""

from __future__ import annotations

from pathlib import Path

from packsim.core.errors import PacksimError

__all__ = ["REPO_ROOT", "repo_path"]

REPO_ROOT = Path(__file__).resolve().parents[2]  # packsim/core/paths.py -> the repository


def repo_path(relative: str | Path) -> Path:
    """The absolute path of ``relative`` (e.g. ``"results/tasks-full"``) in the packsim repository.

    Looks in the repository the package was installed from, then in the working directory and
    its parents. Raises :class:`PacksimError` saying how to get the files when none has it.
    """
    relative = Path(relative)
    if relative.is_absolute():
        raise PacksimError(f"repo_path takes a path inside the repository, got the absolute {relative}.")
    cwd = Path.cwd().resolve()
    for root in dict.fromkeys([REPO_ROOT, cwd, *cwd.parents]):
        if (root / relative).exists():
            return root / relative
    where = (f"the repository at {REPO_ROOT}" if (REPO_ROOT / "pyproject.toml").exists()
             else f"{REPO_ROOT} (packsim is installed from a wheel, not from a clone)")
    own = ("`make bench` in a clone measures your own" if relative.parts[0] == "benchmarks"
           else "`packsim compare --out DIR` makes your own run: load DIR instead")
    raise PacksimError(
        f"{relative.as_posix()} is not in {where} nor in {cwd} or its parents: it is committed in "
        f"the packsim repository, so clone it and `pip install -e .` there (or run `make lab` in it); "
        f"or {own}."
    )
