"""The step plan: how one step's examples are dealt to data-parallel ranks and micro-batches, checked first.

Every rank builds the same example stream, so the global batch of step ``s`` is
``examples[s*E : (s+1)*E]`` whatever the world size. :func:`plan_step` splits it:

- ``balance="none"``: the step's E examples are cut into ``R*M`` near-equal contiguous shards (``R``
  ranks, ``M`` micro-batches per rank); shard ``m*R + r`` is micro-batch ``m`` of rank ``r`` (the
  order accelerate's sharded dataloader uses), and each rank packs its own shards;
- ``balance="round_robin" | "tokens" | "attention"``: the step is packed once (every rank computes the
  same packing) and its packs are dealt to ranks by :func:`packsim.scaling.rank_balance.assign`; a
  rank's packs are then cut into M micro-batches (``select_rows`` takes rows out of a batch).

It returns the micro-batches ``[r][m]`` (``PackedBatch`` of (B, T) rows, or None when that
micro-batch got no example) and every rank's packs as segment lengths (their costs).
:func:`validate` runs every check that can fail before any process group or training starts:
a world size larger than the examples per step, a rank with no pack, an unknown normalisation.
(The example stream is :func:`packsim.experiment.data_designs.make_data`; the rank and world size,
:func:`packsim.scaling.launch_env.world`.)

Lessons: 10.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from packsim.core.batch import PackedBatch
from packsim.core.errors import PacksimError
from packsim.core.segments import Segment, cu_seqlens_from_lengths
from packsim.core.setups import get_setup
from packsim.experiment.training import TrainConfig, make_batches
from packsim.scaling.normalisation import NORMALISATIONS
from packsim.scaling.rank_balance import METHODS, assign

__all__ = ["BALANCE", "select_rows", "plan_step", "validate"]

BALANCE = ("none", *METHODS)


def _shards(n: int, world_size: int, grad_accum: int) -> list[list[np.ndarray]]:
    """Example indices [r][m] of the step: shard m*R + r of R*M near-equal contiguous shards."""
    parts = np.array_split(np.arange(n), world_size * grad_accum)
    return [[parts[m * world_size + r] for m in range(grad_accum)] for r in range(world_size)]


def select_rows(batch: PackedBatch, rows: list[int]) -> PackedBatch:
    """The rows ``rows`` of a batch as a batch of their own (segments and cu_seqlens rebuilt)."""
    idx = torch.tensor(rows, dtype=torch.long)
    new_row = {r: i for i, r in enumerate(rows)}
    segs = sorted((Segment(new_row[s.row], s.start, s.stop, s.example) for s in batch.segments if s.row in new_row),
                  key=lambda s: (s.row, s.start))
    lens = torch.tensor([s.stop - s.start for s in segs])
    cu = cu_seqlens_from_lengths(lens)  # (S+1,)
    names = ("input_ids", "labels", "position_ids", "seq_ids", "roles", "example_positions")
    return replace(batch, **{k: getattr(batch, k)[idx] for k in names}, cu_seqlens=cu,
                   max_seqlen=int(lens.max()), segments=segs)


def plan_step(step_examples: list, cfg: TrainConfig, setup, world_size: int, grad_accum: int,
              balance: str = "none") -> tuple[list[list[PackedBatch | None]], list[list[list[int]]]]:
    """Micro-batches [r][m] (None: no example) and each rank's packs as segment lengths [r][pack].

    Every rank can compute the whole plan; the training loop builds only its own row of it.
    Raises :class:`PacksimError` when a rank would get no pack.
    """
    setup = get_setup(setup)
    if balance not in BALANCE:
        raise PacksimError(f"unknown --balance {balance!r}: use one of {list(BALANCE)}.")
    if balance == "none":
        micro = [[PackedBatch.from_examples([step_examples[i] for i in idx], cfg.capacity, setup, cfg.strategy)
                  if len(idx) else None for idx in shards] for shards in _shards(len(step_examples), world_size,
                                                                                  grad_accum)]
        packs = [[p for b in mbs if b is not None for p in b.row_lengths()] for mbs in micro]
        return micro, packs
    full = make_batches(step_examples, cfg.capacity, setup, len(step_examples), cfg.strategy)[0]
    all_packs = full.row_lengths()
    ranks = assign(all_packs, world_size, balance)  # raises if a rank would have no pack
    micro = [[select_rows(full, [int(i) for i in part]) if len(part) else None
              for part in np.array_split(np.asarray(mine), grad_accum)] for mine in ranks]
    return micro, [[all_packs[i] for i in mine] for mine in ranks]


def validate(n_examples: int, cfg: TrainConfig, world_size: int, grad_accum: int, normalise: str,
             balance: str, data: list | None = None) -> None:
    """Every check that can fail, before any process group or training starts (one clear line each)."""
    if normalise not in NORMALISATIONS:
        raise PacksimError(f"unknown --normalise {normalise!r}: use one of {list(NORMALISATIONS)} "
                           "(global matches one process; local and mean are the common mistakes).")
    if balance not in BALANCE:
        raise PacksimError(f"unknown --balance {balance!r}: use one of {list(BALANCE)}.")
    for name, value in (("--steps", cfg.steps), ("--examples-per-step", cfg.examples_per_step),
                        ("--grad-accum", grad_accum), ("world size", world_size)):
        if value < 1:
            raise PacksimError(f"{name} must be >= 1, got {value}.")
    if world_size > cfg.examples_per_step:
        raise PacksimError(
            f"world size {world_size} is larger than --examples-per-step {cfg.examples_per_step}: every "
            "rank needs at least one example per step; raise --examples-per-step or use fewer processes."
        )
    if n_examples < cfg.steps * cfg.examples_per_step:
        raise PacksimError(f"{cfg.steps} steps x {cfg.examples_per_step} examples need "
                           f"{cfg.steps * cfg.examples_per_step} examples, got {n_examples}.")
    if data is not None:
        longest = max(len(ex.tokens) for ex in data[: cfg.steps * cfg.examples_per_step])
        if longest > cfg.capacity:
            raise PacksimError(f"an example has {longest} tokens but --capacity is {cfg.capacity}: raise "
                               f"--capacity to at least {longest}.")
    if data is not None and balance != "none":
        E = cfg.examples_per_step
        for s in range(cfg.steps):
            try:
                plan_step(data[s * E : (s + 1) * E], cfg, "correct", world_size, grad_accum, balance)
            except PacksimError as err:
                raise PacksimError(f"step {s + 1}: {err}") from None
