"""Tests for packsim.core.segments: conversions, run starts, boundaries of any batch."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from toy import toy_examples
from transformers import DataCollatorWithFlattening

from packsim.core.batch import PackedBatch
from packsim.core.errors import PacksimError
from packsim.core.segments import (
    ROWS_SOURCE,
    check_cu_seqlens,
    check_seq_ids,
    cu_seqlens_from_position_ids,
    cu_seqlens_from_seq_ids,
    example_positions,
    find_boundaries,
    run_cu_seqlens,
    run_starts,
    seq_ids_from_cu_seqlens,
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


# ----------------------------------------------------------------------------- boundaries of any batch


@pytest.fixture(scope="module")
def flat():
    """DataCollatorWithFlattening over 4 toy examples: every boundary field, in agreement."""
    examples = toy_examples([(2, 3), (0, 1), (4, 2), (1, 1)], seed=0)
    collator = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)
    return collator([{"input_ids": list(ex.tokens)} for ex in examples], return_tensors="pt")


@pytest.mark.parametrize("field,source", [("cu_seq_lens_q", "cu_seq_lens_q"), ("seq_idx", "seq_idx"),
                                          ("position_ids", "position_ids (where they restart)")])
def test_each_field_alone_gives_the_same_examples(flat, field, source):
    found = find_boundaries({"input_ids": flat["input_ids"], field: flat[field]})
    assert found.source == source
    assert torch.equal(found.cu_seqlens, flat["cu_seq_lens_q"])
    assert torch.equal(found.seq_ids, flat["seq_idx"].long())
    assert found.num_examples == 4


def test_precedence_cu_seq_lens_q_then_seq_idx_then_positions(flat):
    ids = flat["input_ids"]
    N = ids.shape[1]
    one = {"cu_seq_lens_q": _cu(0, N), "seq_idx": torch.zeros(1, N, dtype=torch.int32),
           "position_ids": torch.arange(N)[None]}
    batch = {**flat, **one}  # three fields that each say "one example", over the collator's
    assert find_boundaries(batch).num_examples == 1 and find_boundaries(batch).source == "cu_seq_lens_q"
    assert find_boundaries({**flat, "cu_seq_lens_q": None}).source == "seq_idx"
    mixed = {"input_ids": ids, "seq_idx": one["seq_idx"], "position_ids": flat["position_ids"]}
    assert find_boundaries(mixed).num_examples == 1  # seq_idx wins over position_ids
    mixed = {"input_ids": ids, "seq_idx": flat["seq_idx"], "position_ids": one["position_ids"]}
    assert find_boundaries(mixed).num_examples == 4


def test_padding_from_offsets_seq_idx_and_attention_mask():
    ids = torch.ones(2, 4, dtype=torch.long)
    found = find_boundaries({"input_ids": ids, "cu_seq_lens_q": _cu(0, 3, 6)})
    assert found.seq_ids.tolist() == [[0, 0, 0, 1], [2, 2, -1, -1]]  # rows split example 1
    assert found.cu_seqlens.tolist() == [0, 3, 4, 6]  # over real tokens, row-major
    found = find_boundaries({"input_ids": ids, "seq_idx": torch.tensor([[5, 5, -1, -1], [7, 8, 8, -1]])})
    assert found.seq_ids.tolist() == [[0, 0, -1, -1], [1, 2, 2, -1]]
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    found = find_boundaries({"input_ids": ids, "position_ids": torch.tensor([[0, 1, 0, 0], [0, 1, 2, 3]]),
                             "attention_mask": mask})
    assert found.seq_ids.tolist() == [[0, 0, 1, -1], [2, 2, -1, -1]]
    assert found.source == "position_ids (where they restart); padding from attention_mask == 0"


def test_packed_batch_and_missing_fields():
    b = PackedBatch.from_examples(toy_examples([(2, 3), (1, 2), (3, 1)], seed=1), 12, "correct")
    found = find_boundaries(b)
    assert found.seq_ids is b.seq_ids and found.cu_seqlens is b.cu_seqlens
    assert found.source.startswith("PackedBatch.seq_ids")
    rows = find_boundaries({"input_ids": torch.ones(2, 3)}, missing="rows")
    assert rows.source == ROWS_SOURCE and rows.seq_ids.tolist() == [[0, 0, 0], [1, 1, 1]]
    assert rows.cu_seqlens.tolist() == [0, 3, 6]


@pytest.mark.parametrize("batch,words", [
    ({"input_ids": torch.ones(1, 5, dtype=torch.long)}, "no example boundaries .* pass cu_seq_lens_q"),
    ({"input_ids": torch.ones(1, 5, dtype=torch.long), "cu_seq_lens_q": _cu(0, 3, 6)}, "ends at 6"),
    ({"input_ids": torch.ones(1, 5, dtype=torch.long), "cu_seq_lens_q": _cu(0, 3, 3)}, "strictly increasing"),
    ({"input_ids": torch.ones(1, 5, dtype=torch.long), "seq_idx": torch.zeros(1, 4)}, r"seq_idx.*\(1, 5\)"),
    ({"input_ids": torch.ones(5, dtype=torch.long), "seq_idx": torch.zeros(5)}, r"\(B, T\) tensor"),
    ({"input_ids": torch.ones(2, 3, dtype=torch.long), "position_ids": torch.arange(3)[None],
      "attention_mask": torch.ones(1, 3)}, r"attention_mask.*\(2, 3\)"),
    ([1, 2, 3], "PackedBatch or a collator dict"),
])
def test_bad_batches_are_explained(batch, words):
    with pytest.raises(PacksimError, match=words):
        find_boundaries(batch)
