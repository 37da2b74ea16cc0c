"""Reference solution for notebook 00_start_here (checked by packsim.course.exercises.lesson00_start_here)."""

from __future__ import annotations


def padding_share(batch) -> float:
    """Share of the (B, T) slots of ``batch`` that hold padding."""
    padding = ~batch.real_mask  # (B, T) bool
    return padding.sum().item() / padding.numel()
