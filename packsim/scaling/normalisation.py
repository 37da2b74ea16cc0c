"""Loss normalisation across data-parallel ranks and gradient-accumulation micro-batches (lesson 10).

One optimiser step of data-parallel training sees ``R`` ranks x ``M`` micro-batches. Micro-batch
``m`` of rank ``r`` holds ``counts[r, m]`` counted targets (response tokens and EOS under a
completion-only loss) whose per-token losses add up to ``sums[r, m]``. Both are ``(R, M)``
tensors. Every kind here is a *weight* per micro-batch, ``weights(counts) -> (R, M)``, and the
step's objective is ``(weights * sums).sum()``.

The kinds (:data:`NORMALISATIONS`, the values of ``packsim train --normalise``) speak the
vocabulary of one process: each is one of :data:`packsim.core.loss.MICRO_BATCH_REDUCTIONS`
(``token_mean``: summed losses over summed counts; ``mean_of_means``: each micro-batch's own mean,
averaged) applied over the whole ``step`` (all ``R * M`` micro-batches), or over each ``rank``'s
``M`` micro-batches and then averaged over the ranks (what DDP's gradient average does):

======  ==================  ====================================  ==================================
kind    reduction, over     objective                             who does this
======  ==================  ====================================  ==================================
global  token_mean, step    sum of all token losses / all counts  one process; the ``Trainer`` with
                                                                  ``average_tokens_across_devices``
local   token_mean, rank    mean over ranks of each rank's        the ``Trainer`` without it
                            per-token mean
mean    mean_of_means,      mean over ranks and micro-batches of  a per-micro-batch ``"mean"`` loss
        rank                each micro-batch's per-token mean     divided by the accumulation steps
======  ==================  ====================================  ==================================

Only ``global`` gives every counted token the same weight whatever rank and micro-batch it
landed in, so only ``global`` reproduces the one-process run. ``local`` and ``mean`` agree with it
exactly when every rank (and micro-batch) holds the same number of counted targets.

A micro-batch with no counted target weighs 0 under every kind, so it contributes exactly zero
(never 0/0 = NaN), and a step with no counted target at all gives an all-zero weight. (A real
per-micro-batch mean of such a micro-batch is NaN; ``mean`` here counts it as 0 but still divides
by ``M``.)

DistributedDataParallel *averages* gradients over the ``R`` ranks, so a rank that wants the
objective's gradient calls ``backward`` on ``sums[r, m] * weights[r, m] * R``:
:func:`backward_scales` returns those factors.

Lessons: 10.
"""

from __future__ import annotations

import torch

from packsim.core.errors import PacksimError
from packsim.core.loss import micro_batch_weights

__all__ = ["NORMALISATIONS", "weights", "objective", "backward_scales"]

# kind -> (the one-process reduction it applies, over the whole "step" or each "rank" then averaged)
NORMALISATIONS = {"global": ("token_mean", "step"), "local": ("token_mean", "rank"),
                  "mean": ("mean_of_means", "rank")}


def _check(counts, kind: str) -> torch.Tensor:
    if kind not in NORMALISATIONS:
        raise PacksimError(f"unknown normalisation {kind!r}: use one of {list(NORMALISATIONS)} "
                           "(global is the one that matches a single process).")
    counts = torch.as_tensor(counts)
    if counts.dim() != 2 or counts.numel() == 0:
        raise PacksimError(f"counts must be a non-empty (ranks, micro_batches) table, got shape "
                           f"{tuple(counts.shape)}: one row per rank, one column per micro-batch.")
    if bool((counts < 0).any()):
        raise PacksimError("counts must be >= 0 (numbers of counted targets per micro-batch).")
    return counts.to(torch.float64)


def weights(counts, kind: str = "global") -> torch.Tensor:
    """Weight of each micro-batch's summed token loss: counts (R, M) -> (R, M) float64.

    ``global``: ``1 / counts.sum()``; ``local``: ``1 / (R * counts[r].sum())``;
    ``mean``: ``1 / (R * M * counts[r, m])``. 0 wherever the count it divides by is 0.
    Each is :func:`packsim.core.loss.micro_batch_weights` of its reduction over its group of cells.
    """
    n = _check(counts, kind)  # (R, M)
    R, M = n.shape
    reduction, over = NORMALISATIONS[kind]
    if over == "step":  # one reduction over all R*M micro-batches
        return micro_batch_weights(n.reshape(1, R * M), reduction).view(R, M)
    return micro_batch_weights(n, reduction) / R  # each rank's own reduction, then DDP's average over R


def objective(sums, counts, kind: str = "global") -> torch.Tensor:
    """The step's loss under ``kind``: sums, counts (R, M) -> scalar float64 (0 if nothing is counted)."""
    w = weights(counts, kind)
    sums = torch.as_tensor(sums, dtype=torch.float64)
    if sums.shape != w.shape:
        raise PacksimError(f"sums {tuple(sums.shape)} and counts {tuple(w.shape)} must have the same "
                           "(ranks, micro_batches) shape.")
    return (w * sums).sum()


def backward_scales(counts, kind: str = "global") -> torch.Tensor:
    """Factor rank r multiplies micro-batch m's summed token loss by before ``backward`` (R, M).

    DistributedDataParallel averages gradients over the R ranks, so the factor is ``R`` times the
    weight: under ``global`` every entry is ``R / counts.sum()``.
    """
    w = weights(counts, kind)
    return w * w.shape[0]
