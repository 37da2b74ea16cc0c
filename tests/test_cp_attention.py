"""packsim.scaling.cp_attention in one process: the packed row, torch's load balancers against
packsim's split arithmetic, bad input. The runs on ranks are in tests/test_cp_compare.py."""

from __future__ import annotations

import pytest
import torch

from packsim.core.data import make_examples
from packsim.core.errors import PacksimError
from packsim.core.loss import IGNORE_INDEX
from packsim.core.upstream.torch_cp import expected_layout
from packsim.scaling.context_parallel import contiguous_split, pad_lengths, zigzag_split
from packsim.scaling.cp_attention import document_row, rank_positions, shard_row


class _Ex:
    def __init__(self, tokens, n_prompt):
        self.tokens, self.n_prompt = tokens, n_prompt


def test_document_row_pads_each_document_restarts_positions_and_shifts_targets_inside_documents():
    examples = [_Ex([1, 2, 3, 4, 5], 2), _Ex([6, 7, 8], 1), _Ex([9] * 300, 1)]  # the third cannot fit
    row = document_row(examples, T=256, cp_size=2)
    assert row.lengths == [8, 4, 244] and row.real == [5, 3]  # 5 -> 8, 3 -> 4 (multiples of 4), then filler
    assert row.input_ids[0, :12].tolist() == [1, 2, 3, 4, 5, 0, 0, 0, 6, 7, 8, 0]
    assert row.position_ids[0, :12].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3]
    # ground truth by hand: position p predicts token p+1 where p+1 is a response token of the same document
    expected = [IGNORE_INDEX, 3, 4, 5] + [IGNORE_INDEX] * 4 + [7, 8] + [IGNORE_INDEX] * 2
    assert row.targets[0, :12].tolist() == expected
    assert int((row.targets[0, 12:] != IGNORE_INDEX).sum()) == 0
    assert row.real_mask()[:12].tolist() == [True] * 5 + [False] * 3 + [True] * 3 + [False]


def _doc_major(lengths, cp):
    """Independently: each document's zigzag chunks in rank order, documents one after another."""
    order, start = [], 0
    for length in lengths:
        c = length // (2 * cp)
        for r in range(cp):
            order += list(range(start + r * c, start + (r + 1) * c))
            order += list(range(start + (2 * cp - 1 - r) * c, start + (2 * cp - r) * c))
        start += length
    T = sum(lengths)
    return [order[r * T // cp : (r + 1) * T // cp] for r in range(cp)]


def test_torch_per_document_balancer_holds_the_order_its_release_was_read_to_make():
    """torch 2.13.0's _PerDocumentHeadTailLoadBalancer puts each document in its zigzag order (chunk i
    beside chunk 2cp-1-i), documents one after another, and the shard cut takes T/cp of that: a rank
    holds whole documents' worth of chunks. From 2.14.0 each rank holds chunks i and 2cp-1-i of every
    document, as packsim.scaling.context_parallel.zigzag_split does (packsim.core.upstream.torch_cp)."""
    row = document_row(make_examples(80, seed=3), T=256, cp_size=2)
    starts = torch.cumsum(torch.tensor(row.lengths), 0) - torch.tensor(row.lengths)
    zig = [[int(starts[d]) + p for d, a, b in rank for p in range(a, b)] for rank in zigzag_split(row.lengths, 2)]
    assert _doc_major(row.lengths, 2) != zig  # more than one document: the two layouts differ
    expected = zig if expected_layout(torch.__version__) == "rank-major" else _doc_major(row.lengths, 2)
    assert rank_positions(row.lengths, 2) == expected, f"torch {torch.__version__}"
    one = [[p for _, a, b in rank for p in range(a, b)] for rank in zigzag_split([256], 2)]
    assert rank_positions([256], 2) == one  # one document: the same chunks in every release


def test_torch_head_tail_balancer_is_the_zigzag_of_the_whole_row():
    lengths = pad_lengths([40, 88, 128], 2).tolist()
    whole = zigzag_split([sum(lengths)], 2)
    for torch_rank, ours in zip(rank_positions(lengths, 2, "ring_causal"), whole, strict=True):
        assert torch_rank == [p for _, a, b in ours for p in range(a, b)]
    assert rank_positions(lengths, 2, "ring_causal") != rank_positions(lengths, 2)  # the documents are not cut
    assert contiguous_split([256], 2)[0] != whole[0]


def test_bad_input():
    with pytest.raises(PacksimError, match="multiple of cp_size x 128"):
        document_row(make_examples(8), T=200, cp_size=2)
    with pytest.raises(PacksimError, match="cp_size must be a positive int"):
        document_row(make_examples(8), T=256, cp_size=0)
    with pytest.raises(PacksimError, match="no example fits"):
        document_row([_Ex([1] * 300, 1)], T=256, cp_size=2)
    row = document_row(make_examples(40), T=256, cp_size=2)
    with pytest.raises(PacksimError, match="unknown layout"):
        shard_row(row, mesh=None, layout="zigzag")
    with pytest.raises(PacksimError, match="unknown layout"):
        rank_positions(row.lengths, 2, "zigzag")
