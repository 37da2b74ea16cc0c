"""response_mask_from_features: the response mask of collator features from their prompt/completion split."""

from __future__ import annotations

import pytest
import torch
from transformers import DataCollatorWithFlattening

from packsim.auditing.features import response_mask_from_features
from packsim.core.collator import PackingCollator
from packsim.core.data import make_examples
from packsim.core.errors import PacksimError


def test_flat_layout_matches_the_flattening_collator():
    features = [{"input_ids": [1, 5, 6, 7, 2], "labels": [-100, -100, 6, 7, 2], "completion_mask": [0, 0, 1, 1, 1]},
                {"input_ids": [1, 8, 2], "labels": [-100, 8, 2], "completion_mask": [0, 1, 1]}]
    batch = DataCollatorWithFlattening()(features)
    mask = response_mask_from_features(features)
    assert mask.shape == batch["input_ids"].shape == (1, 8)
    assert mask.tolist() == [[False, False, True, True, True, False, True, True]]


def test_prompt_ids_and_examples_match_packing_collator():
    examples = make_examples(3, seed=0)
    batch = PackingCollator().batch(examples)
    assert torch.equal(response_mask_from_features(examples), (batch.seq_ids >= 0) & (batch.roles >= 4))
    dicts = [{"prompt_ids": ex.tokens[:ex.n_prompt], "response_ids": ex.tokens[ex.n_prompt:]} for ex in examples]
    assert torch.equal(response_mask_from_features(dicts), response_mask_from_features(examples))


def test_padded_layout_and_assistant_masks():
    features = [{"completion_mask": [0, 1, 1], "assistant_masks": [0, 1, 0]}, {"completion_mask": [0, 1]}]
    assert response_mask_from_features(features, "padded").tolist() == [[False, True, False], [False, True, False]]
    left = response_mask_from_features(features, "padded", padding_side="left")
    assert left.tolist() == [[False, True, False], [False, False, True]]


def test_bad_features():
    with pytest.raises(PacksimError, match="none of which says where the prompt ends"):
        response_mask_from_features([{"input_ids": [1, 2], "labels": [1, 2]}])
    with pytest.raises(PacksimError, match="layout"):
        response_mask_from_features([{"completion_mask": [0, 1]}], layout="rows")
    with pytest.raises(PacksimError, match="no features"):
        response_mask_from_features([])


def test_completion_ids_and_a_mask_read_as_the_collator_reads_them():
    """The one reading (packsim.core.token_example.read_example): TRL's completion_ids, input_ids + mask."""
    response = [{"prompt_ids": [1, 5], "response_ids": [6, 2]}, {"prompt_ids": [1], "response_ids": [7, 8, 2]}]
    completion = [{"prompt_ids": f["prompt_ids"], "completion_ids": f["response_ids"]} for f in response]
    masked = [{"input_ids": f["prompt_ids"] + f["response_ids"],
               "completion_mask": [0] * len(f["prompt_ids"]) + [1] * len(f["response_ids"])} for f in response]
    truth = [[False, False, True, True, False, True, True, True]]
    for features in (response, completion, masked):
        assert response_mask_from_features(features).tolist() == truth
    assert torch.equal(PackingCollator().batch(completion).roles >= 4, torch.tensor(truth))
    with pytest.raises(PacksimError, match="3 input_ids but 2 entries of completion_mask"):
        response_mask_from_features([{"input_ids": [1, 5, 6], "completion_mask": [0, 1]}])
