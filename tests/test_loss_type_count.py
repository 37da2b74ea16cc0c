"""loss_over_accumulation names the real cause when num_items_in_batch counts labels the loss never predicts.

transformers 5.24's Trainer counts ``labels[..., 1:]`` only when ``model.loss_type`` maps to
``ForCausalLMLoss`` (trainer.py ``_loss_shifts_labels`` / ``_get_num_items_in_batch``);
``GPT2LMHeadModel`` gets ``loss_type=None`` from its class name (modeling_utils
``PreTrainedModel.__init__``), so with rows whose position-0 label is counted the Trainer divides
by more labels than the loss predicts. Llama, Qwen3 and Mistral (``*ForCausalLM``) count right.
The ground truth is computed here from the batch: the labels the loss predicts vs what
``get_batch_samples`` returns.
"""

from __future__ import annotations

import datasets
import pytest
import torch
import transformers
from pipelines import PAIRS, one_thread  # noqa: F401
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Trainer,
    TrainingArguments,
)

import packsim
from packsim.core.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, encode

transformers.logging.set_verbosity_error()
datasets.disable_progress_bars()

SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
FAMILIES = {
    "gpt2": lambda: GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB_SIZE, n_embd=32, n_layer=1, n_head=2,
                                               bos_token_id=BOS_ID, eos_token_id=EOS_ID)),
    "llama": lambda: LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB_SIZE, **SMALL)),
    "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(vocab_size=VOCAB_SIZE, head_dim=16, **SMALL)),
    "mistral": lambda: MistralForCausalLM(MistralConfig(vocab_size=VOCAB_SIZE, **SMALL)),
}


def lm_collate(features):
    """Right-padded rows, every real token a label (language modelling): position 0 is counted."""
    T = max(len(f["input_ids"]) for f in features)
    ids = torch.full((len(features), T), PAD_ID)
    for row, f in enumerate(features):
        ids[row, :len(f["input_ids"])] = torch.tensor(f["input_ids"])
    mask = (torch.arange(T)[None] < torch.tensor([len(f["input_ids"]) for f in features])[:, None]).long()
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def lm_trainer(family, tmp_path, loss_type=None):
    torch.manual_seed(0)
    model = FAMILIES[family]()
    if loss_type is not None:
        model.loss_type = loss_type  # the fix: before the Trainer reads it
    data = datasets.Dataset.from_list([{"input_ids": [BOS_ID] + encode(p + c) + [EOS_ID]} for p, c in PAIRS])
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=1,
                             report_to="none", save_strategy="no", use_cpu=True, remove_unused_columns=False,
                             use_cache=False, seed=0)
    return Trainer(model=model, args=args, train_dataset=data, data_collator=lm_collate)


def counts(trainer) -> tuple[int, int, int]:
    """(num_items_in_batch the Trainer computes, labels the loss predicts, rows with a position-0 label)."""
    batch = next(iter(trainer.get_train_dataloader()))
    _, items = trainer.get_batch_samples(iter([batch]), 1, trainer.args.device)
    labels = batch["labels"]
    return int(items), int((labels[:, 1:] != -100).sum()), int((labels[:, 0] != -100).sum())


def finding(report):
    return next(f for f in report.findings if f.name == "loss_over_accumulation")


def test_gpt2_counts_position_zero_labels_and_the_finding_says_so(tmp_path):
    trainer = lm_trainer("gpt2", tmp_path)
    items, predicted, row_starts = counts(trainer)
    assert trainer.model.loss_type is None and row_starts == 4 and items == predicted + row_starts
    found = finding(packsim.audit_trainer(trainer))
    assert found.status == "fail", found
    assert f"num_items_in_batch is {items} while the loss predicts {predicted} labels" in found.evidence
    assert "position 0 of a row" in found.evidence and "GPT2LMHeadModel.loss_type is None" in found.evidence
    assert "num_items_in_batch: a model forward" not in found.fix  # not the old, wrong cause
    assert found.fix.startswith("set model.loss_type = 'ForCausalLM' before building the Trainer")


def test_the_fix_passes(tmp_path):
    trainer = lm_trainer("gpt2", tmp_path, loss_type="ForCausalLM")
    items, predicted, _ = counts(trainer)
    assert items == predicted  # ground truth: now it counts labels[..., 1:]
    assert finding(packsim.audit_trainer(trainer)).status == "pass"


@pytest.mark.parametrize("family", ["llama", "qwen3", "mistral"])
def test_causal_lm_families_count_what_the_loss_predicts(family, tmp_path):
    trainer = lm_trainer(family, tmp_path)
    items, predicted, row_starts = counts(trainer)
    assert trainer.model.loss_type == "ForCausalLM" and row_starts == 4 and items == predicted
    assert finding(packsim.audit_trainer(trainer)).status == "pass"
