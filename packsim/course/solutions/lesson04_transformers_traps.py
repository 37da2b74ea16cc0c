"""Reference solution to the exercise of notebook 04_transformers_traps (check: packsim.course.exercises.lesson04_transformers_traps)."""

from __future__ import annotations

import torch


def position_ids_from_lengths(lengths: list[int]) -> torch.Tensor:
    """Example lengths -> position ids (sum(lengths),) long that restart at 0 in every example."""
    return torch.cat([torch.arange(n) for n in lengths])
