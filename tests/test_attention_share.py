"""Tests for packsim.core.attention_share: the share of attention outside each query's example."""

from __future__ import annotations

import pytest
import torch

from packsim.core.attention_share import mean_outside_share, outside_share
from packsim.core.masks import block_diagonal_mask, causal_mask


def test_outside_share_by_hand():
    seq = torch.tensor([[0, 0, 1, -1]])  # (B, T)
    attn = causal_mask(4).float()
    attn = (attn / attn.sum(-1, keepdim=True))[None, None]  # (1, 1, T, T): uniform causal
    share = outside_share(attn, seq)[0, 0]  # (T,)
    assert share.tolist() == pytest.approx([0.0, 0.0, 2 / 3, 3 / 4])
    assert outside_share(attn, seq, real_only=True)[0, 0].tolist() == pytest.approx([0, 0, 2 / 3, 0])
    assert mean_outside_share(attn, seq) == pytest.approx((2 / 3) / 3)  # real queries only


def test_outside_share_is_exactly_zero_under_the_block_mask():
    gen = torch.Generator().manual_seed(0)
    seq = torch.tensor([[0, 0, 0, 1, 1, 2, -1, -1], [3, 3, 4, 4, 4, 4, 4, -1]])
    scores = torch.randn(2, 2, 3, 8, 8, generator=gen)  # (L, B, H, T, T)
    allowed = block_diagonal_mask(seq) | torch.eye(8, dtype=torch.bool)  # padding sees itself
    attn = scores.masked_fill(~allowed[:, None], float("-inf")).softmax(-1)
    assert float(outside_share(attn, seq).abs().max()) == 0.0
    assert mean_outside_share(attn, seq) == 0.0
    leaky = scores.masked_fill(~causal_mask(8), float("-inf")).softmax(-1)
    assert mean_outside_share(leaky, seq) > 0.1
