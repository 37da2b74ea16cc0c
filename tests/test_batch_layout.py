"""packsim.core.batch_layout: the one position convention (0.. in every piece) and the layout it feeds.

The ground truth is computed here from the lengths alone (where wrapped packing cuts, which chunks
``overflow="split"`` makes) and read back with transformers' own packed-sequence readers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from toy import toy_examples
from transformers.masking_utils import find_packed_sequence_indices
from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

from packsim.core.batch import PackedBatch
from packsim.core.batch_layout import piece_positions
from packsim.core.collator import PackingCollator

SHAPES = st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), min_size=1, max_size=12)
STRATEGIES = [("wrapped", "error"), ("bfd", "split"), ("ffd", "split"), ("bfd", "truncate")]
RESET_SETUPS = ["correct", "mask_fix", "positions_only"]


def _runs(positions: list[int]) -> list[int]:
    """Run starts of one row by hand: a new run wherever a position is not the previous one + 1."""
    return [t for t in range(len(positions)) if t == 0 or positions[t] != positions[t - 1] + 1]


def _cu_sdpa(pos: torch.Tensor) -> list[int]:
    """Sequence offsets transformers' sdpa / eager / flex path reads from (1, N) positions."""
    ids = find_packed_sequence_indices(pos)
    ids = torch.zeros_like(pos) if ids is None else ids
    return [*torch.nonzero(torch.diff(ids[0], prepend=ids[0, :1] - 1)).flatten().tolist(), pos.shape[1]]


def _cu_flash(pos: torch.Tensor) -> list[int]:
    """Sequence offsets transformers' flash path reads from (1, N) positions (a start where pos == min)."""
    return prepare_fa_kwargs_from_position_ids(pos)[0][0].tolist()


def _wrapped_piece_lengths(lengths: list[int], capacity: int) -> list[list[int]]:
    """Per row, the piece lengths wrapped packing makes: concatenate, cut every ``capacity`` tokens."""
    ends = np.cumsum(lengths).tolist()
    cuts = sorted(set(ends) | set(range(capacity, ends[-1], capacity)))
    rows: list[list[int]] = [[] for _ in range(-(-ends[-1] // capacity))]
    a = 0
    for z in cuts:
        rows[a // capacity].append(z - a)
        a = z
    return rows


def _split_chunks(length: int, capacity: int) -> list[int]:
    """The pieces ``overflow="split"`` cuts one example into: full rows, then the rest."""
    return [capacity] * (length // capacity) + ([length % capacity] if length % capacity else [])


def _expected_positions(b: PackedBatch) -> list[list[int]]:
    """The convention by hand: per row, 0.. in each run of one example id, and 0.. on the padding."""
    out = []
    for row in b.seq_ids.tolist():
        pos = []
        for t, s in enumerate(row):
            pos.append(0 if t == 0 or s != row[t - 1] else pos[-1] + 1)
        out.append(pos)
    return out


# ---- one exact case: lengths [9, 3], capacity 4 -------------------------------------------------


def _nine_and_three():
    return toy_examples([(3, 4), (0, 1)], seed=0)  # lengths 9 and 3 (BOS + body + EOS)


def test_split_example_restarts_in_every_row():
    examples = _nine_and_three()
    assert [len(e.tokens) for e in examples] == [9, 3]
    b = PackedBatch.from_examples(examples, 4, "correct", strategy="bfd", overflow="split")
    # example 0 in pieces of 4, 4 and 1; example 1 whole in row 2 before example 0's last token
    assert b.seq_ids.tolist() == [[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]]
    assert b.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 0]]  # not [.., 4,5,6,7, 0,1,2,8]
    flat = b.to_flattening()
    assert flat["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 0]]
    assert flat["cu_seq_lens_q"].tolist() == [0, 4, 8, 11, 12]
    assert _cu_sdpa(flat["position_ids"]) == _cu_flash(flat["position_ids"]) == [0, 4, 8, 11, 12]
    back = PackedBatch.from_flattening(flat)
    assert torch.equal(back.position_ids, flat["position_ids"]) and torch.equal(back.cu_seqlens, b.cu_seqlens)
    wrapped = PackedBatch.from_examples(examples, 4, "correct", strategy="wrapped")
    assert wrapped.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3], [0, 0, 1, 2]]
    assert wrapped.to_flattening()["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 0, 0, 1, 2]]


def test_piece_positions_count_from_zero_in_every_piece():
    assert piece_positions([4, 4, 3, 1]).tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 0]
    assert piece_positions(np.array([5])).tolist() == [0, 1, 2, 3, 4]
    assert piece_positions(torch.tensor([2, 1], dtype=torch.int32)).dtype == torch.long
    assert piece_positions([]).tolist() == []


# ---- the property: positions are the convention, and no run ever spans two pieces --------------


@settings(max_examples=250, deadline=None)
@given(shapes=SHAPES, seed=st.integers(0, 10**6), capacity=st.integers(2, 24),
       strategy=st.sampled_from(STRATEGIES), setup=st.sampled_from(RESET_SETUPS), order=st.randoms())
def test_no_position_run_spans_two_pieces(shapes, seed, capacity, strategy, setup, order):
    strategy, overflow = strategy
    examples = toy_examples(shapes, seed)
    lengths = [len(e.tokens) for e in examples]
    b = PackedBatch.from_examples(examples, capacity, setup, strategy=strategy, overflow=overflow)
    B, T = b.shape
    # (2) the positions are the convention, and the pieces the ones the lengths make
    assert b.position_ids.tolist() == _expected_positions(b)
    assert torch.equal(b.example_positions, b.position_ids)
    pieces = b.row_lengths()
    if strategy == "wrapped":
        assert pieces == _wrapped_piece_lengths(lengths, capacity)
    elif overflow == "split":
        for i, n in enumerate(lengths):
            got = sorted(s.stop - s.start for s in b.segments if s.example == i)
            assert got == sorted(_split_chunks(n, capacity)), f"example {i}"
    # (1) every row: each run of +1 positions is exactly one piece or one padding run, under both
    # transformers readers, so no run holds two examples or two pieces of one example
    seq = b.seq_ids.tolist()
    for r in range(B):
        row_pos = b.position_ids[r:r + 1]
        starts = _runs(row_pos[0].tolist())
        assert starts == [t for t in range(T) if t == 0 or seq[r][t] != seq[r][t - 1]], f"row {r}"
        assert _cu_sdpa(row_pos) == _cu_flash(row_pos) == [*starts, T]
    # (1) the flattened row: one sequence per piece, whatever reads it
    flat = b.to_flattening()
    cu = b.cu_seqlens.tolist()
    assert flat["cu_seq_lens_q"].tolist() == cu
    assert _runs(flat["position_ids"][0].tolist()) + [cu[-1]] == cu
    assert _cu_sdpa(flat["position_ids"]) == _cu_flash(flat["position_ids"]) == cu
    assert torch.equal(flat["position_ids"][0], b.position_ids[b.real_mask])  # the rows' own positions
    assert torch.equal(PackedBatch.from_flattening(flat).position_ids, flat["position_ids"])
    # (1) the rows concatenated in any order, padding kept (a (B, T) batch reshaped to one row)
    rows = list(range(B))
    order.shuffle(rows)
    cat_pos = b.position_ids[rows].reshape(1, -1)
    cat_seq = b.seq_ids[rows].reshape(-1).tolist()
    real = b.real_mask[rows].reshape(-1).tolist()
    for a, z in zip(_cu_sdpa(cat_pos)[:-1], _cu_sdpa(cat_pos)[1:], strict=True):
        assert len(set(cat_seq[a:z])) == 1, "a run spans two examples"
        assert a // T == (z - 1) // T or not any(real[a:z]), "a run spans two rows' pieces"
    assert _cu_flash(cat_pos) == _cu_sdpa(cat_pos)


@settings(max_examples=60, deadline=None)
@given(shapes=SHAPES, seed=st.integers(0, 10**6))
def test_collator_row_restarts_at_every_example(shapes, seed):
    examples = toy_examples(shapes, seed)
    out = PackingCollator(return_flash_attn_kwargs=True)(examples)
    cu = np.cumsum([0] + [len(e.tokens) for e in examples]).tolist()
    assert out["cu_seq_lens_q"].tolist() == cu
    assert _cu_sdpa(out["position_ids"]) == _cu_flash(out["position_ids"]) == cu
    assert out["position_ids"][0].tolist() == [t for n in np.diff(cu).tolist() for t in range(n)]


# ---- what the convention buys on an absolute-position model --------------------------------------


def test_rows_and_flattened_row_give_gpt2_the_same_logits():
    """GPT-2 reads absolute positions: the split batch's rows and its to_flattening() row agree
    only because both restart every piece at 0 (with the example's offsets, 0.37 apart)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from packsim.core.model import forward

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=40, n_positions=32,
                        bos_token_id=1, eos_token_id=2, attn_implementation="sdpa")
    model = GPT2LMHeadModel(config).eval()
    b = PackedBatch.from_examples(_nine_and_three(), 4, "correct", strategy="bfd", overflow="split")
    flat = b.to_flattening()
    with torch.no_grad():
        rows = forward(model, b, backend="transformers")[b.real_mask]  # (N, V)
        flattened = model(input_ids=flat["input_ids"], position_ids=flat["position_ids"],
                          use_cache=False).logits[0]  # (N, V): sdpa finds the pieces from position_ids
    assert (rows - flattened).abs().max() < 1e-5
    with torch.no_grad():  # the same tokens at the example's offsets: another answer on GPT-2
        offsets = model(input_ids=flat["input_ids"][:, 4:8], position_ids=torch.arange(4, 8)[None],
                        use_cache=False).logits[0]
    assert (offsets - flattened[4:8]).abs().max() > 1e-2


@pytest.mark.parametrize("setup", ["buggy", "loss_fix"])
def test_continuous_setups_keep_row_positions_but_flatten_per_piece(setup):
    """A continuous setup's positions count 0..T-1 over the row; the flattened format still
    marks its sequences by positions, so it restarts per piece (documented in to_flattening)."""
    b = PackedBatch.from_examples(_nine_and_three(), 4, setup, strategy="bfd", overflow="split")
    assert b.position_ids.tolist() == [[0, 1, 2, 3]] * 3
    assert b.to_flattening()["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 0]]
