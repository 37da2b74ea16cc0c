"""packsim.auditing.trainer_batch: a Trainer's batches drawn with their features, their examples located.

The whole audit of real Trainers is in tests/test_trainer_audit.py; here each reader on a tiny
transformers ``Trainer`` (the library's collator, CPU), with the examples written down in the test.
"""

from __future__ import annotations

import datasets
import pytest
import torch
from transformers import Trainer, TrainingArguments

from packsim import PackingCollator, build_model
from packsim.auditing.trainer_batch import (
    batch_evidence,
    batch_view,
    draw_batches,
    is_wrapped,
    response_mask,
    same_fields,
)
from packsim.core.errors import PacksimError
from packsim.core.tokenizer import BOS_ID, EOS_ID

# three examples: (prompt ids, response ids), BOS first and EOS last as the local tokenizer writes them
EXAMPLES = [([BOS_ID, 7, 8], [9, EOS_ID]), ([BOS_ID, 10], [11, 12, EOS_ID]), ([BOS_ID, 13, 14, 15], [16, EOS_ID])]


def trainer(tmp_path) -> Trainer:
    features = [{"prompt_ids": p, "response_ids": r} for p, r in EXAMPLES]
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=len(EXAMPLES), max_steps=1,
                             report_to="none", save_strategy="no", use_cpu=True, remove_unused_columns=False,
                             seed=0)
    return Trainer(model=build_model("tiny", seed=0, attn_implementation="sdpa"), args=args,
                   train_dataset=datasets.Dataset.from_list(features), data_collator=PackingCollator("correct"))


def expected_seq(order) -> torch.Tensor:
    """(1, T) example index of one packed row holding the examples in ``order`` (computed from EXAMPLES)."""
    return torch.tensor([[k for k, i in enumerate(order) for _ in EXAMPLES[i][0] + EXAMPLES[i][1]]])


def drawn_view(tmp_path):
    t = trainer(tmp_path)
    (raw, features), = draw_batches(t, 1)
    fields = t._prepare_inputs(raw)
    view = batch_view(t, t.model, fields)
    return t, features, view


def test_draw_batches_keeps_each_batchs_features_and_puts_the_collator_back(tmp_path):
    t = trainer(tmp_path)
    collator = t.data_collator
    (batch, features), = draw_batches(t, 1)
    assert t.data_collator is collator
    assert sorted((f["prompt_ids"], f["response_ids"]) for f in features) == sorted(EXAMPLES)
    assert batch["input_ids"].shape == (1, sum(len(p) + len(r) for p, r in EXAMPLES))  # one row, no padding


def test_draw_batches_says_what_to_do_with_an_empty_dataloader(tmp_path):
    t = trainer(tmp_path)
    t.get_train_dataloader = lambda: iter(())
    with pytest.raises(PacksimError, match="no batch: give it a non-empty train_dataset"):
        draw_batches(t, 1)


def test_the_examples_come_from_the_features_and_confirm_the_fields(tmp_path):
    t, features, view = drawn_view(tmp_path)
    ev = batch_evidence(t, t.model, view, features)
    ids = view.fields["input_ids"][0].tolist()
    order = [next(i for i, (p, r) in enumerate(EXAMPLES) if ids[s:s + len(p) + len(r)] == p + r)
             for s in (0, *[k for k in range(1, len(ids)) if ids[k] == BOS_ID])]
    assert torch.equal(view.seq, expected_seq(order))
    assert ev.source.startswith("the trainer's dataset examples") and view.source == ev.source


def concatenate(features) -> dict:
    """A collator that packs one row and writes no boundary field (the plain causal pack)."""
    ids = torch.tensor([[x for f in features for x in f["prompt_ids"] + f["response_ids"]]])  # (1, T)
    return {"input_ids": ids, "labels": ids.clone()}


def test_without_boundary_fields_the_tokens_find_the_examples(tmp_path):
    """A BOS after a row's first token starts an example."""
    t = trainer(tmp_path)
    t.data_collator = concatenate
    (raw, _features), = draw_batches(t, 1)
    view = batch_view(t, t.model, t._prepare_inputs(raw))
    assert view.from_tokens and torch.equal(view.seq.unique(), torch.tensor([0, 1, 2]))
    starts = [k for k, x in enumerate(view.fields["input_ids"][0].tolist()) if x == BOS_ID]
    assert [int((view.seq[0] == e).nonzero()[0]) for e in range(3)] == starts


def test_response_mask_is_the_features_split_in_batch_order(tmp_path):
    t, features, view = drawn_view(tmp_path)
    batch_evidence(t, t.model, view, features)
    mask, where = response_mask(t, view, features)
    want = [flag for f in features for flag in [False] * len(f["prompt_ids"]) + [True] * len(f["response_ids"])]
    assert where == "the collated features' prompt/completion split"
    assert mask[0].tolist() == want
    lm, lm_where = response_mask(t, view, features, objective="lm")
    assert bool(lm.all()) and "objective='lm'" in lm_where
    assert response_mask(t, view, None) == (None, None)  # a plain Trainer without features: unknown


def test_same_fields_compares_tensors_by_value_and_ignores_labels():
    fields = {"input_ids": torch.tensor([[1, 2, 3]]), "labels": torch.tensor([[1, 2, 3]]), "flag": True}
    assert same_fields({"input_ids": torch.tensor([[1, 2, 3]]), "flag": True}, fields)
    assert not same_fields({"input_ids": torch.tensor([[1, 2, 4]]), "flag": True}, fields)
    assert not same_fields({"input_ids": torch.tensor([[1, 2, 3]])}, fields)
    assert not same_fields({"input_ids": [[1, 2, 3]], "flag": True}, fields)
    assert not same_fields({"input_ids": torch.tensor([[1, 2, 3]]), "flag": False}, fields)


def test_only_trls_wrapped_packing_cuts_at_rows(tmp_path):
    assert not is_wrapped(trainer(tmp_path))  # a transformers Trainer never wraps
