"""Benchmark: what ``import packsim`` costs, and how fast ``packsim --help`` answers.

Each measurement runs in a fresh Python process (nothing cached in ``sys.modules``), ``--repeats``
times, and reports the median and min-max:

- ``import packsim``: seconds for the import statement inside the process, and how many
  ``packsim`` modules (and modules in all) it left in ``sys.modules``;
- ``packsim --help``: wall-clock seconds of the whole ``python -m packsim --help`` process
  (the console script runs the same ``packsim.cli:main``), interpreter start included;
- ``packsim compare|train|audit --bogus``: the same for a bad option (exit 2, one line);
- ``import torch, transformers``: the reference, what any fine-tuning script pays anyway;
- ``python -c pass``: the interpreter's own start, for scale.

``--root DIR`` measures another checkout (``PYTHONPATH=DIR``, run from DIR), e.g. an older commit
in a ``git worktree``; the JSON records which ``packsim/__init__.py`` was imported.

    python benchmarks/import_time.py                     # 5 runs each -> benchmarks/results/import_time.json
    python benchmarks/import_time.py --quick             # 1 run each -> runs/bench-quick/
    python benchmarks/import_time.py --root /tmp/old --label adc2b5b --out /tmp/old-results
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import benchutil as bu

# Run inside the child: time one import statement, then list what it loaded.
_IMPORT_CHILD = """
import json, sys, time
t0 = time.perf_counter()
{statement}
s = time.perf_counter() - t0
mods = [m for m in sys.modules if m == "packsim" or m.startswith("packsim.")]
pk = sys.modules.get("packsim")
print(json.dumps({{"s": s, "packsim_modules": sorted(mods), "all_modules": len(sys.modules),
                  "packsim_file": getattr(pk, "__file__", None)}}))
"""

IMPORTS = {"import packsim": "import packsim", "import torch, transformers": "import torch, transformers"}
PROCESSES = {"packsim --help": ["-m", "packsim", "--help"],  # a bad option exits 2, one line
             "packsim compare --bogus": ["-m", "packsim", "compare", "--bogus"],
             "packsim train --bogus": ["-m", "packsim", "train", "--bogus"],
             "packsim audit --bogus": ["-m", "packsim", "audit", "--bogus"],
             "python -c pass": ["-c", "pass"]}


def _env(root: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}


def measure_import(statement: str, root: Path, timeout: float = 300) -> dict:
    """One fresh process: seconds of ``statement`` and the modules it loaded."""
    proc = subprocess.run([sys.executable, "-c", _IMPORT_CHILD.format(statement=statement)],
                          capture_output=True, text=True, cwd=root, env=_env(root), timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{statement!r} failed in a fresh process: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_process(args: list[str], root: Path, timeout: float = 300) -> float:
    """Wall-clock seconds of one fresh ``python *args`` process (exit 0, or 2 for a bad option)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=root,
                          env=_env(root), timeout=timeout)
    s = time.perf_counter() - t0
    if proc.returncode != (2 if "--bogus" in args else 0):
        raise RuntimeError(f"python {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return s


def run(root: Path, repeats: int, reference: bool = True) -> list[dict]:
    """Every measurement, ``repeats`` rounds, the measurements interleaved within a round."""
    imports = IMPORTS if reference else {"import packsim": IMPORTS["import packsim"]}
    raw: dict[str, list] = {name: [] for name in (*imports, *PROCESSES)}
    for _ in range(repeats):
        for name, statement in imports.items():
            raw[name].append(measure_import(statement, root))
        for name, args in PROCESSES.items():
            raw[name].append(measure_process(args, root))
    rows = []
    for name in imports:
        runs = raw[name]
        rows.append({
            "measurement": name, "kind": "import statement, in process",
            "seconds": bu.summarize([r["s"] for r in runs]),
            "packsim_modules": len(runs[-1]["packsim_modules"]), "all_modules": runs[-1]["all_modules"],
            "packsim_module_names": runs[-1]["packsim_modules"], "packsim_file": runs[-1]["packsim_file"],
        })  # fmt: skip
    for name in PROCESSES:
        rows.append({"measurement": name, "kind": "whole process, wall clock",
                     "seconds": bu.summarize(raw[name]), "packsim_modules": None, "all_modules": None})
    return rows


def table(rows: list[dict]) -> str:
    body = [[r["measurement"], r["kind"], bu.fmt_spread(r["seconds"]),
             "-" if r["packsim_modules"] is None else r["packsim_modules"],
             "-" if r["all_modules"] is None else r["all_modules"]] for r in rows]  # fmt: skip
    return bu.markdown_table(["measurement", "what is timed", "seconds, median [min-max]",
                              "packsim modules", "modules in all"], body)  # fmt: skip


def parse_args(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one run of each (smoke run)")
    ap.add_argument("--repeats", type=int, help="fresh processes per measurement (default 5; quick 1)")
    ap.add_argument("--no-reference", action="store_true", help="skip the torch + transformers reference")
    ap.add_argument("--root", default=str(bu.ROOT), help="checkout to measure (default: this one)")
    ap.add_argument("--label", default="", help="name of the checkout in the JSON (e.g. a commit)")
    ap.add_argument("--out", help="output folder (default benchmarks/results; quick: runs/bench-quick)")
    args = ap.parse_args(argv)
    args.repeats = args.repeats or (1 if args.quick else 5)
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: give at least 1")
    if not (Path(args.root) / "packsim" / "__init__.py").is_file():
        ap.error(f"--root {args.root}: no packsim/__init__.py there; give a packsim checkout")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    root = Path(args.root).resolve()
    before = bu.machine_info()
    t0 = time.perf_counter()
    rows = run(root, args.repeats, reference=not args.no_reference)
    after = bu.machine_info()
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or None  # fmt: skip
    payload = {
        "benchmark": "import_time",
        "command": " ".join(["python benchmarks/import_time.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": after,
        "load": bu.load_note(before, after),
        "checkout": {"root": str(root), "commit": commit, "label": args.label or commit},
        "repeats": args.repeats,
        "wall_s": time.perf_counter() - t0,
        "rows": rows,
    }
    path = bu.save_json(bu.out_dir(args.out, args.quick) / "import_time.json", payload)
    print(f"\nwrote {path} ({payload['wall_s']:.0f} s; {payload['load']})")
    print(f"checkout {root} at {commit}; {args.repeats} fresh process(es) per measurement\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
