"""Write constraints/lock.txt from a venv: ``python -m packsim.course.tools.lock VENV OUT`` (``make lock``);
``--same VENV LOCK`` exits 0 when the venv's stack (torch, transformers, TRL, ...) is the lock's (.ci/window new).

The venv's ``pip freeze --exclude-editable``, with packsim itself left out and torch's local build
label dropped (``torch==2.13.0+cpu`` -> ``torch==2.13.0``, so a CUDA machine's build of the same
release satisfies it), under a header that says when and from what it was made. ``make setup``
installs with ``-c`` on it: a learner and the main CI get exactly the versions the tests passed on.

Lessons: none (tooling for make).
"""

from __future__ import annotations

import datetime
import re
import subprocess
import sys
from pathlib import Path

HEADER = """# The lock: the exact versions packsim's tests last passed on (the main CI run installs these).
# Made by `make lock` on {date} (Python {python}) from the newest releases pip saw for
# packsim[course,dev]; refresh it with `make lock`, then `make test`. Every make target installs
# with `-c` on this file; `make test LOCK=` installs without it. The tested window's ends:
# packsim/core/upstream/window.py (tests/test_upstream_window.py keeps the two in step).
"""


def lock_lines(freeze: str) -> list[str]:
    """The constraint lines of a ``pip freeze`` output: sorted, packsim left out, no local labels."""
    out = []
    for line in freeze.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "-e ")) or " @ " in line:
            continue
        name = re.split(r"[=<>!~ ]", line, maxsplit=1)[0]
        if name.lower() == "packsim":
            continue
        out.append(re.sub(r"\+[A-Za-z0-9.]+$", "", line))
    return sorted(out, key=str.lower)


def _freeze(venv: str) -> str:
    python = Path(venv) / "bin" / "python"
    return subprocess.run([str(python), "-m", "pip", "freeze", "--exclude-editable"], check=True,
                          capture_output=True, text=True).stdout


def same_stack(venv: str, lock: str) -> bool:
    """Whether the venv holds the lock's version of every package that names a stack
    (packsim.core.upstream.window.STACK); prints each one that differs."""
    from packsim.core.upstream.window import STACK

    def pins(lines):
        return {re.split(r"==", line, maxsplit=1)[0].lower().replace("_", "-"): line for line in lines if "==" in line}

    have, want = pins(lock_lines(_freeze(venv))), pins(lock_lines(Path(lock).read_text()))
    differ = [(p, have.get(p, "absent"), want.get(p, "absent")) for p in STACK if have.get(p) != want.get(p)]
    for package, got, locked in differ:
        print(f"{package}: {got} here, {locked} in {lock}")
    return not differ


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if args and args[0] == "--same":  # exit 0 when the venv's stack is the lock's
        return 0 if same_stack(args[1], args[2]) else 1
    venv, out = args[:2]
    python = Path(venv) / "bin" / "python"
    freeze = _freeze(venv)
    version = subprocess.run([str(python), "-c", "import sys; print(sys.version.split()[0])"], check=True,
                             capture_output=True, text=True).stdout.strip()
    text = HEADER.format(date=datetime.date.today().isoformat(), python=version) + "\n".join(lock_lines(freeze))
    Path(out).write_text(text + "\n")
    print(f"{out}: {len(lock_lines(freeze))} pinned packages")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
