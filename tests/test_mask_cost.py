"""packsim.exhibits.mask_cost: the mask each backend passes for a pack, against ground truth built here."""

from __future__ import annotations

import warnings

import pytest
import torch

from packsim.core.errors import PacksimError
from packsim.exhibits.mask_cost import (
    _attention_module,
    captured_mask,
    mask_costs,
    unpacked_mask_cost,
)

pytestmark = pytest.mark.filterwarnings("ignore")
LENGTHS = [10, 13, 9]  # one row, N = 32
N = sum(LENGTHS)


def _block_causal(lengths):  # (N, N) bool, written out: same example and key <= query
    seq = [i for i, n in enumerate(lengths) for _ in range(n)]
    return torch.tensor([[seq[q] == seq[k] and k <= q for k in range(len(seq))] for q in range(len(seq))])


def _varlen(lengths):
    return sum(n * (n + 1) // 2 for n in lengths)


@pytest.fixture(scope="module")
def costs():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mask_costs(LENGTHS)


def test_sdpa_builds_a_dense_bool_mask_of_n_squared_bytes(costs):
    c = costs["sdpa"]
    assert (c.kind, c.shape, c.dtype) == ("Tensor", (1, 1, N, N), "bool")
    assert c.bytes == N * N  # one byte per (query, key) pair
    assert c.score_pairs == N * N and c.varlen_pairs == _varlen(LENGTHS) == 191
    assert c.work_ratio == pytest.approx(N * N / 191)


def test_eager_builds_the_same_mask_in_float32(costs):
    c = costs["eager"]
    assert (c.kind, c.shape, c.dtype, c.bytes) == ("Tensor", (1, 1, N, N), "float32", 4 * N * N)


def test_the_caught_masks_are_block_diagonal():
    from packsim.exhibits.trap_cases import build_family

    pos = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    batch = {"input_ids": torch.full((1, N), 5), "position_ids": pos}
    truth = _block_causal(LENGTHS)
    sdpa = build_family("llama", "sdpa")
    assert torch.equal(captured_mask(sdpa, batch)[0, 0], truth)
    eager = captured_mask(build_family("llama", "eager"), batch)[0, 0]
    assert torch.equal(eager == 0, truth) and eager[~truth].eq(torch.finfo(torch.float32).min).all()
    assert not _attention_module(sdpa)._forward_pre_hooks  # the hook is gone afterwards
    assert sdpa(**batch, use_cache=False).logits.shape == (1, N, 96)


def test_flex_skips_blocks_only_when_the_pack_spans_several():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        short = mask_costs(LENGTHS, backends=("flex_attention",))["flex_attention"]
        long = mask_costs([128, 128], backends=("flex_attention",))["flex_attention"]
    assert short.kind == "BlockMask" and short.blocks == (1, 1) and short.score_pairs == N * N
    # 256 tokens = 2 x 2 blocks of 128: the two diagonal blocks computed, the two across examples skipped
    assert long.blocks == (2, 4) and long.score_pairs == 2 * 128 * 128
    assert long.varlen_pairs == 2 * 128 * 129 // 2 and long.bytes < 256 * 256


def test_unpacked_rows_pass_no_mask_on_sdpa():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = unpacked_mask_cost(16, rows=2)
    assert (c.kind, c.shape, c.bytes) == ("None", None, 0)
    assert c.score_pairs == c.varlen_pairs == 2 * 16 * 17 // 2  # is_causal: the lower triangle


def test_bad_lengths_are_refused():
    with pytest.raises(PacksimError, match="same number of tokens"):
        mask_costs([[3, 4], [5]])
    with pytest.raises(PacksimError, match="positive ints"):
        mask_costs([3, 0])
