"""The one GPU check (``make gpu-check``): GPU tests, packsim's reference kernels against the real
ones, attention kernels, packed vs padded training and the compare experiment on one CUDA GPU, in
under 10 minutes, into one JSON file.

    python benchmarks/gpu_check.py            # writes benchmarks/results/gpu_check.json
    python benchmarks/gpu_check.py --plan     # the parts, their commands and budgets (no GPU needed)

For a CUDA machine with torch (+ triton) and transformers installed; flash-attn (and causal-conv1d,
mamba-ssm, flash-linear-attention for the reference kernels) is measured when it imports. packsim comes from this checkout: nothing is installed. Each part runs in its own
process group with its own time budget; a part that runs over is stopped and reported, and the
next part still runs:

1. ``tests`` (90 s): ``python -m pytest -m gpu`` on the test files that hold GPU tests (every
   kernel in bf16 against float32, the model's backends, ``auto`` picking a kernel). Needs
   pytest; without it the part says so and the others run.
2. ``reference_kernels`` (90 s): ``benchmarks/reference_kernels.py``: each packsim reference
   kernel (flash, causal conv1d, Mamba2 scans, gated delta rule) against the real package where
   it imports, in bf16, fp16 and fp32 (max abs / rel error), else against a torch path on CUDA,
   saying which; then the isolation verdicts of a packed tiny Llama on transformers' flash path
   and a tiny Bamba with ``seq_idx``, on the reference and, where present, the real kernels.
3. ``kernels`` (240 s): ``benchmarks/gpu.py`` at N = 4k, 16k and 64k tokens: flash-attn (when
   it imports), torch's ``varlen_attn``, FlexAttention with a document BlockMask, SDPA with a
   dense mask, packsim's ``blocked`` path and the causal (buggy) mask; bf16 forward and forward +
   backward, each checked against a float32 reference; then the model trained packed vs padded
   on the same examples (real tokens/s). Its own budget skips what would start too late.
4. ``compare`` (120 s): ``packsim compare --fast --device cuda``: the buggy and the correct
   setup trained side by side; isolated exact match and reported loss. Without plotly compare
   still runs and writes results.json; it skips report.html and says so in one line.

``gpu_check.json`` holds the machine, then for each part its command, status, time, output tail
and results (gpu.py's and reference_kernels.py's whole JSON, compare's ``results.json``, the test
counts); it is rewritten
after each part. The parts' own files go to ``runs/gpu-check/`` (git-ignored). The summary table
prints last. Exit status: 0 when every part that ran passed, 1 when a part failed or ran over its
budget. Without CUDA: one line saying so, exit status 0, nothing run or written.

``--device cpu`` runs the same orchestration with tiny settings to check this script's logic;
those are not GPU numbers.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import benchutil as bu

ROOT = bu.ROOT
PARTS = ("tests", "reference_kernels", "kernels", "compare")
# 540 s: under 10 min with start-up (before the reference kernels: 450 s, under 8 min)
BUDGET_S = {"tests": 90.0, "reference_kernels": 90.0, "kernels": 240.0, "compare": 120.0}
CPU_BUDGET_SCALE = 4.0  # --device cpu (logic check) on a small shared CPU: same parts, more time
KILL_GRACE_S = 10.0
TAIL_LINES = 60
KERNEL_SIZES = "4096,16384,65536"
REFERENCE_MARGIN_S = 25  # reference_kernels.py's own budget leaves this for its imports and last case
# what each part writes under --work, read back into gpu_check.json
RESULT_FILES = {"tests": "tests.xml", "reference_kernels": "reference_kernels/reference_kernels.json",
                "kernels": "kernels/gpu.json", "compare": "compare/results.json"}


# ------------------------------------------------------------------------------ arguments, plan


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", action="store_true", help="print the parts and their commands, then exit")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma list from {','.join(PARTS)}")
    ap.add_argument("--out", help="folder for gpu_check.json (default benchmarks/results)")
    ap.add_argument("--work", help="folder for the parts' own files (default runs/gpu-check)")
    ap.add_argument("--device", default="cuda",
                    help="cuda (default); 'cpu' only checks this script's logic with tiny settings")
    args = ap.parse_args(argv)
    args.parts = bu.parse_paths(ap, args.parts, PARTS)
    return args


def gpu_test_files() -> list[str]:
    """The test files holding ``@pytest.mark.gpu`` tests (relative to the repository)."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                  if "pytest.mark.gpu" in p.read_text(encoding="utf-8"))


def part_commands(args, work: Path) -> dict[str, list[str]]:
    """The command of every part, run from the repository root."""
    py = sys.executable
    cpu = args.device == "cpu"
    kernels = [py, "benchmarks/gpu.py", "--device", args.device, "--out", str(work / "kernels")]
    kernels += (["--sizes", "256", "--paths", "sdpa_dense,blocked,causal", "--heads", "2",
                 "--head-dim", "16", "--iters", "1", "--no-train"] if cpu else
                ["--sizes", KERNEL_SIZES, "--iters", "5", "--steps", "5",
                 "--budget-s", str(int(BUDGET_S["kernels"] - 70))])  # imports, the last call
    reference = [py, "benchmarks/reference_kernels.py", "--device", args.device, "--out",
                 str(work / "reference_kernels")]
    reference += (["--tiny", "--dtypes", "bfloat16,float32", "--budget-s", "300"] if cpu else
                  ["--budget-s", str(int(BUDGET_S["reference_kernels"] - REFERENCE_MARGIN_S))])
    compare = [py, "-m", "packsim", "compare", "--fast", "--device", args.device, "--quiet",
               "--out", str(work / "compare")]
    if cpu:
        compare += ["--steps", "2", "--examples-per-step", "16", "--n-test", "8",
                    "--throughput-steps", "1", "--jobs", "1"]
    tests = [py, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
             f"--junitxml={work / 'tests.xml'}", *gpu_test_files()]
    return {"tests": tests, "reference_kernels": reference, "kernels": kernels, "compare": compare}


def budgets(args) -> dict[str, float]:
    """Seconds each part may run (:data:`BUDGET_S`; scaled up for the CPU logic check)."""
    scale = CPU_BUDGET_SCALE if args.device == "cpu" else 1.0
    return {p: BUDGET_S[p] * scale for p in args.parts}


def plan(args, work: Path) -> list[str]:
    cmds, budget = part_commands(args, work), budgets(args)
    lines = [f"gpu_check: {len(args.parts)} part(s), {sum(budget.values()):.0f} s of budget in all "
             "(each part is stopped at its budget)"]
    for p in args.parts:
        lines.append(f"  {p:17s} {budget[p]:4.0f} s  {' '.join(cmds[p])}")
    return lines


def no_cuda_message() -> str | None:
    """None when CUDA is usable, else the one line to print before exiting (benchutil)."""
    return bu.no_cuda_message("gpu_check", "nothing was run", "Run it on a CUDA machine.")


# ------------------------------------------------------------------------------ running one part


def run_part(cmd: list[str], budget_s: float, name: str, env: dict) -> dict:
    """Run ``cmd`` in its own process group, echoing its output; stop it at ``budget_s``.

    Returns ``{"returncode", "wall_s", "over_budget", "tail"}`` (the last output lines).
    """
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", start_new_session=True)
    except OSError as err:
        return {"returncode": None, "wall_s": 0.0, "over_budget": False, "tail": [str(err)]}

    def echo():
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            print(f"[{name}] {line}", end="", flush=True)

    reader = threading.Thread(target=echo, daemon=True)
    reader.start()
    over = False
    try:
        proc.wait(timeout=budget_s)
    except subprocess.TimeoutExpired:
        over = True
        for sig in (signal.SIGTERM, signal.SIGKILL):  # the whole group: compile workers too
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=KILL_GRACE_S)
                break
            except subprocess.TimeoutExpired:
                continue
    reader.join(timeout=5)
    return {"returncode": proc.returncode, "wall_s": time.perf_counter() - t0, "over_budget": over,
            "tail": list(tail)}


def status_of(run: dict) -> str:
    """``ok`` / ``over budget`` / ``missing <module>`` / ``no tests`` / ``failed (exit N)``."""
    if run["over_budget"]:
        return "over budget"
    if run["returncode"] == 0:
        return "ok"
    for line in reversed(run["tail"]):
        m = re.search(r"No module named '?([\w.]+)'?", line)
        if m:
            return f"missing {m.group(1).split('.')[0]}"
    if run["returncode"] == 5 and any("no tests ran" in ln for ln in run["tail"]):
        return "no tests"
    return f"failed (exit {run['returncode']})"


# ------------------------------------------------------------------------------ reading results


def junit_counts(xml_path: Path) -> dict | None:
    """``{"tests", "passed", "failed", "errors", "skipped", "failures": [names]}`` from JUnit XML."""
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError):
        return None
    counts = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    for suite in ([root] if root.tag == "testsuite" else root.iter("testsuite")):
        for k in counts:
            counts[k] += int(suite.get(k, 0))
    failed = [f"{c.get('classname', '')}::{c.get('name', '')}" for c in root.iter("testcase")
              if c.find("failure") is not None or c.find("error") is not None]
    return {"tests": counts["tests"], "failed": counts["failures"], "errors": counts["errors"],
            "skipped": counts["skipped"],
            "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
            "failures": failed}


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def kernel_summary(gpu: dict | None) -> str:
    """One line from gpu.py's JSON: fwd+bwd time per path at the largest N, and the checks."""
    if not gpu:
        return "no gpu.json"
    rows = gpu.get("attention", [])
    checks = collections.Counter(r.get("check", "?") for r in rows)
    timed = [r for r in rows if (r.get("fwd_bwd_s") or {}).get("n")]
    parts = []
    if timed:
        n = max(r["n"] for r in timed)
        times = ", ".join(f"{r['path']} {bu.fmt_num(r['fwd_bwd_s']['median'] * 1e3)}"
                          for r in timed if r["n"] == n)
        parts.append(f"fwd+bwd ms at N={n:,}: {times}")
    parts.append("checks: " + ", ".join(f"{k} {v}" for k, v in sorted(checks.items())))
    if not gpu.get("complete", True):
        parts.append("incomplete (stopped)")
    return "; ".join(parts)


def training_summary(gpu: dict | None) -> str:
    t = (gpu or {}).get("training")
    if not t:
        return "not run" + (f": {s}" if (s := "; ".join((gpu or {}).get("skipped", []))) else "")
    return (f"packed / padded real tokens/s {bu.fmt_spread(t['ratio'])} per step "
            f"(padding {t['padded']['pad_fraction']:.0%} vs {t['packed']['pad_fraction']:.0%}; "
            f"{t['padded']['real_tokens_per_s']:,.0f} vs {t['packed']['real_tokens_per_s']:,.0f} tokens/s)")


def compare_summary(results: dict | None) -> str:
    """Per setup: isolated exact match and reported loss (means over seeds), from results.json."""
    if not results:
        return "no results.json"
    by_setup: dict[str, list[dict]] = {}
    for run in results.get("runs", []):
        by_setup.setdefault(run["setup"], []).append(run.get("final", {}))

    def mean(finals, key):
        vals = [f[key] for f in finals if f.get(key) is not None]
        return bu.fmt_num(sum(vals) / len(vals)) if vals else "-"

    return "; ".join(f"{s}: isolated exact match {mean(f, 'isolated_exact_match')}, reported loss "
                     f"{mean(f, 'reported_loss')}" for s, f in by_setup.items())


def reference_summary(data: dict | None) -> tuple[str, str]:
    """Two lines from reference_kernels.py's JSON: the kernel checks per section (against what), the verdicts."""
    if not data:
        return "no reference_kernels.json", "no reference_kernels.json"
    kernels = []
    for name, section in data.get("sections", {}).items():
        checks = collections.Counter(r["check"].split(":")[0] for r in section["rows"])
        worst = max((r.get("max_rel") or 0.0 for r in section["rows"]), default=0.0)
        kernels.append(f"{name} [{section['real']}]: " + ", ".join(f"{k} {v}" for k, v in sorted(checks.items()))
                       + f" (max rel {bu.fmt_num(worst)})")
    verdicts = collections.Counter((r["model"].split(" ")[0], r["check"]) for r in data.get("verdicts", []))
    tail = "" if data.get("complete", True) else "; incomplete (stopped)"
    tail += f"; skipped {len(data['skipped'])} (time budget)" if data.get("skipped") else ""
    return ("; ".join(kernels) or "no kernel rows") + tail, (", ".join(
        f"{model} {n} {check}" for (model, check), n in sorted(verdicts.items())) or "no verdicts") + tail


def summary_table(parts: list[dict]) -> str:
    body = []
    for p in parts:
        wall = "-" if p.get("wall_s") is None else f"{p['wall_s']:.0f} / {p['budget_s']:.0f}"
        for label, result in p["lines"]:
            body.append([label, p["status"], wall, result])
    return bu.markdown_table(["part", "status", "time s / budget", "result"], body)


def describe(name: str, work: Path, device: str) -> tuple[dict, list[tuple[str, str]]]:
    """The part's results for the JSON, and its summary lines for the table."""
    if name == "tests":
        counts = junit_counts(work / RESULT_FILES["tests"])
        line = ("no JUnit report" if counts is None else
                f"{counts['passed']} passed, {counts['skipped']} skipped, "
                f"{counts['failed'] + counts['errors']} failed" +
                (f": {', '.join(counts['failures'][:3])}" if counts["failures"] else ""))
        return {"counts": counts}, [("GPU tests (pytest -m gpu)", line)]
    if name == "reference_kernels":
        data = read_json(work / RESULT_FILES["reference_kernels"])
        kernels, verdicts = reference_summary(data)
        return {"reference": data}, [("reference kernels vs real (reference_kernels.py)", kernels),
                                     ("isolation verdicts, reference / real (reference_kernels.py)", verdicts)]
    if name == "kernels":
        gpu = read_json(work / RESULT_FILES["kernels"])
        return {"gpu": gpu}, [("attention kernels, bf16 vs fp32 (gpu.py)", kernel_summary(gpu)),
                              ("training packed vs padded (gpu.py)", training_summary(gpu))]
    results = read_json(work / RESULT_FILES["compare"])
    return {"results": results}, [(f"packsim compare --fast --device {device}", compare_summary(results))]


# ------------------------------------------------------------------------------ main


def main(argv=None) -> int:
    args = parse_args(argv)
    work = Path(args.work) if args.work else ROOT / "runs" / "gpu-check"
    if args.plan:
        print("\n".join(plan(args, work)))
        return 0
    if args.device.startswith("cuda"):
        msg = no_cuda_message()
        if msg:
            print(msg)
            return 0
    else:
        print(f"gpu_check on {args.device}: checking this script's logic only; these are not GPU numbers.")
    import gpu  # benchmarks/gpu.py: the machine description
    import torch

    t_start = time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    out = bu.out_dir(args.out, quick=False) / "gpu_check.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "PACKSIM_FAST": "1"}
    cmds, budget = part_commands(args, work), budgets(args)
    print("\n".join(plan(args, work)), flush=True)
    payload = {
        "benchmark": "gpu_check",
        "command": " ".join(["python benchmarks/gpu_check.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": gpu.gpu_machine_info(torch.device(args.device)),
        "budget_s": budget,
        "parts": [],
        "complete": False,
    }
    for name in args.parts:
        print(f"\n=== {name}: {' '.join(cmds[name])}", flush=True)
        (work / RESULT_FILES[name]).unlink(missing_ok=True)  # never report an earlier run's file
        run = run_part(cmds[name], budget[name], name, env)
        results, lines = describe(name, work, args.device)
        payload["parts"].append({"part": name, "command": cmds[name], "budget_s": budget[name],
                                 "wall_s": run["wall_s"], "returncode": run["returncode"],
                                 "status": status_of(run), "output_tail": run["tail"],
                                 "lines": lines, **results})
        payload["wall_s"] = time.perf_counter() - t_start
        bu.save_json(out, payload)
    payload["complete"] = True
    bu.save_json(out, payload)
    bad = [p["part"] for p in payload["parts"] if p["status"] == "over budget" or p["status"].startswith("failed")]
    print(f"\nwrote {out} ({payload['wall_s']:.0f} s){'; problems in: ' + ', '.join(bad) if bad else ''}\n")
    print(summary_table(payload["parts"]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
