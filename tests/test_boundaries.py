"""Tests for packsim.core.boundaries: the examples of any batch, each field alone, their precedence."""

from __future__ import annotations

import pytest
import torch
from toy import toy_examples
from transformers import DataCollatorWithFlattening

from packsim.core.batch import PackedBatch
from packsim.core.boundaries import ROWS_SOURCE, find_boundaries, text_positions
from packsim.core.errors import PacksimError


def _cu(*offsets):
    return torch.tensor(offsets, dtype=torch.int32)


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
    rows = find_boundaries({"input_ids": torch.ones(2, 3, dtype=torch.long)}, missing="rows")
    assert rows.source == ROWS_SOURCE and rows.seq_ids.tolist() == [[0, 0, 0], [1, 1, 1]]
    assert rows.cu_seqlens.tolist() == [0, 3, 6]


@pytest.mark.parametrize("batch,words", [
    ({"input_ids": torch.ones(1, 5, dtype=torch.long)}, "no example boundaries .* pass cu_seq_lens_q"),
    ({"input_ids": torch.ones(1, 5, dtype=torch.long), "cu_seq_lens_q": _cu(0, 3, 6)}, "ends at 6"),
    ({"input_ids": torch.ones(1, 5, dtype=torch.long), "cu_seq_lens_q": _cu(0, 3, 3)}, "strictly increasing"),
    ({"input_ids": torch.ones(1, 5, dtype=torch.long), "seq_idx": torch.zeros(1, 4, dtype=torch.long)}, r"seq_idx.*\(1, 5\)"),
    ({"input_ids": torch.ones(1, 5, dtype=torch.long), "seq_idx": torch.zeros(1, 5)}, r"seq_idx.*float32.*integer"),
    ({"input_ids": torch.ones(1, 5, dtype=torch.bool), "position_ids": torch.arange(5)[None]}, r"input_ids.*bool"),
    ({"input_ids": torch.ones(5, dtype=torch.long), "seq_idx": torch.zeros(5)}, r"\(B, T\) tensor"),
    ({"input_ids": torch.ones(2, 3, dtype=torch.long), "position_ids": torch.arange(3)[None],
      "attention_mask": torch.ones(1, 3)}, r"attention_mask.*\(2, 3\)"),
    ([1, 2, 3], "PackedBatch or a collator dict"),
])
def test_bad_batches_are_explained(batch, words):
    with pytest.raises(PacksimError, match=words):
        find_boundaries(batch)


def test_a_pad_run_ending_each_row_is_padding_when_the_pad_token_is_named():
    """Axolotl's pad_to_sequence_len layout: no attention_mask, the pad run at a row's end has positions of
    its own (0, 1, 2, ...) and labels -100. With pad_token_id it is padding; without, one more example; a pad
    token inside a row, or a counted label on it, is not padding."""
    ids = torch.tensor([[1, 5, 6, 1, 7, 0, 0, 0], [1, 8, 0, 9, 0, 0, 0, 0]])
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2], [0, 1, 2, 3, 0, 1, 2, 3]])
    labels = torch.tensor([[-100, 5, 6, -100, 7, -100, -100, -100], [-100, 8, 0, 9, -100, -100, 0, -100]])
    batch = {"input_ids": ids, "position_ids": pos, "labels": labels}
    assert find_boundaries(batch).num_examples == 5  # the pad runs read as examples
    found = find_boundaries(batch, pad_token_id=0)
    want = torch.tensor([[0, 0, 0, 1, 1, -1, -1, -1], [2, 2, 2, 2, 3, 3, 3, -1]])  # row 1: a counted pad label
    assert torch.equal(found.seq_ids, want) and "pad token 0" in found.source
    with_mask = {**batch, "attention_mask": torch.ones_like(ids)}
    assert find_boundaries(with_mask, pad_token_id=0).num_examples == 5  # the mask decides where there is one


def test_text_positions_reads_every_documented_shape_and_refuses_the_rest():
    pos = torch.tensor([[0, 1, 2, 0, 1]])  # (1, T): two examples
    want = pos.expand(2, 5)
    for given in (pos[0], pos, pos.expand(2, 5), pos[None].expand(3, 2, 5), pos[None].expand(4, 1, 5)):
        assert torch.equal(text_positions(given, 2, 5), want), tuple(given.shape)
    for wrong in (pos.expand(3, 5), pos[:, :4], pos[None].expand(2, 1, 5)):
        with pytest.raises(PacksimError, match="multimodal-RoPE model's"):
            text_positions(wrong, 2, 5)


def test_find_boundaries_reads_mrope_rope_rows_by_their_text_row():
    rows = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])  # (1, 9): three examples
    four = {"input_ids": torch.ones(1, 9, dtype=torch.long), "position_ids": rows[None].expand(4, 1, 9)}
    assert find_boundaries(four).seq_ids.tolist() == [[0, 0, 0, 1, 1, 2, 2, 2, 2]]
    with pytest.raises(PacksimError, match="has shape \\(3, 9\\)"):
        find_boundaries({**four, "position_ids": rows.expand(3, 9)})


def test_a_batch_without_tokens_is_one_line():
    with pytest.raises(PacksimError, match="holds no token"):
        find_boundaries({"input_ids": torch.zeros(1, 0, dtype=torch.long)})

