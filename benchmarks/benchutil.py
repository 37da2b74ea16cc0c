"""Shared helpers for the benchmark scripts: timing, median and spread, tables, machine facts.

Every benchmark here reports ratios measured side by side in one run (the machines are shared
and noisy), repeats each measurement, and prints a Markdown table last. This module holds the
pieces they share:

- :func:`time_calls` / :func:`summarize` / :func:`paired_ratio`: repeat, median, min-max spread;
- :func:`markdown_table` (packsim's :mod:`packsim.core.text_table`), :func:`fmt_spread`: the tables
  printed last and pasted into RESULTS.md;
- :func:`machine_info`: CPU model, cores, load, torch version and the date, stored in every JSON;
- :func:`run_worker` / :func:`worker_main`: run one measurement in a fresh process (peak memory);
- :func:`reset_peak_rss` / :func:`peak_rss_mb` / :func:`current_rss_mb`: Linux RSS accounting.

No torch import at module level, so ``gpu.py``'s table and JSON code can be tested anywhere.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "benchmarks" / "results"
QUICK_DIR = ROOT / "runs" / "bench-quick"  # runs/ is git-ignored: quick runs never touch results/

if str(ROOT) not in sys.path:  # run from a plain checkout (e.g. the GPU machine) without install
    sys.path.insert(0, str(ROOT))

# the tables printed last (packsim's, no torch)
from packsim.core.text_table import markdown_table as markdown_table  # noqa: E402

# ------------------------------------------------------------------------------ timing


def time_calls(
    fn: Callable[[], object],
    repeats: int,
    warmup: int = 1,
    sync: Callable[[], None] | None = None,
    max_s: float | None = None,
) -> list[float]:
    """Wall-clock seconds of ``repeats`` calls of ``fn`` after ``warmup`` untimed calls.

    ``sync`` (e.g. ``torch.cuda.synchronize``) runs before each clock read. ``max_s`` stops
    early once the timed calls have taken that long (at least 2 calls are kept when asked for).
    """
    for _ in range(warmup):
        fn()
    if sync:
        sync()
    times: list[float] = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - t0)
        if max_s is not None and sum(times) > max_s and len(times) >= min(2, repeats):
            break
    return times


def parse_paths(ap: argparse.ArgumentParser, text: str, choices: Sequence[str]) -> list[str]:
    """Comma-separated ``--paths`` value -> list, or an argparse error naming the unknown ones."""
    paths = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in paths if p not in choices]
    if bad or not paths:
        ap.error(f"unknown path(s) {bad}; choose from {','.join(choices)}")
    return paths


def summarize(values: Sequence[float]) -> dict[str, float]:
    """``{"median", "min", "max", "n"}`` of ``values`` (NaN for an empty list)."""
    vals = [float(v) for v in values]
    if not vals:
        nan = float("nan")
        return {"median": nan, "min": nan, "max": nan, "n": 0}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def paired_ratio(num: Sequence[float], den: Sequence[float]) -> dict[str, float]:
    """Summary of ``num[i] / den[i]``: ratios of measurements taken side by side (same round).

    When the lists differ in length (a worker stopped early) every pairing is used instead,
    which gives a wider, conservative spread around the ratio of medians.
    """
    if len(num) == len(den):
        return summarize([a / b for a, b in zip(num, den, strict=True)])
    out = summarize([a / b for a in num for b in den])
    out["median"] = statistics.median(num) / statistics.median(den)
    return out


# ------------------------------------------------------------------------------ packs


def pack_lengths(n_tokens: int, seed: int = 0) -> list[int]:
    """Example lengths from the course's long-tailed mix filling exactly ``n_tokens`` tokens.

    Lengths are ``packsim.core.data.long_tailed_lengths`` draws (lognormal, median 90, sigma 0.9,
    clipped to [8, 2048]) in order until the pack is full; the last one is trimmed to fit.
    About 64 examples at 8k tokens. Used by attention.py and gpu.py.
    """
    from packsim.core.data import long_tailed_lengths

    draws = long_tailed_lengths(max(1, n_tokens // 8), seed=seed)  # each >= 8: always enough
    lengths: list[int] = []
    total = 0
    for x in draws.tolist():
        lengths.append(min(x, n_tokens - total))
        total += lengths[-1]
        if total == n_tokens:
            break
    return lengths


def cu_from_lengths(lengths: Sequence[int]):
    """``(S+1,)`` int32 offsets ``[0, l0, l0+l1, ...]`` (a torch tensor on CPU)."""
    import torch

    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + int(n))
    return torch.tensor(offsets, dtype=torch.int32)


# ------------------------------------------------------------------------------ formatting


def fmt_num(x: float | None, digits: int = 3) -> str:
    """A compact number: ``0.0123``, ``12.3``, ``1.23e+04``; ``-`` for None/NaN."""
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    ax = abs(x)
    if ax != 0 and (ax >= 1e5 or ax < 1e-3):
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}"


def fmt_spread(s: dict | None, scale: float = 1.0, digits: int = 3) -> str:
    """``median [min-max]`` of a :func:`summarize` dict, each multiplied by ``scale``."""
    if not s or not s.get("n"):
        return "-"
    med, lo, hi = (s[k] * scale for k in ("median", "min", "max"))
    if s["n"] == 1:
        return fmt_num(med, digits)
    return f"{fmt_num(med, digits)} [{fmt_num(lo, digits)}-{fmt_num(hi, digits)}]"


def verdict(ok: bool | None) -> str:
    """``met`` / ``NOT met`` / ``n/a`` for a target check."""
    return "n/a" if ok is None else ("met" if ok else "NOT met")


# ------------------------------------------------------------------------------ machine facts


def _cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        m = re.search(r"^Model name:\s*(.+)$", out, re.M)
        if m:
            return m.group(1).strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        m = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        return m.group(1).strip() if m else platform.processor() or "unknown"
    except OSError:
        return platform.processor() or "unknown"


def _mem_total_gib() -> float | None:
    try:
        m = re.search(r"MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text())
        return round(int(m.group(1)) / 2**20, 1) if m else None
    except OSError:
        return None


def machine_info(threads: int | None = None) -> dict:
    """Where and when a benchmark ran: date, CPU, cores, load, memory, python/torch versions."""
    info = {
        "date": datetime.date.today().isoformat(),
        "cpu": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "mem_total_gib": _mem_total_gib(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch_threads": threads,
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda"] = torch.version.cuda
    except ImportError:  # pragma: no cover - every benchmark env has torch
        info["torch"] = None
    return info


def load_note(before: dict, after: dict) -> str:
    """One line on machine load during a run (1-minute load average before and after)."""
    b, a = before.get("loadavg_1_5_15"), after.get("loadavg_1_5_15")
    if not b or not a:
        return "load average not available"
    cores = after.get("logical_cores") or "?"
    return f"1-min load average {b[0]} before, {a[0]} after, on {cores} logical cores"


# ------------------------------------------------------------------------------ files


def out_dir(arg: str | None, quick: bool) -> Path:
    """Where results go: ``--out`` if given, else ``runs/bench-quick`` (quick) or ``benchmarks/results``."""
    path = Path(arg) if arg else (QUICK_DIR if quick else RESULTS_DIR)
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_json(path: Path, payload: dict) -> Path:
    """Write ``payload`` as indented JSON (NaN written as null) and return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_nan_to_none(payload), indent=1) + "\n")
    return path


def _nan_to_none(x):
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_nan_to_none(v) for v in x]
    return x


# ------------------------------------------------------------------------------ memory (Linux)


def _status_kib(field: str) -> int | None:
    try:
        m = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    except OSError:
        return None
    return int(m.group(1)) if m else None


def current_rss_mb() -> float | None:
    """Resident memory of this process now, MiB (None off Linux)."""
    kib = _status_kib("VmRSS")
    return None if kib is None else kib / 1024


def peak_rss_mb() -> float | None:
    """Peak resident memory of this process since start or the last :func:`reset_peak_rss`, MiB."""
    kib = _status_kib("VmHWM")
    return None if kib is None else kib / 1024


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (``/proc/self/clear_refs`` = 5); False if not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


# ------------------------------------------------------------------------------ process isolation


def run_worker(script: Path, spec: dict, timeout_s: float = 600) -> dict:
    """Run ``script --worker '<spec json>'`` in a fresh Python and return the JSON it prints last.

    A crash, a timeout or unreadable output comes back as ``{"error": "..."}`` so one failed
    measurement never stops a benchmark run.
    """
    cmd = [sys.executable, str(script), "--worker", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"worker timed out after {timeout_s:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": f"worker exit {proc.returncode}: " + " / ".join(tail)}
    return json.loads(lines[-1])


def worker_main(argv: Sequence[str], measure: Callable[[dict], dict]) -> bool:
    """If ``argv`` is ``--worker <json>``, run ``measure(spec)``, print its JSON, return True."""
    if len(argv) >= 2 and argv[0] == "--worker":
        print(json.dumps(_nan_to_none(measure(json.loads(argv[1])))), flush=True)
        return True
    return False


def int_list(text: str) -> list[int]:
    """argparse type: ``"1024,2048"`` -> ``[1024, 2048]``; accepts ``k``/``M`` suffixes (10k, 1M)."""
    out = []
    for part in text.split(","):
        p = part.strip().lower()
        mult = 1_000_000 if p.endswith("m") else 1000 if p.endswith("k") else 1
        try:
            value = int(float(p.rstrip("km")) * mult)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{part!r} is not a number; write e.g. 1024,2048 or 10k,1M"
            ) from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{part!r} must be positive")
        out.append(value)
    return out


def no_cuda_message(tool: str, what: str, how: str) -> str | None:
    """None when CUDA is usable, else the one line a GPU script prints before exiting cleanly.

    ``tool``: the script's name; ``what``: what did not happen ("nothing was run"); ``how``: how
    to run it on a CUDA machine.
    """
    try:
        import torch
    except ImportError as err:
        return f"{tool}: torch does not import ({err}); {what}."
    if torch.cuda.is_available():
        return None
    return (f"{tool}: CUDA is not available here (torch {torch.__version__}, CUDA build: "
            f"{torch.version.cuda or 'no'}); {what}. {how}")
