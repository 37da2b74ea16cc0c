"""``packsim compare``: the comparison's command line (options, their checks, the summary).

Every option is checked before any training starts (numbers, setups, device, output folder); bad
input raises :class:`PacksimError`, which :mod:`packsim.cli` prints as one line. Then
:func:`~packsim.experiment.comparison.run_comparison` trains setups x seeds and writes
``DIR/results.json`` and the models; this command adds ``DIR/report.html`` (where plotly is installed; else one line says it was
skipped); the summary table (mean over seeds per setup) prints last. No part of
the command needs plotly. The options import nothing heavy (torch comes with the run), so
``--help`` and a bad option answer at once.

Lessons: none directly (lesson 06 runs the comparison from Python).
"""

from __future__ import annotations

import argparse
import importlib.util

from packsim.core.errors import PacksimError
from packsim.experiment.data_designs import COMPARE_DESIGNS

__all__ = ["add_arguments", "run"]

REPORT_SKIPPED = "report.html skipped: plotly is not installed; pip install plotly to get it"


def plotly_installed() -> bool:
    """Whether report.html can be written: only the report needs plotly, never the runs."""
    return importlib.util.find_spec("plotly") is not None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fast", action="store_true", help="the notebook budget (buggy vs correct, 1 seed, 220 steps); default: full mode")
    p.add_argument("--data", choices=COMPARE_DESIGNS, default="tasks", help="data design (default: tasks)")
    p.add_argument("--setups", help="comma-separated presets or mask+positions+loss combinations "
                   "(default: buggy,correct in fast mode; buggy,correct,mask_fix,loss_fix,padded in full)")
    p.add_argument("--seeds", type=int, help="number of seeds (default: 1 fast, 3 full)")
    p.add_argument("--steps", type=int, help="optimizer steps per run (default: 220 fast, 600 full)")
    p.add_argument("--examples-per-step", type=int, help="examples per step (default 224)")
    p.add_argument("--n-test", type=int, help="held-out examples per test set (default 256 fast, 512 full)")
    p.add_argument("--throughput-steps", type=int, help="steps of the long-tailed throughput measurement")
    p.add_argument("--entities", type=int, help="facts design: number of entities (default 225)")
    p.add_argument("--copies", type=int, help="facts design: copies of each question in a row (default 3)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: packsim.get_device())")
    p.add_argument("--jobs", type=int, help="runs in parallel processes (default: one per CPU core on CPU, 1 on CUDA)")
    p.add_argument("--out", help="output folder (default: runs/<data>-<mode>)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    """``packsim compare``: check every option (setups, numbers, device, output folder), then train."""
    from packsim.core.option_checks import check_at_least, writable_dir

    check_at_least(args, {"--seeds": 1, "--steps": 1, "--examples-per-step": 1, "--n-test": 1,
                          "--throughput-steps": 0, "--entities": 1, "--copies": 1, "--jobs": 1})
    from packsim.core.device import get_device  # torch comes with these: numbers answered first
    from packsim.experiment.comparison import experiment_config, run_comparison

    overrides = {
        k: v
        for k, v in {
            "steps": args.steps,
            "examples_per_step": args.examples_per_step,
            "n_test": args.n_test,
            "throughput_steps": args.throughput_steps,
            "n_entities": args.entities,
            "copies": args.copies,
        }.items()
        if v is not None
    }
    if args.setups is not None:
        overrides["setups"] = [s.strip() for s in args.setups.split(",") if s.strip()]
        if not overrides["setups"]:
            raise PacksimError(f"--setups {args.setups!r} names no setup: e.g. --setups buggy,correct.")
    if args.seeds is not None:
        overrides["seeds"] = list(range(args.seeds))
    if "steps" in overrides and "eval_every" not in overrides:
        overrides["eval_every"] = max(overrides["steps"] // 3, 1)
    cfg = experiment_config(args.data, fast=args.fast or None, **overrides)  # unknown setups raise here
    device = get_device(args.device)
    out = writable_dir(args.out or f"runs/{cfg.data}-{cfg.mode}")
    print(f"packsim compare: {cfg.data} data, {cfg.mode} mode, setups {cfg.setups}, seeds {cfg.seeds}, "
          f"{cfg.train.steps} steps -> {out}", flush=True)
    results = run_comparison(cfg, device=device, out=out, progress=not args.quiet, jobs=args.jobs)
    wrote = [out / "results.json"]
    if plotly_installed():
        from packsim.viz.comparison_report import write_report

        wrote.append(write_report(results, out / "report.html"))
    else:
        print(REPORT_SKIPPED, flush=True)
    from packsim.viz.comparison_report import summary_table

    print(summary_table(results))
    print(f"wrote {' and '.join(map(str, wrote))} in {results.wall_s:.0f} s")
    return 0
