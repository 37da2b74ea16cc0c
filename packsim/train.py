"""Training loop for the tiny model under a setup: same examples, same order, same seed for every setup.

Notebook 05 trains with it. ``make_batches`` cuts the examples into steps of ``examples_per_step``
*before* packing, so every setup (buggy, correct, padded, ...) sees the identical examples in
the identical order and only the setup differs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .batch import PackedBatch
from .loss import packed_cross_entropy
from .model import forward
from .setups import Setup, get_setup

__all__ = ["make_batches", "train_steps"]


def make_batches(
    examples: Sequence,
    capacity: int,
    setup: str | Setup,
    examples_per_step: int,
    strategy: str = "bfd",
    overflow: str = "error",
) -> list[PackedBatch]:
    """One PackedBatch per step from consecutive chunks of ``examples_per_step`` examples."""
    setup = get_setup(setup)
    chunks = [examples[i : i + examples_per_step] for i in range(0, len(examples), examples_per_step)]
    return [PackedBatch.from_examples(c, capacity, setup, strategy=strategy, overflow=overflow) for c in chunks]


def train_steps(
    model,
    batches: Sequence[PackedBatch],
    lr: float = 2e-3,
    seed: int = 0,
    backend: str = "auto",
    callback: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Train one optimizer step per batch; return the loss each step reports (what a user watches).

    The loss is the batch's own labels (its setup's loss mode), normalised per counted token.
    Deterministic on CPU for a given seed and model init.
    """
    torch.manual_seed(seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    device = next(model.parameters()).device
    losses = []
    for step, batch in enumerate(batches):
        batch = batch.to(device)
        loss = packed_cross_entropy(forward(model, batch, backend=backend), batch.labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if callback is not None:
            callback(step, losses[-1])
    model.eval()
    return losses
