"""``packsim train``'s options, apart from the command so that ``packsim train --help`` and a bad
option answer without importing torch (:mod:`packsim.cli` reads them from here; the run is
:mod:`packsim.scaling.train_command`, which checks their values before any process starts).

Lessons: none directly (lesson 10 runs ``packsim train``).
"""

from __future__ import annotations

import argparse

__all__ = ["OPTIONS", "add_arguments"]

# the options each torchrun rank gets back as command-line words (``--nproc`` and ``--quiet`` apart)
OPTIONS = ("setup", "steps", "examples_per_step", "grad_accum", "seed", "out", "normalise", "balance",
           "data", "capacity", "lr", "model_size", "engine", "device")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``packsim train`` options (values are checked by the command, before any process group starts)."""
    p.add_argument("--setup", default="correct", help="setup preset or mask+positions+loss (default: correct)")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    p.add_argument("--examples-per-step", type=int, default=32, help="global examples per step, all ranks (default 32)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per rank per step (default 1)")
    p.add_argument("--seed", type=int, default=0, help="data and model seed (default 0)")
    p.add_argument("--normalise", default="global",
                   help="global (count over ranks and micro-batches: right), local (per-rank count), "
                        "mean (mean of per-micro-batch means); default global")
    p.add_argument("--balance", default="none", help="none (each rank packs its share of the examples), or pack "
                   "the step once and deal packs by round_robin, tokens or attention (default none)")
    p.add_argument("--data", default="tasks", help="tasks (default) or long_tailed (unequal response counts)")
    p.add_argument("--capacity", type=int, default=256, help="tokens per pack (default 256)")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default 2e-3)")
    p.add_argument("--model-size", default="tiny", help="tiny (default) or small")
    p.add_argument("--engine", default="packsim", help="packsim (this DDP loop, default) or trainer "
                   "(transformers Trainer + PackingCollator; normalise global/local/mean)")
    p.add_argument("--device", default=None, help="cpu, cuda (default: packsim.get_device(); rank i uses cuda:i)")
    p.add_argument("--nproc", type=int, default=None, help="launch N processes through torchrun (same as "
                   "`python -m torch.distributed.run --standalone --nproc_per_node N -m packsim train ...`)")
    p.add_argument("--out", default="runs/train", help="output folder (default runs/train)")
    p.add_argument("--quiet", action="store_true", help="no per-step lines")
