"""Tests for packsim.auditing.locate: the collator's examples read from its features and found in its batch."""

from __future__ import annotations

import torch

from packsim.auditing.locate import feature_examples, locate
from packsim.core.data import make_examples


def test_feature_examples_read_every_form_of_the_one_reading():
    ex = make_examples(1, seed=0)[0]
    features = [{"prompt_ids": [1, 5], "response_ids": [6, 2]},
                {"prompt_ids": [1], "completion_ids": [7, 2]},  # TRL's tokenized prompt-completion data
                {"input_ids": torch.tensor([1, 8, 2, 1, 9, 2]), "seq_lengths": [3, 3]},  # TRL's pre-packed row
                [1, 4, 2], ex]
    assert feature_examples(features) == [[1, 5, 6, 2], [1, 7, 2], [1, 8, 2], [1, 9, 2], [1, 4, 2], list(ex.tokens)]


def test_feature_examples_say_none_when_the_features_do_not_say():
    assert feature_examples([{"completion_mask": [0, 1]}]) is None  # a split, but no tokens
    assert feature_examples([{"prompt_ids": [1, 5]}]) is None  # no response key
    assert feature_examples([{"prompt_ids": [1, 2.5], "response_ids": [2]}]) is None  # not token ids
    assert feature_examples({"prompt_ids": [1], "response_ids": [2]}) is None  # a dict, not a list


def test_locate_finds_each_example_as_a_run():
    ids = torch.tensor([[1, 5, 6, 2, 1, 7, 2, 0]])
    seq, missing = locate(ids, [[1, 5, 6, 2], [1, 7, 2]])
    assert seq.tolist() == [[0, 0, 0, 0, 1, 1, 1, -1]] and missing == []


def test_feature_examples_read_rows_of_examples_as_axolotls_multipack_sampler_gives_them():
    """Axolotl 0.19's MultipackBatchSampler hands its collator a list of rows, each a list of feature dicts
    (benchmarks/axolotl): every example of every row, in order; one unreadable example gives None."""
    rows = [[{"input_ids": [1, 5, 6], "labels": [-100, 5, 6]}, {"input_ids": [1, 7]}], [{"input_ids": [1, 8, 9]}]]
    assert feature_examples(rows) == [[1, 5, 6], [1, 7], [1, 8, 9]]
    assert feature_examples([[{"input_ids": [1, 5]}, {"completion_mask": [0, 1]}]]) is None
