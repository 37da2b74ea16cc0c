"""Benchmark: what ``pip install packsim`` installs, against ``pip install "packsim[course,trl]"``.

Two fresh virtual environments, built the same way from this checkout:

- ``lean``: ``pip install packsim`` -- the library, the audit and the CLI (torch, transformers,
  tokenizers, numpy, numba, tqdm, accelerate and what they need);
- ``full``: ``pip install "packsim[course,trl]"`` -- plus the notebooks' packages (jupyterlab,
  ipykernel, ipywidgets, plotly, pyyaml, nbconvert) and TRL.

Untimed first: the wheel is built from a copy of the source (``pip wheel --no-deps``; the working
tree is not touched) and every wheel either install needs is fetched into one folder (``pip
download``, torch included: ``--torch-spec``, default ``torch==2.13.0``, the CPU build this
machine's pip sees and ``.ci/run`` installs; ``--torch-index`` adds an index as the Makefile's
``TORCH_INDEX``). Then, per environment, timed: ``python -m venv``, torch, and packsim with its
dependencies, each with ``pip install --no-index --find-links WHEELS`` so both installs read the
same local wheels and no network time is counted. Measured: the distributions installed (besides
the venv's own pip and setuptools), site-packages on disk (``du``), the same without torch, the
largest distributions, and each step's wall time. Then a smoke check in each: ``packsim audit
--setups buggy,correct`` (exit 0), ``packsim doctor --quiet`` (exit 0; the lean one names the
course extra), and ``packsim.viz.leakage_explorer`` (the one-line course-extra error in lean).

    python benchmarks/install_size.py              # both -> benchmarks/results/install_size.json
    python benchmarks/install_size.py --quick      # the lean one only -> runs/bench-quick/
    python benchmarks/install_size.py --keep --work /tmp/venvs   # keep the venvs to look at them
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchutil as bu

VARIANTS = {"lean": "", "full": "[course,trl]"}
SEED = {"pip", "setuptools", "wheel"}  # what python -m venv puts there itself

# Run by each venv's python: every distribution with its size on disk (RECORD files, bytes).
_SIZES_CHILD = """
import json
from importlib import metadata
out = {}
for dist in metadata.distributions():
    total = 0
    for f in dist.files or []:
        try:
            total += f.locate().stat().st_size
        except OSError:
            pass
    out[dist.metadata["Name"]] = {"version": dist.version, "bytes": total}
print(json.dumps(out))
"""

# The lean install's course-only name: one PacksimError line (or the widget, with the course extra).
_VIZ_CHILD = """
import packsim.viz
try:
    packsim.viz.leakage_explorer
    print("loaded")
except Exception as err:
    print(f"{type(err).__name__}: {err}")
"""


def _run(cmd: list[str], cwd: Path, timeout: float = 1800) -> tuple[float, subprocess.CompletedProcess]:
    env = {**os.environ, "PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("VIRTUAL_ENV", None)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return time.perf_counter() - t0, proc


def _checked(cmd: list[str], cwd: Path, timeout: float = 1800) -> float:
    seconds, proc = _run(cmd, cwd, timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: "
                           + (proc.stderr or proc.stdout).strip()[-1500:])
    return seconds


def du_bytes(path: Path) -> int:
    """Disk usage of ``path`` (``du -sk``, in bytes): blocks allocated, links not followed."""
    out = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0]) * 1024


def prepare(work: Path, torch_spec: str, torch_index: str | None, variants: list[str]) -> tuple[Path, Path, dict]:
    """The packsim wheel (from a copy of the source) and every wheel the installs need, in ``work/wheels``."""
    src = work / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(bu.ROOT / name, src / name)
    shutil.copytree(bu.ROOT / "packsim", src / "packsim",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    wheels = work / "wheels"
    t_wheel = _checked([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(wheels), str(src)], work)
    (wheel,) = wheels.glob("packsim-*.whl")
    index = ["--extra-index-url", torch_index] if torch_index else []
    t_download = _checked([sys.executable, "-m", "pip", "download", "-q", "-d", str(wheels), *index,
                           torch_spec, f"{wheel}{VARIANTS['full' if 'full' in variants else 'lean']}"], work)
    return wheel, wheels, {"wheel_s": t_wheel, "download_s": t_download,
                           "wheels_bytes": du_bytes(wheels), "wheels": len(list(wheels.iterdir()))}


def site_packages(venv: Path) -> Path:
    (site,) = (venv / "lib").glob("python3*/site-packages")
    return site


def build_venv(name: str, work: Path, wheel: Path, wheels: Path, torch_spec: str) -> dict:
    """One fresh venv: create, install torch, install packsim (+ extras); sizes, counts, smoke checks."""
    venv = work / f"venv-{name}"
    py = str(venv / "bin" / "python")
    local = ["--no-index", "--find-links", str(wheels)]
    t_venv = _checked([sys.executable, "-m", "venv", str(venv)], work)
    seed = set(json.loads(_run([py, "-c", _SIZES_CHILD], work)[1].stdout))
    t_torch = _checked([py, "-m", "pip", "install", "-q", *local, torch_spec], work)
    after_torch = set(json.loads(_run([py, "-c", _SIZES_CHILD], work)[1].stdout)) - seed
    t_packsim = _checked([py, "-m", "pip", "install", "-q", *local, f"{wheel}{VARIANTS[name]}"], work)
    sizes = json.loads(_run([py, "-c", _SIZES_CHILD], work)[1].stdout)
    ours = {k: v for k, v in sizes.items() if k not in seed and k.lower() not in SEED}
    site = site_packages(venv)
    torch_bytes = sum(v["bytes"] for k, v in ours.items() if k in after_torch)
    smoke = {}
    for check, cmd in {"audit": [str(venv / "bin" / "packsim"), "audit", "--setups", "buggy,correct"],
                       "doctor": [str(venv / "bin" / "packsim"), "doctor", "--quiet"],
                       "viz": [py, "-c", _VIZ_CHILD]}.items():
        seconds, proc = _run(cmd, work, timeout=600)
        lines = (proc.stdout.strip() or proc.stderr.strip()).splitlines()
        smoke[check] = {"rc": proc.returncode, "s": seconds, "last_lines": lines[-2:]}
    largest = sorted(ours.items(), key=lambda kv: -kv[1]["bytes"])[:12]
    return {
        "variant": name, "install": f"pip install packsim{VARIANTS[name]}",
        "packages": len(ours), "with_torch": len(after_torch),
        "site_packages_bytes": du_bytes(site), "records_bytes": sum(v["bytes"] for v in ours.values()),
        "torch_and_deps_bytes": torch_bytes,
        "seconds": {"venv": t_venv, "torch": t_torch, "packsim": t_packsim,
                    "total": t_venv + t_torch + t_packsim},
        "largest": [{"name": k, "version": v["version"], "mib": v["bytes"] / 2**20} for k, v in largest],
        "distributions": {k: v["version"] for k, v in sorted(ours.items(), key=lambda kv: kv[0].lower())},
        "smoke": smoke,
    }


def table(rows: list[dict]) -> str:
    mib = 2**20
    body = [[r["install"], r["packages"], f"{r['site_packages_bytes'] / mib:,.0f}",
             f"{(r['records_bytes'] - r['torch_and_deps_bytes']) / mib:,.0f}",
             f"{r['seconds']['torch']:.0f}", f"{r['seconds']['packsim']:.0f}",
             "ok" if all(s["rc"] == 0 for s in r["smoke"].values()) else "FAILED"] for r in rows]
    return bu.markdown_table(["install", "distributions", "site-packages MiB (du)",
                              "MiB besides torch and its deps", "torch install s", "packsim + deps install s",
                              "smoke (audit, doctor, viz)"], body)


def parse_args(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the lean venv only (smoke run)")
    ap.add_argument("--variants", default=None, help="comma-separated: lean,full (default both; quick: lean)")
    ap.add_argument("--torch-spec", default="torch==2.13.0",
                    help="the torch requirement (default torch==2.13.0: the CPU build this machine's pip sees)")
    ap.add_argument("--torch-index", default=None,
                    help="an extra index for torch, e.g. https://download.pytorch.org/whl/cpu (the Makefile's TORCH_INDEX)")
    ap.add_argument("--work", default=None, help="folder for the wheels and venvs (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the venvs and wheels (with --work)")
    ap.add_argument("--out", help="output folder (default benchmarks/results; quick: runs/bench-quick)")
    args = ap.parse_args(argv)
    names = args.variants or ("lean" if args.quick else ",".join(VARIANTS))
    args.variants = [v.strip() for v in names.split(",") if v.strip()]
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad or not args.variants:
        ap.error(f"--variants {names!r}: choose from {','.join(VARIANTS)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    before = bu.machine_info()
    t0 = time.perf_counter()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="packsim-install-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        wheel, wheels, prep = prepare(work, args.torch_spec, args.torch_index, args.variants)
        rows = [build_venv(name, work, wheel, wheels, args.torch_spec) for name in args.variants]
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    after = bu.machine_info()
    lean, full = ({r["variant"]: r for r in rows}.get(k) for k in ("lean", "full"))
    payload = {
        "benchmark": "install_size",
        "command": " ".join(["python benchmarks/install_size.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": after, "load": bu.load_note(before, after), "wall_s": time.perf_counter() - t0,
        "torch_spec": args.torch_spec, "torch_index": args.torch_index, "prepare": prep, "rows": rows,
    }
    if lean and full:
        extra = sorted(set(full["distributions"]) - set(lean["distributions"]), key=str.lower)
        payload["full_minus_lean"] = {
            "distributions": extra, "count": len(extra),
            "site_packages_mib": (full["site_packages_bytes"] - lean["site_packages_bytes"]) / 2**20,
        }
    path = bu.save_json(bu.out_dir(args.out, args.quick) / "install_size.json", payload)
    print(f"\nwrote {path} ({payload['wall_s']:.0f} s; {payload['load']})")
    for r in rows:
        top = ", ".join(f"{d['name']} {d['mib']:.0f}" for d in r["largest"][:6])
        print(f"{r['variant']}: largest MiB: {top}")
        for check, s in r["smoke"].items():
            print(f"  smoke {check}: exit {s['rc']}: {' / '.join(s['last_lines'])[:200]}")
    if "full_minus_lean" in payload:
        diff = payload["full_minus_lean"]
        print(f"full adds {diff['count']} distributions, {diff['site_packages_mib']:,.0f} MiB")
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
