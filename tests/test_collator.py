"""packsim.core.collator.PackingCollator: DataCollatorWithFlattening's format, isolation, the Trainer."""

from __future__ import annotations

import math

import pytest
import torch
from toy import VOCAB, toy_examples
from transformers import DataCollatorWithFlattening, Trainer, TrainingArguments

import packsim
from packsim.auditing.features import response_mask_from_features
from packsim.core.collator import PackingCollator
from packsim.core.data import make_examples
from packsim.core.errors import PacksimError
from packsim.core.loss import IGNORE_INDEX
from packsim.core.model import build_model

SHAPES = [(4, 3), (6, 5), (2, 5), (5, 6), (3, 4)]


@pytest.fixture(scope="module")
def examples():
    return toy_examples(SHAPES, seed=3)


def hf_flattened(examples) -> dict:
    """transformers' collator on the same ids, labels with the prompt set to -100 (completion only)."""
    feats = [{"input_ids": list(ex.tokens),
              "labels": [IGNORE_INDEX] * ex.n_prompt + list(ex.tokens[ex.n_prompt:])} for ex in examples]
    return DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)(feats)


response_mask = response_mask_from_features  # (1, N) bool, True on response tokens and EOS


def test_output_equals_data_collator_with_flattening(examples):
    ours = PackingCollator(setup="correct", return_flash_attn_kwargs=True, return_seq_idx=True)(examples)
    theirs = hf_flattened(examples)
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        if isinstance(value, torch.Tensor):
            assert ours[key].dtype == value.dtype, key
            assert torch.equal(ours[key], value), key
        else:
            assert ours[key] == value, key


def test_default_fields_and_dict_features(examples):
    feats = [{"prompt_ids": list(ex.tokens[:ex.n_prompt]), "response_ids": list(ex.tokens[ex.n_prompt:])}
             for ex in examples]
    out = PackingCollator()(feats)
    assert set(out) == {"input_ids", "labels", "position_ids"}
    ref = PackingCollator()(examples)
    assert all(torch.equal(out[k], ref[k]) for k in out)
    fa = PackingCollator(return_flash_attn_kwargs=True)(feats)
    assert fa["cu_seq_lens_q"].dtype == torch.int32 and fa["max_length_q"] == max(len(e.tokens) for e in examples)


def test_all_token_loss_counts_prompts_but_never_a_first_token(examples):
    out = PackingCollator(setup="buggy", return_flash_attn_kwargs=True)(examples)
    labels, ids, cu = out["labels"][0], out["input_ids"][0], out["cu_seq_lens_q"]
    starts = cu[:-1].long()
    assert (labels[starts] == IGNORE_INDEX).all()
    keep = torch.ones_like(labels, dtype=torch.bool)
    keep[starts] = False
    assert torch.equal(labels[keep], ids[keep])


def test_forward_equals_each_example_alone(examples):
    model = build_model("tiny", vocab_size=VOCAB, attn_implementation="eager", seed=0)
    batch = PackingCollator(return_flash_attn_kwargs=True)(examples)
    with torch.no_grad():
        packed = model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits[0]
        start = 0
        for ex in examples:
            ids = torch.tensor(ex.tokens)[None]
            alone = model(input_ids=ids, position_ids=torch.arange(ids.shape[1])[None], use_cache=False).logits[0]
            diff = (packed[start:start + len(ex.tokens)] - alone).abs().max().item()
            assert diff <= 1e-5, f"example at {start} differs by {diff}"
            start += len(ex.tokens)


@pytest.mark.parametrize("impl", ["eager", "packsim"])
def test_audit_passes_without_cache(examples, impl):
    model = build_model("tiny", vocab_size=VOCAB, attn_implementation=impl, seed=0)
    batch = PackingCollator(return_flash_attn_kwargs=True)(examples)
    report = packsim.audit(model, batch, response_mask(examples), use_cache=False)
    assert report.ok, report.table()


def test_audit_fails_with_a_cache(examples):
    model = build_model("tiny", vocab_size=VOCAB, attn_implementation="eager", seed=0)
    batch = PackingCollator(return_flash_attn_kwargs=True)(examples)
    report = packsim.audit(model, batch, response_mask(examples), use_cache=True)
    assert {"perturbation", "gradient", "attention_mass"} <= set(report.failed), report.table()
    assert "a cache was created" in report.causes[0]


def test_trainer_runs_a_few_steps_on_cpu(tmp_path):
    torch.manual_seed(0)
    examples = make_examples(64, seed=0)
    model = build_model("tiny", seed=0)  # packsim attention: reads cu_seq_lens_q
    model.train()
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=16, max_steps=8,
                             learning_rate=3e-3, warmup_steps=0, logging_steps=1, report_to=[],
                             use_cpu=True, remove_unused_columns=False, save_strategy="no", seed=0,
                             dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=examples,
                      data_collator=PackingCollator(return_flash_attn_kwargs=True))
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 8 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize(("features", "match"), [
    ([], "empty list"),
    ({"prompt_ids": [1], "response_ids": [2]}, "list of features"),
    ([{"input_ids": [1, 2, 3]}], "'prompt_ids' and 'response_ids'"),
    ([{"prompt_ids": [1, 5], "response_ids": []}], "no response_ids"),
    ([{"prompt_ids": [], "response_ids": [4, 2]}], "no prompt_ids"),
    ([{"prompt_ids": "hello", "response_ids": [4, 2]}], "list of token ids"),
    ([{"prompt_ids": [1, 2.5], "response_ids": [4, 2]}], "not a token id"),
    ([3], "feature 0 is a int"),
])
def test_bad_input_is_a_clear_error(features, match):
    with pytest.raises(PacksimError, match=match):
        PackingCollator()(features)


def test_vocab_is_checked_when_given():
    with pytest.raises(PacksimError, match="outside the vocabulary"):
        PackingCollator(vocab_size=10)([{"prompt_ids": [1, 50], "response_ids": [4, 2]}])
