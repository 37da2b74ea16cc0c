"""Tests for packsim.core.segments: conversions between the three forms, run starts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from packsim.core.errors import PacksimError
from packsim.core.segments import (
    check_cu_seqlens,
    check_seq_ids,
    cu_seqlens_from_lengths,
    cu_seqlens_from_position_ids,
    cu_seqlens_from_seq_ids,
    example_positions,
    run_cu_seqlens,
    run_starts,
    seq_ids_from_cu_seqlens,
    seq_ids_from_starts,
)


def _cu(*offsets):
    return torch.tensor(offsets, dtype=torch.int32)


# ----------------------------------------------------------------------------- conversions


def test_seq_ids_from_cu_seqlens():
    assert seq_ids_from_cu_seqlens(_cu(0, 3, 5)).tolist() == [0, 0, 0, 1, 1]
    assert seq_ids_from_cu_seqlens(_cu(0, 3, 5), total=7).tolist() == [0, 0, 0, 1, 1, -1, -1]
    assert seq_ids_from_cu_seqlens(_cu(0, 3)).dtype == torch.long
    with pytest.raises(PacksimError, match="smaller than"):
        seq_ids_from_cu_seqlens(_cu(0, 3, 5), total=4)


def test_seq_ids_from_starts_rows_padding_and_renumbering():
    starts = torch.tensor([[True, False, False, True, False], [False, False, True, False, False]])
    kept = starts.clone()
    assert seq_ids_from_starts(starts).tolist() == [[0, 0, 0, 1, 1], [2, 2, 3, 3, 3]]  # a row start is a start
    real = torch.tensor([[True, True, True, True, False], [False, False, True, True, True]])
    assert seq_ids_from_starts(starts, real).tolist() == [[0, 0, 0, 1, -1], [-1, -1, 2, 2, 2]]  # no empty id
    assert torch.equal(starts, kept)  # the caller's starts are not changed
    # a start on a padding token still ends the example before it
    gap = seq_ids_from_starts(torch.tensor([[True, False, True, False]]), torch.tensor([[True, True, False, True]]))
    assert gap.tolist() == [[0, 0, -1, 1]]


def test_cu_seqlens_from_lengths():
    for lengths in ([3, 2, 1], (3, 2, 1), torch.tensor([3, 2, 1]), np.array([3, 2, 1])):
        cu = cu_seqlens_from_lengths(lengths)
        assert cu.dtype == torch.int32 and cu.tolist() == [0, 3, 5, 6]
    assert cu_seqlens_from_lengths([]).tolist() == [0]
    assert check_cu_seqlens(cu_seqlens_from_lengths([7]), 7) == [0, 7]


def test_cu_seqlens_from_seq_ids():
    cu = cu_seqlens_from_seq_ids(torch.tensor([0, 0, 1, 1, 1, 2, -1, -1]))
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 2, 5, 6]
    # ids need not be 0..S-1, only consecutive runs
    assert cu_seqlens_from_seq_ids(torch.tensor([5, 5, 2, 9])).tolist() == [0, 2, 3, 4]
    assert cu_seqlens_from_seq_ids(torch.tensor([-1, -1])).tolist() == [0]


def test_roundtrip_cu_seqlens_seq_ids():
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        lengths = torch.randint(
            1, 9, (int(torch.randint(1, 8, (1,), generator=gen)),), generator=gen
        )
        cu = torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).to(torch.int32)])
        pad = int(torch.randint(0, 4, (1,), generator=gen))
        ids = seq_ids_from_cu_seqlens(cu, total=int(cu[-1]) + pad)
        assert torch.equal(cu_seqlens_from_seq_ids(ids), cu)
        assert torch.equal(seq_ids_from_cu_seqlens(cu_seqlens_from_seq_ids(ids), ids.numel()), ids)


def test_cu_seqlens_from_seq_ids_errors():
    with pytest.raises(PacksimError, match="padding .* position 1"):
        cu_seqlens_from_seq_ids(torch.tensor([0, -1, 1]))
    with pytest.raises(PacksimError, match="more than one run"):
        cu_seqlens_from_seq_ids(torch.tensor([0, 0, 1, 0]))
    with pytest.raises(PacksimError, match="once per row"):
        cu_seqlens_from_seq_ids(torch.zeros(2, 3, dtype=torch.long))


def test_check_cu_seqlens_ok_and_errors():
    assert check_cu_seqlens(_cu(0, 2, 5), 5) == [0, 2, 5]
    cases = [
        (torch.tensor([0, 5]), "call cu_seqlens.to(torch.int32)"),
        ([0, 5], "torch.Tensor"),
        (_cu(1, 5), "start at 0"),
        (_cu(0, 3, 3, 5), "cu_seqlens[2] = 3"),
        (_cu(0, 4), "ends at 4 but there are 5 tokens"),
        (_cu(0), "no sequence"),
        (torch.zeros(2, 2, dtype=torch.int32), "1-D"),
    ]
    for bad, words in cases:
        with pytest.raises(PacksimError) as info:
            check_cu_seqlens(bad, 5)
        assert words.lower() in str(info.value).lower(), (words, str(info.value))



def test_cu_seqlens_from_position_ids_splits_at_resets_and_rows():
    assert cu_seqlens_from_position_ids(torch.tensor([0, 1, 2, 0, 1])).tolist() == [0, 3, 5]
    # rows never share a sequence, even when positions would continue across them
    rows = torch.tensor([[0, 1, 2], [3, 4, 0]])
    assert cu_seqlens_from_position_ids(rows).tolist() == [0, 3, 5, 6]
    assert cu_seqlens_from_position_ids(torch.arange(4)).dtype == torch.int32
    with pytest.raises(PacksimError, match="position_ids must be"):
        cu_seqlens_from_position_ids(torch.zeros(2, 2, 2, dtype=torch.long))


def test_check_seq_ids():
    assert check_seq_ids([0, 0, 1, -1]).dtype == torch.long
    for bad, words in [(torch.zeros(1, 2, 3, dtype=torch.long), "shape"), (torch.zeros(3), "integer"),
                       (torch.tensor([0, -2]), "-1")]:
        with pytest.raises(PacksimError, match=words):
            check_seq_ids(bad)


# ----------------------------------------------------------------------------- runs


def test_run_starts_same_id_or_plus_one():
    ids = torch.tensor([[0, 0, 1, 1, -1, -1], [2, 2, 2, 3, 3, 3]])
    assert run_starts(ids).int().tolist() == [[1, 0, 1, 0, 1, 0], [1, 0, 0, 1, 0, 0]]
    pos = torch.tensor([0, 1, 2, 0, 1, 5])
    assert run_starts(pos, step=1).int().tolist() == [1, 0, 0, 1, 0, 1]
    assert run_cu_seqlens(ids).tolist() == [0, 2, 4, 6, 9, 12]  # padding runs and rows split
    assert run_cu_seqlens(pos, step=1).dtype == torch.int32


def test_example_positions_restart_per_run():
    seq = torch.tensor([[0, 0, 0, 1, 1, -1], [4, 4, 4, 4, 4, 4]])
    assert example_positions(seq).tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]
    assert example_positions(torch.tensor([3, 3, 7])).tolist() == [0, 1, 0]


LENGTHS = st.lists(st.integers(1, 9), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(lengths=LENGTHS, pad=st.integers(0, 4))
def test_the_three_forms_agree(lengths, pad):
    """seq ids <-> cu_seqlens <-> position ids describe the same examples, and round-trip."""
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), torch.tensor(lengths).cumsum(0).to(torch.int32)])
    seq = seq_ids_from_cu_seqlens(cu, total=int(cu[-1]) + pad)  # (N,)
    assert torch.equal(cu_seqlens_from_seq_ids(seq), cu)
    pos = example_positions(seq)  # restarts per example; the padding run counts from 0
    with_pad = cu.tolist() + ([int(cu[-1]) + pad] if pad else [])
    assert cu_seqlens_from_position_ids(pos).tolist() == with_pad
    starts = run_starts(seq)
    assert starts.sum() == len(lengths) + (pad > 0)
    assert torch.nonzero(starts).flatten().tolist() == with_pad[:-1]


# ----------------------------------------------------------------------------- int32 offsets (issue 39)


def test_cu_seqlens_from_lengths_refuses_offsets_past_int32():
    """[2**30] * 3 wrapped to [0, 2**30, -2**31, -2**30]; ground truth: the running total 3 * 2**30 > 2**31 - 1."""
    assert 3 * 2**30 > 2**31 - 1
    for lengths in ([2**30] * 3, np.array([2**30] * 3), torch.tensor([2**30] * 3, dtype=torch.int32)):
        with pytest.raises(PacksimError) as info:
            cu_seqlens_from_lengths(lengths)
        assert str(info.value).startswith(f"cu_seqlens_from_lengths: the offsets reach {3 * 2**30} tokens, past "
                                          "2**31 - 1") and "\n" not in str(info.value)
    assert cu_seqlens_from_lengths([2**30, 2**30 - 1]).tolist() == [0, 2**30, 2**31 - 1]  # exactly the limit


def test_offsets_from_positions_of_more_than_int32_tokens_are_refused():
    """2**31 tokens (a stride-0 view: no memory): the last offset, every token, would wrap to -2**31."""
    many = torch.zeros(1, dtype=torch.long).expand(2**31)  # (2**31,)
    with pytest.raises(PacksimError, match=f"cu_seqlens_from_position_ids: the offsets reach {2**31} tokens"):
        cu_seqlens_from_position_ids(many)
    with pytest.raises(PacksimError, match=f"run_cu_seqlens: the offsets reach {2**31} tokens"):
        run_cu_seqlens(many.reshape(1, -1))


def test_offsets_stop_at_the_int32_limit_exactly(monkeypatch):
    """The limit lowered to 4 (monkeypatched): 2**31 tokens of real ids would take 16 GiB. Offsets up to it
    pass; one token past it is refused; trailing padding is left out of cu_seqlens, so it does not count."""
    from packsim.core import segments

    monkeypatch.setattr(segments, "INT32_MAX", 4)
    assert cu_seqlens_from_seq_ids(torch.tensor([0, 0, 1, 1, -1, -1])).tolist() == [0, 2, 4]  # 6 tokens, 4 real
    with pytest.raises(PacksimError, match="cu_seqlens_from_seq_ids: the offsets reach 5 tokens"):
        cu_seqlens_from_seq_ids(torch.tensor([0, 0, 1, 1, 2]))
    assert cu_seqlens_from_position_ids(torch.tensor([[0, 1], [0, 1]])).tolist() == [0, 2, 4]
    with pytest.raises(PacksimError, match="the offsets reach 6 tokens"):
        cu_seqlens_from_position_ids(torch.tensor([[0, 1, 2], [0, 1, 2]]))
    assert cu_seqlens_from_lengths([2, 2]).tolist() == [0, 2, 4]
    with pytest.raises(PacksimError, match="the offsets reach 5 tokens"):
        cu_seqlens_from_lengths([2, 3])
