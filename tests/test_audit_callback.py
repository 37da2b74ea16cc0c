"""packsim.AuditCallback: a leaking run stops before its first step, a correct run trains as without it.

Pipelines built here (tiny Llama from the local tokenizer's checkpoint, CPU): a transformers Trainer
with packsim's PackingCollator, leaking through a cache (use_cache=True) or not, and a subclass of
TRL's SFTTrainer with wrapped packing. The leak's ground truth is measured without packsim
(:func:`pipelines.leak_through_forward`).
"""

from __future__ import annotations

import warnings

import pytest
import torch

pytest.importorskip("trl")  # a dev dependency: CI installs it

import datasets  # noqa: E402
import transformers  # noqa: E402
from pipelines import PAIRS, leak_through_forward, one_thread, save_tiny_checkpoint  # noqa: E402, F401
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

import packsim  # noqa: E402
from packsim import PackingCollator  # noqa: E402
from packsim.auditing import AuditFailed  # noqa: E402
from packsim.core.tokenizer import BOS_ID, EOS_ID, encode  # noqa: E402

transformers.logging.set_verbosity_error()
datasets.disable_progress_bars()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("callback-llama"))


def plain(path, tmp_path, callbacks=(), use_cache=False):
    features = [{"prompt_ids": [BOS_ID] + encode(p), "response_ids": encode(c) + [EOS_ID]} for p, c in PAIRS]
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=1,
                             report_to="none", save_strategy="no", use_cpu=True, remove_unused_columns=False,
                             use_cache=use_cache, seed=0, learning_rate=1e-2)
    return Trainer(model=AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa"), args=args,
                   train_dataset=datasets.Dataset.from_list(features), data_collator=PackingCollator(),
                   callbacks=list(callbacks))


class MySFT(SFTTrainer):
    """A user's subclass: the callback finds it on the stack like any Trainer."""


def wrapped_sft(path, tmp_path, callbacks=()):
    data = datasets.Dataset.from_dict({"prompt": [p for p, _ in PAIRS], "completion": [c for _, c in PAIRS]})
    args = SFTConfig(output_dir=str(tmp_path / "out"), max_length=16, per_device_train_batch_size=4, max_steps=1,
                     report_to="none", save_strategy="no", bf16=False, use_cpu=True, seed=0, packing=True,
                     packing_strategy="wrapped")
    return MySFT(model=AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa"), args=args,
                 train_dataset=data, processing_class=AutoTokenizer.from_pretrained(path),
                 callbacks=list(callbacks))


def weights(trainer) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in trainer.model.parameters()])


def test_a_leaking_run_is_stopped_before_its_first_step(checkpoint, tmp_path):
    callback = packsim.AuditCallback()
    trainer = plain(checkpoint, tmp_path, [callback], use_cache=True)
    assert leak_through_forward(trainer) > 1e-3  # ground truth: examples see each other
    before = weights(trainer)
    with pytest.raises(AuditFailed) as info:
        trainer.train()
    assert trainer.state.global_step == 0 and torch.equal(weights(trainer), before)  # nothing trained
    message = str(info.value)
    assert message.startswith("packsim.AuditCallback stopped training before the first step")
    assert "FAIL (perturbation" in message and "cache" in message
    assert info.value.report is callback.report and callback.report.status == "fail"


def test_a_correct_run_trains_exactly_as_without_the_callback(checkpoint, tmp_path):
    callback = packsim.AuditCallback()
    audited = plain(checkpoint, tmp_path / "a", [callback])
    assert leak_through_forward(audited) <= 1e-5  # ground truth: isolated
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a pass does not warn
        audited.train()
    assert audited.state.global_step == 1 and callback.report.status == "pass", callback.report.table()
    bare = plain(checkpoint, tmp_path / "b")
    bare.train()
    assert torch.equal(weights(audited), weights(bare))  # the audit's randomness did not leak into training


def test_warn_only_warns_and_trains_on(checkpoint, tmp_path):
    trainer = plain(checkpoint, tmp_path, [packsim.AuditCallback(warn_only=True)], use_cache=True)
    with pytest.warns(UserWarning, match=r"warn_only\): the audit of the training batches failed"):
        trainer.train()
    assert trainer.state.global_step == 1


def test_an_sft_trainer_subclass_with_wrapped_packing_is_stopped(checkpoint, tmp_path):
    trainer = wrapped_sft(checkpoint, tmp_path, [packsim.AuditCallback()])
    assert leak_through_forward(trainer) > 1e-3  # wrapped rows: examples attend across their start
    with pytest.raises(AuditFailed, match="wrapped_packing"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_the_trainer_can_be_given(checkpoint, tmp_path):
    trainer = plain(checkpoint, tmp_path, use_cache=True)
    callback = packsim.AuditCallback(trainer, batches=2)
    trainer.add_callback(callback)
    with pytest.raises(AuditFailed):
        trainer.train()
    assert next(f for f in callback.report.findings if f.name == "batches").evidence.startswith("2 batches")


def bfd_sft_bf16(path, tmp_path, callbacks=()):
    """TRL's defaults as a user keeps them: BFD packing (position_ids restart per example) and bf16=True
    (CPU autocast), on the local tokenizer's tiny Llama."""
    data = datasets.Dataset.from_dict({"prompt": [p for p, _ in PAIRS], "completion": [c for _, c in PAIRS]})
    args = SFTConfig(output_dir=str(tmp_path / "out"), max_length=64, per_device_train_batch_size=4, max_steps=2,
                     report_to="none", save_strategy="no", bf16=True, use_cpu=True, seed=0, packing=True,
                     packing_strategy="bfd", learning_rate=1e-2)
    return SFTTrainer(model=AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa"), args=args,
                      train_dataset=data, processing_class=AutoTokenizer.from_pretrained(path),
                      callbacks=list(callbacks))


def test_a_correct_bf16_run_is_not_stopped_and_trains_as_without_the_callback(checkpoint, tmp_path):
    """Once train() starts, accelerate returns float32 logits computed in bf16: the tolerance must follow
    the bf16 computation (3e-02), not the float32 it returns (1e-05), or bf16 rounding stops a correct run.
    So must the loss check's: SFTTrainer.compute_loss takes the loss from the hidden states, not from the
    logits the audit sees (TRL 1.9: the chunked-CE forward of loss_type 'chunked_nll'; 1.16: the fused LM
    head), and under bf16 the two differ by bf16 rounding: 1.6e-04 relative on TRL 1.9 (above float32's
    1e-04), 3e-08 on 1.16."""
    reference = bfd_sft_bf16(checkpoint, tmp_path / "a")
    assert leak_through_forward(reference) < 1e-5  # ground truth: BFD with position_ids isolates (fp32 here)
    reference.train()
    callback = packsim.AuditCallback()
    trainer = bfd_sft_bf16(checkpoint, tmp_path / "b", [callback])
    trainer.train()
    assert callback.report.status == "pass", callback.report.table()
    assert "tolerance 3e-02, from the bfloat16 logits this forward computes under mixed precision 'bf16'" \
        in callback.report.forward
    loss = next(f for f in callback.report.findings if f.name == "loss_over_accumulation")
    assert loss.status == "pass" and "tolerance 1e-02)" in loss.evidence, loss.evidence
    assert trainer.state.global_step == 2 and torch.equal(weights(trainer), weights(reference))


class GrowingCollator:
    """A user's collator whose later batches pack more: the first two examples (PackingCollator, correct)
    until ``grow`` is set, then every example in one row with the last one's positions continuing (a
    leak only the larger batch has)."""

    grow = False

    def __call__(self, features):
        if not self.grow:
            return PackingCollator()(features[:2])
        ids, pos, labels = [], [], []
        for k, f in enumerate(features):
            tokens = f["prompt_ids"] + f["response_ids"]
            start = pos[-1] + 1 if k == len(features) - 1 else 0  # the last example's positions continue
            ids, pos = ids + tokens, pos + list(range(start, start + len(tokens)))
            labels += [-100] * len(f["prompt_ids"]) + f["response_ids"]
        return {"input_ids": torch.tensor([ids]), "position_ids": torch.tensor([pos]),
                "labels": torch.tensor([labels])}


class GrowAfterFirstStep(transformers.TrainerCallback):
    def __init__(self, collator):
        self.collator = collator

    def on_step_end(self, args, state, control, **kwargs):
        self.collator.grow = True  # the batches collated from now on are the larger ones


def test_the_callback_re_audits_a_batch_that_grows_past_what_it_audited(checkpoint, tmp_path):
    features = [{"prompt_ids": [BOS_ID] + encode(p), "response_ids": encode(c) + [EOS_ID]} for p, c in PAIRS]
    collator = GrowingCollator()
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=len(features),
                             max_steps=3, report_to="none", save_strategy="no", use_cpu=True,
                             remove_unused_columns=False, seed=0, learning_rate=1e-2)
    callback = packsim.AuditCallback(reaudits=1)
    trainer = Trainer(model=AutoModelForCausalLM.from_pretrained(checkpoint, attn_implementation="sdpa"),
                      args=args, train_dataset=datasets.Dataset.from_list(features), data_collator=collator,
                      callbacks=[callback, GrowAfterFirstStep(collator)])
    with pytest.raises(AuditFailed):
        trainer.train()
    assert len(callback.reports) == 2 and callback.reports[0].status == "pass", callback.reports[0].table()
    assert callback.reports[1].status == "fail" and "perturbation" in callback.reports[1].failed
    assert 1 <= trainer.state.global_step < 3  # the first steps trained; the grown, leaking batch did not


@pytest.mark.parametrize("kwargs, says", [
    ({"foo": 1}, "AuditCallback got foo: it takes"),
    ({"batches": 0}, "batches=0"), ({"reaudits": -1}, "reaudits=-1"), ({"tol": float("nan")}, "finite tolerance"),
    ({"max_examples": 0}, "max_examples=0"), ({"objective": "rl"}, "objective='rl'"),
])
def test_bad_options_are_one_line_when_the_callback_is_made(kwargs, says):
    """Not when train() has built the optimizer and the dataloader (an unknown keyword was a TypeError then)."""
    from packsim.core.errors import PacksimError

    with pytest.raises(PacksimError, match=says):
        packsim.AuditCallback(**kwargs)
