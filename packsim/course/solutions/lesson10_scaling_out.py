"""Reference solutions to the exercises of notebook 10_scaling_out (checks: packsim.course.exercises.lesson10_scaling_out)."""

from __future__ import annotations

import torch


def global_loss(sums: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """sums, counts (R, M) -> all token losses / all counted targets; 0 when nothing is counted."""
    total = counts.sum()
    return sums.sum() / total if total > 0 else sums.sum() * 0


def backward_scale(counts: torch.Tensor) -> torch.Tensor:
    """counts (R, M) -> (R, M): R / total, so that DDP's average over R ranks leaves sum / total.

    The library's step applies the same factor: ``packsim.scaling.data_parallel.data_parallel_step``.
    """
    R = counts.shape[0]
    total = counts.sum()
    scale = R / total if total > 0 else 0.0
    return torch.full(counts.shape, float(scale), dtype=torch.float64)
