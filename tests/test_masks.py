"""Tests for packsim.core.masks: hand-written small masks, conversions, additive 4D, Flex BlockMasks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from packsim.core.errors import PacksimError
from packsim.core.masks import (
    block_diagonal_mask,
    block_diagonal_mask_from_cu_seqlens,
    block_sparsity,
    causal_mask,
    flex_block_mask,
    to_additive_4d,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _cu(*offsets):
    return torch.tensor(offsets, dtype=torch.int32)


# ----------------------------------------------------------------------------- boolean masks


def test_causal_mask_is_lower_triangular():
    expected = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    assert torch.equal(causal_mask(3), expected)
    assert causal_mask(4).dtype == torch.bool


def test_block_diagonal_mask_two_sequences():
    got = block_diagonal_mask(torch.tensor([0, 0, 1, 1, 1]))
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [0, 0, 1, 0, 0],
            [0, 0, 1, 1, 0],
            [0, 0, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(got, expected)


def test_block_diagonal_mask_non_causal():
    got = block_diagonal_mask(torch.tensor([0, 0, 1]), causal=False)
    expected = torch.tensor([[1, 1, 0], [1, 1, 0], [0, 0, 1]], dtype=torch.bool)
    assert torch.equal(got, expected)


def test_block_diagonal_mask_padding_attends_to_nothing():
    got = block_diagonal_mask(torch.tensor([0, 1, 1, -1, -1]))
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [0, 1, 0, 0, 0],
            [0, 1, 1, 0, 0],
            [0, 0, 0, 0, 0],
            [0, 0, 0, 0, 0],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(got, expected)


def test_block_diagonal_mask_batched_matches_rows():
    ids = torch.tensor([[0, 0, 1, 1], [0, 1, 2, -1]])
    got = block_diagonal_mask(ids)
    assert got.shape == (2, 4, 4)
    for b in range(2):
        assert torch.equal(got[b], block_diagonal_mask(ids[b]))


def test_block_diagonal_mask_accepts_lists():
    assert torch.equal(block_diagonal_mask([0, 0, 1]), block_diagonal_mask(torch.tensor([0, 0, 1])))


def test_single_sequence_is_plain_causal():
    assert torch.equal(block_diagonal_mask(torch.zeros(6, dtype=torch.long)), causal_mask(6))


def test_mask_from_cu_seqlens_matches_seq_ids():
    cu = _cu(0, 2, 3, 7)
    ids = torch.tensor([0, 0, 1, 2, 2, 2, 2])
    assert torch.equal(block_diagonal_mask_from_cu_seqlens(cu), block_diagonal_mask(ids))
    padded = block_diagonal_mask_from_cu_seqlens(cu, total=9)
    assert padded.shape == (9, 9) and not padded[7:].any() and not padded[:, 7:].any()


@pytest.mark.parametrize(
    "bad", [torch.tensor([0.0, 1.0]), torch.tensor([0, -2]), torch.zeros(1, 2, 3)]
)
def test_seq_ids_validation(bad):
    with pytest.raises(PacksimError, match="seq_ids"):
        block_diagonal_mask(bad)


# ----------------------------------------------------------------------------- additive 4D


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_to_additive_4d_values(dtype):
    mask = block_diagonal_mask(torch.tensor([0, 0, 1]))
    add = to_additive_4d(mask, dtype)
    assert add.shape == (1, 1, 3, 3) and add.dtype == dtype
    assert (add[0, 0][mask] == 0).all()
    assert (add[0, 0][~mask] == torch.finfo(dtype).min).all()


def test_to_additive_4d_shapes_and_errors():
    m3 = block_diagonal_mask(torch.tensor([[0, 1], [0, 0]]))
    assert to_additive_4d(m3).shape == (2, 1, 2, 2)
    assert to_additive_4d(m3[:, None]).shape == (2, 1, 2, 2)
    with pytest.raises(PacksimError, match="boolean"):
        to_additive_4d(m3.float())
    with pytest.raises(PacksimError, match="floating"):
        to_additive_4d(m3, torch.int64)


def test_additive_mask_works_where_eager_bool_mask_fails():
    """Eager attention adds the mask to the scores: the float mask isolates, a bool one does not."""
    torch.manual_seed(0)
    ids = torch.tensor([0, 0, 0, 1, 1, 1])
    q, k, v = torch.randn(3, 1, 2, 6, 4).unbind(0)  # (B, H, T, D)
    mask = block_diagonal_mask(ids)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def eager(attention_mask):
        scores = q @ k.transpose(-1, -2) / 2.0 + attention_mask  # head_dim 4 -> scale 1/2
        return scores.softmax(-1) @ v

    assert (eager(to_additive_4d(mask)) - ref).abs().max() < 1e-6
    assert (eager(mask[None, None].float()) - ref).abs().max() > 1e-2  # bool mask: no masking


# ----------------------------------------------------------------------------- Flex BlockMask


def _lengths_to_ids(lengths):
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))


def test_flex_block_mask_known_counts():
    """Documents [100, 300, 28, 340, 256] in 1024 tokens (the FlexAttention blog-style example)."""
    bm = flex_block_mask(_lengths_to_ids([100, 300, 28, 340, 256]))
    s = block_sparsity(bm)
    assert (s.full, s.partial, s.skipped, s.total) == (3, 15, 46, 64)
    assert s.full + s.partial + s.skipped == s.total
    assert s.computed == 18
    assert s.skipped_fraction == pytest.approx(bm.sparsity() / 100)
    assert s.block_size == (128, 128) and s.grid.shape == (1, 1, 8, 8)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    "lengths,block", [([5, 20, 1, 14], 8), ([64, 64], 16), ([30, 3, 50, 17], 16)]
)
def test_flex_block_mask_grid_matches_dense_mask(lengths, block, causal):
    ids = _lengths_to_ids(lengths)
    T = ids.numel()
    s = block_sparsity(flex_block_mask(ids, causal=causal, block_size=block))
    assert s.full + s.partial + s.skipped == s.total == (-(-T // block)) ** 2
    dense = block_diagonal_mask(ids, causal=causal)
    n = -(-T // block)
    padded = torch.zeros(n * block, n * block, dtype=torch.bool)
    padded[:T, :T] = dense
    tiles = padded.reshape(n, block, n, block).transpose(1, 2)  # (n, n, block, block)
    any_true = tiles.flatten(2).any(-1)
    assert torch.equal(s.grid[0, 0] > 0, any_true)  # computed iff the tile holds an allowed pair
    assert tiles.flatten(2).all(-1)[s.grid[0, 0] == 2].all()  # a full tile is all-True


def test_flex_block_mask_batched_and_padding():
    ids = torch.tensor([[0] * 20 + [1] * 12, [0] * 24 + [-1] * 8])
    bm = flex_block_mask(ids, block_size=8)
    s = block_sparsity(bm)
    assert s.grid.shape == (2, 1, 4, 4)
    assert s.full + s.partial + s.skipped == s.total == 32
    assert not s.grid[1, 0, 3].any()  # the padding-only query block computes nothing
    assert not s.grid[1, 0, :, 3].any()  # and no query reads the padding-only key block


def test_flex_block_mask_errors():
    with pytest.raises(PacksimError, match="block_size"):
        flex_block_mask(torch.zeros(4, dtype=torch.long), block_size=0)
    with pytest.raises(PacksimError, match="BlockMask"):
        block_sparsity(torch.zeros(3))
