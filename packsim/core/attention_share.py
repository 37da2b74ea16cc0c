"""The leak, measured: the share of each query's attention that lands on another example's keys.

Shapes: attention probabilities ``attn`` (..., B, H, T, T) (query x key, e.g. ``(L, B, H, T, T)``
from :func:`packsim.core.model.attention_maps`) and ``seq_ids`` (B, T) long, -1 on padding (see
:mod:`packsim.core.segments`). :func:`outside_share` gives one share per query, (..., B, H, T);
:func:`mean_outside_share` averages it over the real queries into one float. Under a
block-diagonal mask every share is exactly 0 (masked keys get probability 0); under a causal
mask over the whole pack, every example after the first in a row reads its neighbours.

Lessons: 02, 07, A2.
"""

from __future__ import annotations

import torch

__all__ = ["outside_share", "mean_outside_share"]


def outside_share(attn: torch.Tensor, seq_ids: torch.Tensor, real_only: bool = False) -> torch.Tensor:
    """Share of each query's attention that lands on another example's tokens.

    attn (..., B, H, T, T) attention probabilities (query x key, e.g. from
    :func:`packsim.core.model.attention_maps`), seq_ids (B, T) with -1 on padding -> (..., B, H, T).
    A key of another example, or padding seen from a real query, counts as outside; under a
    block-diagonal mask every share is exactly 0 (masked keys get probability 0). ``real_only``
    sets padding queries to 0 (their outputs are never used).
    """
    other = seq_ids[:, None, :, None] != seq_ids[:, None, None, :]  # (B, 1, T, T): another example
    share = (attn * other).sum(-1)  # (..., B, H, T)
    if real_only:
        real = (seq_ids >= 0)[:, None, :]  # (B, 1, T)
        share = torch.where(real, share, torch.zeros_like(share))
    return share


def mean_outside_share(attn: torch.Tensor, seq_ids: torch.Tensor) -> float:
    """Mean :func:`outside_share` over the real query tokens (and every layer, row and head).

    attn (..., B, H, T, T), seq_ids (B, T) -> float; 0.0 when the batch has no real token.
    """
    share = outside_share(attn, seq_ids)  # (..., B, H, T)
    real = (seq_ids >= 0)[:, None, :].expand_as(share)
    return float(share[real].mean()) if bool(real.any()) else 0.0
