"""Tests for packsim.core.token_example: the one reading of an example, in every form, and of an id list."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from packsim.core.data import make_examples
from packsim.core.errors import PacksimError
from packsim.core.token_example import TokenExample, as_example, id_list, read_example

PROMPT, RESPONSE = [1, 5, 6], [7, 8, 2]  # BOS + prompt, response + EOS
TOKENS, FLAGS = PROMPT + RESPONSE, [False] * 3 + [True] * 3  # ground truth of every form below


@pytest.mark.parametrize("item", [
    {"prompt_ids": PROMPT, "response_ids": RESPONSE},
    {"prompt_ids": PROMPT, "completion_ids": RESPONSE},  # TRL's tokenized prompt-completion data
    {"input_ids": TOKENS, "completion_mask": [0, 0, 0, 1, 1, 1]},  # TRL's tokenization
    {"input_ids": torch.tensor(TOKENS), "completion_mask": torch.tensor(FLAGS).int(),
     "assistant_masks": [1] * 6},  # both masks: response where both say so
    TokenExample(tuple(TOKENS), 3),
])
def test_every_form_reads_the_same_example(item):
    assert read_example(item) == (TOKENS, FLAGS)
    assert as_example(item).tokens == tuple(TOKENS) and as_example(item).n_prompt == 3


def test_a_packsim_example_is_read_as_is():
    ex = make_examples(1, seed=0)[0]
    assert as_example(ex) is ex
    tokens, flags = read_example(ex)
    assert tokens == list(ex.tokens) and flags.index(True) == ex.n_prompt


def test_read_example_keeps_what_as_example_refuses():
    assert read_example({"completion_mask": [0, 1, 1]}) == (None, [False, True, True])  # no input_ids
    assert read_example({"prompt_ids": [1, 5], "response_ids": []}) == ([1, 5], [False, False])
    multi = {"input_ids": [1, 5, 7, 6, 8], "assistant_masks": [0, 0, 1, 0, 1]}  # two assistant turns
    assert read_example(multi) == ([1, 5, 7, 6, 8], [False, False, True, False, True])
    with pytest.raises(PacksimError, match="more than one response .*prompt token at 3"):
        as_example(multi)
    with pytest.raises(PacksimError, match="no 'input_ids'"):
        as_example({"completion_mask": [0, 1, 1]})
    with pytest.raises(PacksimError, match="no completion_ids"):
        as_example({"prompt_ids": [1, 5], "completion_ids": []})
    with pytest.raises(PacksimError, match="no prompt tokens"):
        as_example({"input_ids": [7, 2], "completion_mask": [1, 1]})
    with pytest.raises(PacksimError, match="no response tokens"):
        as_example({"input_ids": [1, 5], "completion_mask": [0, 0]})


def test_bad_items_are_one_line_errors():
    with pytest.raises(PacksimError, match="none of which says where the prompt ends.*'prompt_ids' and 'response_ids'"):
        read_example({"input_ids": [1, 2], "labels": [1, 2]}, 4)
    with pytest.raises(PacksimError, match="3 input_ids but 2 entries of completion_mask"):
        read_example({"input_ids": [1, 2, 3], "completion_mask": [0, 1]})
    with pytest.raises(PacksimError, match="different lengths"):
        read_example({"completion_mask": [0, 1], "assistant_masks": [0, 1, 1]})
    with pytest.raises(PacksimError, match="example 2 is a int"):
        as_example(3, 2, "example")


def test_id_list_reads_tensors_arrays_and_integer_lists():
    assert id_list(torch.tensor([3, 4])) == [3, 4]
    assert id_list(np.array([3, 4], dtype=np.int64)) == [3, 4]
    out = id_list([np.int64(3), 4])
    assert out == [3, 4] and all(type(t) is int for t in out)
    with pytest.raises(PacksimError, match=r"x\['ids'\] must be a list of token ids, got str"):
        id_list("34", "x['ids']")
    with pytest.raises(PacksimError, match="holds True .*not a token id"):
        id_list([1, True])
    with pytest.raises(PacksimError, match="holds 2.5"):
        id_list([1, 2.5])
