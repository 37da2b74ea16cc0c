"""Reference solutions to the exercises of notebook 03_block_diagonal (checks: packsim.course.exercises.lesson03_block_diagonal)."""

from __future__ import annotations

import torch


def cu_seqlens_from_lengths(lengths: list[int]) -> torch.Tensor:
    """Example lengths -> offsets (S+1,) int32: [0, l0, l0+l1, ..., total]."""
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    offsets[1:] = torch.cumsum(torch.tensor(lengths), dim=0)  # cumsum is int64; assignment casts
    return offsets


def block_causal_mask(seq_ids: torch.Tensor) -> torch.Tensor:
    """Sequence id per token (T,), -1 = padding -> (T, T) bool, True where query i may see key j."""
    T = seq_ids.shape[0]
    same = seq_ids[:, None] == seq_ids[None, :]  # (T, T) same example
    real = seq_ids >= 0  # (T,) not padding
    causal = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T) key j <= query i
    return same & causal & real[:, None] & real[None, :]
