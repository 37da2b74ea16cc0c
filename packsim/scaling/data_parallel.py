"""The data-parallel step (lesson 10): what each rank runs so R ranks compute what one process computes.

Each rank holds the whole model (wrapped in ``DistributedDataParallel``) and M micro-batches of the
step's examples (:mod:`packsim.scaling.step_plan` deals them). :func:`data_parallel_step`:

1. counts this rank's targets per micro-batch and shares them in ONE all-reduce of an ``(R, M)``
   table, so every rank knows the step's global count;
2. runs each micro-batch and takes the **sum** of its token losses (not a mean);
3. multiplies that sum by :func:`packsim.scaling.normalisation.backward_scales` before
   ``backward()``: under ``global``, ``R / total count``, since DDP then *averages* gradients over
   the R ranks (it all-reduces only after the last micro-batch: ``no_sync`` before);
4. clips and updates (:func:`packsim.experiment.training.optimizer_step`).

Under ``global`` the gradient, and so every weight, equals the one-process run's up to float
summation order; ``local`` and ``mean`` divide by per-rank or per-micro-batch counts and drift.
A micro-batch with no counted target (a rank with fewer packs than micro-batches) still runs a
forward and backward on a padding-only pack (:func:`train_data_parallel` makes it), so DDP stays
in step; it contributes 0. ``packsim train`` is the command around it (:mod:`packsim.scaling.train_command`).

Lessons: none directly (lesson 10 writes this step out as a loop, then runs it in ``packsim train``).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from packsim.core.batch import PackedBatch
from packsim.core.device import model_device
from packsim.core.loss import IGNORE_INDEX, count_targets, token_losses
from packsim.core.model import forward
from packsim.core.setups import get_setup
from packsim.experiment.results import RunResult, StepRecord
from packsim.experiment.training import TrainConfig, autocast, make_optimizer, optimizer_step
from packsim.scaling.launch_env import world
from packsim.scaling.normalisation import backward_scales, weights
from packsim.scaling.rank_balance import pack_costs, straggler_ratio
from packsim.scaling.step_plan import plan_step, select_rows, validate

__all__ = ["StepOutput", "data_parallel_step", "train_data_parallel"]


@dataclass
class StepOutput:
    """What one rank's step measured: the step's counts (R, M) and, per micro-batch of this rank,
    its summed token loss (M,) and its logits (B, T, V), detached."""

    counts: torch.Tensor
    summed: torch.Tensor
    logits: list[torch.Tensor]


def data_parallel_step(net, opt, micro_batches: list[PackedBatch], step: int, cfg: TrainConfig,
                       normalise: str = "global") -> StepOutput:
    """One optimiser step of this rank on its micro-batches (B, T) each; ``net`` is the (DDP) model."""
    rank, R = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    M, device = len(micro_batches), model_device(net)
    counts = torch.zeros(R, M, dtype=torch.float64, device=device)  # nccl reduces device tensors only
    counts[rank] = torch.tensor([float(count_targets(b.labels)) for b in micro_batches], dtype=torch.float64)
    if R > 1:
        dist.all_reduce(counts)  # (R, M): every rank's counted targets, the same table on every rank
    counts = counts.cpu()
    scale = backward_scales(counts, normalise)[rank]  # (M,): under "global", R / counts.sum()
    opt.zero_grad(set_to_none=True)
    summed, logits = torch.zeros(M, dtype=torch.float64), []
    for m, batch in enumerate(micro_batches):
        with _sync_gradients(net, last=m == M - 1):
            with autocast(device):
                out = forward(net, batch, cfg.backend)  # (B, T, V)
            loss_sum = token_losses(out.float(), batch.labels).sum()  # a SUM over counted targets
            (loss_sum * float(scale[m])).backward()  # then DDP averages the gradients over R ranks
        summed[m] = float(loss_sum.detach())
        logits.append(out.detach())
    optimizer_step(net, opt, step, cfg)
    return StepOutput(counts, summed, logits)


def _sync_gradients(net, last: bool):
    """DDP all-reduces gradients in the backward of the last micro-batch only (``no_sync`` before)."""
    return net.no_sync() if isinstance(net, DistributedDataParallel) and not last else nullcontext()


def _empty_like(batch: PackedBatch) -> PackedBatch:
    """A one-row pack with no counted target (labels all -100): an empty micro-batch's stand-in."""
    one = select_rows(batch, [0])
    return replace(one, labels=torch.full_like(one.labels, IGNORE_INDEX))


def train_data_parallel(model, examples: list, setup="correct", cfg: TrainConfig | None = None, seed: int = 0,
                        grad_accum: int = 1, normalise: str = "global", balance: str = "none",
                        callback=None, data: str = "tasks") -> RunResult:
    """Train ``model`` in place on this rank's share of every step; returns the run (same on every rank).

    Called plainly it is the one-process run; under a launcher the process group must already be
    initialised (``packsim train`` does it). Each step: :func:`data_parallel_step`, then the
    step's metrics (the loss it optimised, the response loss, tokens/s, straggler ratios).
    """
    cfg = cfg or TrainConfig()
    setup = get_setup(setup)
    rank, world_size, _ = world() if dist.is_initialized() else (0, 1, 0)
    validate(len(examples), cfg, world_size, grad_accum, normalise, balance)
    device = model_device(model)
    torch.manual_seed(seed)
    model.train()
    ids = [device.index] if device.type == "cuda" else None  # one device per process
    net = DistributedDataParallel(model, device_ids=ids) if world_size > 1 else model
    opt = make_optimizer(model, cfg)
    run = RunResult(setup=setup.name, seed=seed, data=data)
    E, M, R = cfg.examples_per_step, grad_accum, world_size
    elapsed, start = 0.0, time.perf_counter()
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        micro, packs = plan_step(examples[step * E : (step + 1) * E], cfg, setup, R, M, balance)
        real_mb = [b is not None for b in micro[rank]]
        filler = _empty_like(next(b for b in micro[rank] if b is not None))
        mine = [(b if b is not None else filler).to(device) for b in micro[rank]]  # (B_m, T) each
        done = data_parallel_step(net, opt, mine, step, cfg, normalise)
        table, w = done.counts, weights(done.counts, normalise)
        sums = torch.zeros(4, dtype=torch.float64, device=device)  # objective part, response loss, count, padded
        sums[0] = float((done.summed * w[rank]).sum())
        for batch, logits, real in zip(mine, done.logits, real_mb, strict=True):
            if real:  # the stand-in of an empty micro-batch has no response, no tokens
                response = batch.completion_labels  # (B, T)
                sums[1] += float(token_losses(logits.float(), response).sum())
                sums[2] += count_targets(response)
                sums[3] += float(batch.input_ids.numel())
        if R > 1:
            dist.all_reduce(sums)
        dt = time.perf_counter() - t0
        elapsed += dt
        costs = [pack_costs(p) for p in packs]
        real = sum(int(c["tokens"].sum()) for c in costs)
        values = {
            "reported_loss": float(sums[0]),
            "response_loss": float(sums[1] / sums[2]) if sums[2] > 0 else 0.0,
            "real_tokens": real,
            "real_tokens_per_s": real / dt,
            "padded_tokens_per_s": float(sums[3]) / dt,
            "elapsed_s": elapsed,
            "targets": int(table.sum()),
            "straggler_tokens": straggler_ratio([c["tokens"].sum() for c in costs]),
            "straggler_attention": straggler_ratio([c["attention"].sum() for c in costs]),
        }
        record = StepRecord("train", setup.name, seed, step + 1, values)
        run.add(record)
        run.extra.setdefault("targets", []).append(table.tolist())  # (R, M) counted targets per step
        if callback is not None:
            callback(record)
    model.eval()
    train = run.curves["train"]
    tail = min(20, cfg.steps)
    run.final = {k: sum(train[k][-tail:]) / tail for k in ("reported_loss", "response_loss")}
    run.final["train_time_s"] = elapsed
    run.wall_s = time.perf_counter() - start
    run.extra.update(world_size=R, grad_accum=M, normalise=normalise, balance=balance)
    return run
