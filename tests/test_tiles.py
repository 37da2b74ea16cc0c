"""Tests for packsim.core.tiles: the tile classifier, varlen tiles and the work accounting.

The classifier is checked against a brute force over the dense (N, N) block-diagonal mask and
against FlexAttention's own ``BlockMask``; the work accounting against hand counts.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from packsim.core.errors import PacksimError
from packsim.core.masks import block_diagonal_mask_from_cu_seqlens, block_sparsity, flex_block_mask
from packsim.core.segments import seq_ids_from_cu_seqlens
from packsim.core.tiles import (
    FULL,
    PARTIAL,
    SKIPPED,
    TILE_KINDS,
    attention_work,
    score_pairs,
    tile_grid,
    varlen_tiles,
)


def _cu(*offsets):
    return torch.tensor(offsets, dtype=torch.int32)


def _cu_of(lengths):
    return torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int32)


def _brute_force_grid(cu: torch.Tensor, tile: int, causal: bool) -> torch.Tensor:
    """Classify tiles from the dense (N, N) mask: any allowed pair -> computed, all -> full.

    The mask is padded with False up to n * tile, so a ragged edge tile is never full (as
    FlexAttention counts it).
    """
    mask = block_diagonal_mask_from_cu_seqlens(cu, causal=causal)  # (N, N) bool
    N = mask.shape[0]
    n = math.ceil(N / tile)
    padded = F.pad(mask, (0, n * tile - N, 0, n * tile - N))  # (n*tile, n*tile)
    blocks = padded.view(n, tile, n, tile).permute(0, 2, 1, 3).reshape(n, n, tile * tile)
    grid = torch.full((n, n), SKIPPED, dtype=torch.int8)
    grid[blocks.any(-1)] = PARTIAL
    grid[blocks.all(-1)] = FULL
    return grid


# ----------------------------------------------------------------------------- tile_grid


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("causal", [True, False])
def test_tile_grid_equals_brute_force_on_random_packs(seed, causal):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 70, size=int(rng.integers(1, 9))).tolist()
    tile = int(rng.choice([1, 3, 8, 16, 32]))
    cu = _cu_of(lengths)
    grid = tile_grid(cu, tile, causal)
    assert grid.dtype == torch.int8 and grid.shape == (math.ceil(sum(lengths) / tile),) * 2
    assert torch.equal(grid, _brute_force_grid(cu, tile, causal)), (lengths, tile)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    "lengths,tile",
    [([100, 300, 28, 340, 256], 128), ([5, 20, 1, 14], 8), ([30, 3, 50, 17], 16), ([64], 16)],
)
def test_tile_grid_and_work_match_flex_block_mask(lengths, tile, causal):
    cu = _cu_of(lengths)
    s = block_sparsity(flex_block_mask(seq_ids_from_cu_seqlens(cu), causal=causal, block_size=tile))
    assert torch.equal(tile_grid(cu, tile, causal), s.grid[0, 0])
    w = attention_work(cu, causal=causal, tile=tile)
    assert (w.tiles_total, w.tiles_full, w.tiles_partial, w.tiles_skipped) == (
        s.total,
        s.full,
        s.partial,
        s.skipped,
    )
    assert w.tiles_computed == s.computed


def test_tile_grid_hand_case():
    # sequences [0, 128) and [128, 384), tiles of 128: 3 x 3 tiles
    grid = tile_grid(_cu(0, 128, 384), 128)
    assert grid.tolist() == [[1, 0, 0], [0, 1, 0], [0, 2, 1]]
    assert tile_grid(_cu(0, 128, 384), 128, causal=False).tolist() == [
        [2, 0, 0],
        [0, 2, 2],
        [0, 2, 2],
    ]
    assert TILE_KINDS[SKIPPED] == "skipped" and TILE_KINDS[FULL] == "full"


# ----------------------------------------------------------------------------- varlen_tiles


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("causal", [True, False])
def test_varlen_tiles_stay_inside_one_sequence_and_match_the_count(seed, causal):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 90, size=int(rng.integers(1, 8))).tolist()
    tile = int(rng.choice([4, 16, 32]))
    cu = _cu_of(lengths)
    tiles = varlen_tiles(cu, tile, causal)
    assert len(tiles) == attention_work(cu, causal=causal, tile=tile).varlen_tiles
    ids = seq_ids_from_cu_seqlens(cu)
    for q0, q1, k0, k1 in tiles:  # no varlen tile straddles a sequence boundary
        assert len({int(i) for i in ids[q0:q1]} | {int(i) for i in ids[k0:k1]}) == 1
        assert 0 < q1 - q0 <= tile and 0 < k1 - k0 <= tile
        assert not causal or k0 <= q0


# ----------------------------------------------------------------------------- attention_work


def test_score_pairs_counts_the_mask():
    for L in (1, 2, 7, 64):
        assert score_pairs(L) == int(torch.ones(L, L).tril().sum())  # causal: the lower triangle
        assert score_pairs(L, causal=False) == L * L
    lengths = np.array([3, 4, 100])
    assert score_pairs(lengths).tolist() == [int(torch.ones(L, L).tril().sum()) for L in lengths]
    # a causal query run [a, b) of a sequence: rows a..b-1 of the lower triangle
    assert score_pairs(9) - score_pairs(4) == int(torch.ones(9, 9).tril()[4:9].sum())


def test_attention_work_pairs():
    w = attention_work(_cu(0, 3, 5))
    assert (w.tokens, w.num_seqs) == (5, 2)
    assert (w.dense_pairs, w.pack_pairs, w.varlen_pairs) == (25, 15, 6 + 3)
    w = attention_work(_cu(0, 3, 5), causal=False)
    assert (w.pack_pairs, w.varlen_pairs) == (25, 9 + 4)
    assert w.saving == pytest.approx(25 / 13)
    assert w.tile is None and w.tiles_computed is None


def test_attention_work_tiles_hand_case():
    w = attention_work(_cu(0, 128, 384), tile=128)  # 1 + 2 tiles: causal 1 + 3 per-sequence
    assert w.varlen_tiles == 1 + 3
    assert (w.tiles_total, w.tiles_full, w.tiles_partial, w.tiles_skipped) == (9, 1, 3, 5)


def test_attention_work_errors():
    with pytest.raises(PacksimError, match="tile"):
        attention_work(_cu(0, 4), tile=0)
    with pytest.raises(PacksimError, match="int32"):
        attention_work(torch.tensor([0, 4]))
    with pytest.raises(PacksimError, match="tile"):
        tile_grid(_cu(0, 4), 0)
    with pytest.raises(PacksimError, match="int32"):
        varlen_tiles(torch.tensor([0, 4]), 4)
