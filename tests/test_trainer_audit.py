"""packsim.audit_trainer on real TRL SFTTrainers and transformers Trainers built here (tiny Llama, CPU)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")  # a dev dependency: CI installs it, so these tests run there

import datasets  # noqa: E402
import transformers  # noqa: E402
from pipelines import PAIRS, one_thread, save_tiny_checkpoint  # noqa: E402, F401
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

import packsim  # noqa: E402
from packsim import PackingCollator  # noqa: E402
from packsim.auditing.report import Finding  # noqa: E402
from packsim.core.errors import PacksimError  # noqa: E402
from packsim.core.tokenizer import BOS_ID, EOS_ID, encode  # noqa: E402

transformers.logging.set_verbosity_error()
datasets.disable_progress_bars()



@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Llama and the local tokenizer, saved as any from_pretrained directory."""
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"))


def _model(path, attn="sdpa"):
    return AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn)


def sft(path, tmp_path, **config):
    data = datasets.Dataset.from_dict({"prompt": [p for p, _ in PAIRS], "completion": [c for _, c in PAIRS]})
    args = SFTConfig(output_dir=str(tmp_path / "out"), max_length=config.pop("max_length", 48),
                     per_device_train_batch_size=config.pop("batch_size", 4), max_steps=1,
                     report_to="none", save_strategy="no", bf16=False, use_cpu=True, seed=0, **config)
    return SFTTrainer(model=_model(path), args=args, train_dataset=data,
                      processing_class=AutoTokenizer.from_pretrained(path))


def plain(path, tmp_path, collator, use_cache=False, **args):
    features = [{"prompt_ids": [BOS_ID] + encode(p), "response_ids": encode(c) + [EOS_ID]} for p, c in PAIRS]
    targs = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=args.pop("batch_size", 4),
                              max_steps=1, report_to="none", save_strategy="no", use_cpu=True,
                              remove_unused_columns=False, use_cache=use_cache, seed=0, **args)
    return Trainer(model=_model(path), args=targs, train_dataset=datasets.Dataset.from_list(features),
                   data_collator=collator)


def independent_leak(trainer) -> float:
    """Largest logit change of one example when another's tokens change, computed here without packsim.

    Examples start at each BOS (the local tokenizer puts one at the start of every example); the
    forward is the one compute_loss makes (SFTTrainer adds use_cache=False), without labels.
    """
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    ids = batch["input_ids"]
    rest = {k: v for k, v in batch.items() if k not in ("input_ids", "labels")}
    if isinstance(trainer, SFTTrainer):
        rest["use_cache"] = False
    starts = ids == BOS_ID
    starts[:, 0] = True
    seq = starts.reshape(-1).cumsum(0).reshape(ids.shape) - 1  # (B, T): example index per token
    real = batch["attention_mask"].bool() if "attention_mask" in batch else torch.ones_like(starts)
    model = trainer.model.eval()
    with torch.no_grad():
        base = model(input_ids=ids, **rest).logits
        worst = 0.0
        for k in range(int(seq.max()) + 1):
            changed = torch.where(seq == k, (ids + 5) % model.config.vocab_size, ids)
            diff = (model(input_ids=changed, **rest).logits - base).abs().amax(-1)  # (B, T)
            others = (seq != k) & real
            worst = max(worst, float(diff[others].max()) if bool(others.any()) else 0.0)
    return worst


def agrees(report, trainer) -> bool:
    return report.probes["perturbation"].failed == (independent_leak(trainer) > 1e-5)


# ----------------------------------------------------------------------------- TRL


def test_trl_bfd_packing_on_sdpa_passes(checkpoint, tmp_path):
    trainer = sft(checkpoint, tmp_path, packing=True)  # packing_strategy="bfd": padding-free rows
    report = packsim.audit_trainer(trainer)
    assert report.ok, report.table()
    # the examples come from TRL's packed dataset rows (split by seq_lengths), located in the batch
    assert report.boundaries.startswith("the trainer's dataset examples") and len(report.example_ids) == 8
    fields = next(f for f in report.findings if f.name == "boundary_fields")
    assert fields.status == "pass" and "position_ids, cu_seq_lens_q, cu_seq_lens_k, seq_idx mark exactly these 8" \
        in fields.evidence, fields.evidence
    assert {f.name: f.status for f in report.findings} == {
        "wrapped_packing": "pass", "padding_free_attention": "pass", "attention_mask": "pass",
        "flash_rows": "pass", "cache": "pass", "completion_only_loss": "pass",
        "loss_over_accumulation": "pass", "loss_across_devices": "skipped", "truncated_examples": "pass",
        "boundary_fields": "pass", "special_tokens": "pass"}
    assert "use_cache=False" in report.forward and "attn_implementation='sdpa'" in report.forward
    assert agrees(report, trainer)


class _LateRestart:
    """Wraps a padding-free collator: position_ids restart one token after each example's first token."""

    def __init__(self, collate):
        self.collate = collate

    def __call__(self, features):
        batch = self.collate(features)
        pos = batch["position_ids"].clone()  # (1, N)
        starts = (pos[0] == 0).nonzero().flatten()[1:]
        for s in starts.tolist():
            end = s + 1
            while end < pos.shape[1] and pos[0, end] != 0:
                end += 1
            pos[0, s] = pos[0, s - 1] + 1
            pos[0, s + 1:end] = torch.arange(end - s - 1)
        batch["position_ids"] = pos
        for key in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx"):
            batch.pop(key, None)  # only position_ids mark the examples, as DataCollatorWithFlattening's default
        return batch


def test_trl_bfd_with_positions_restarting_late_fails_with_the_field_named(checkpoint, tmp_path):
    trainer = sft(checkpoint, tmp_path, packing=True)
    trainer.data_collator = _LateRestart(trainer.data_collator)
    report = packsim.audit_trainer(trainer)
    assert {"perturbation", "gradient", "boundary_fields"} <= set(report.failed), report.table()
    fields = next(f for f in report.findings if f.name == "boundary_fields")
    assert "position_ids restart at token" in fields.evidence and ", the example starts at token" in fields.evidence
    eos = next(f for f in report.findings if f.name == "special_tokens")
    assert "8 of 8 examples end with EOS" in eos.evidence  # the symptom the fields hid ("EOS 1/1")
    assert agrees(report, trainer)  # the test's own perturbation, boundaries from BOS


def test_trl_wrapped_packing_fails_on_perturbation(checkpoint, tmp_path):
    trainer = sft(checkpoint, tmp_path, packing=True, packing_strategy="wrapped", max_length=16)
    report = packsim.audit_trainer(trainer)
    assert {"perturbation", "gradient", "wrapped_packing"} <= set(report.failed), report.table()
    assert report.boundaries.startswith("the tokens")  # the batch itself marks no boundary
    wrapped = next(f for f in report.findings if f.name == "wrapped_packing")
    assert "packing_strategy='wrapped'" in wrapped.evidence and "start in the middle" in wrapped.evidence
    assert report.causes[0].startswith("wrapped_packing: use packing_strategy='bfd'")
    assert agrees(report, trainer)
    text, page = report.table(), report.to_html()  # the report explains its numbers and its skips
    assert ".;" not in report.verdict and "Not measured (skipped: attention_mass" in report.verdict
    assert "skipped attention_mass: not measured, so it is neither a pass nor a fail" in text
    assert "attn_implementation='eager'" in text
    assert "reading the numbers" in text and "gradient ratio" in text.split("worst pair:")[1]
    assert "findings (configuration checks):" in text and "<code>wrapped_packing</code>" in page


def test_trl_completion_only_loss_off_fails_on_loss_coverage(checkpoint, tmp_path):
    trainer = sft(checkpoint, tmp_path, packing=True, completion_only_loss=False)
    report = packsim.audit_trainer(trainer)
    assert set(report.failed) == {"loss_coverage", "completion_only_loss"}, report.table()
    assert "every" in report.probes["loss_coverage"].details["problems"]
    assert agrees(report, trainer)


def test_trl_language_modelling_data_counts_every_token(checkpoint, tmp_path):
    data = datasets.Dataset.from_dict({"text": [p + c for p, c in PAIRS]})
    args = SFTConfig(output_dir=str(tmp_path / "out"), max_length=48, per_device_train_batch_size=4,
                     max_steps=1, report_to="none", save_strategy="no", bf16=False, use_cpu=True, packing=True)
    trainer = SFTTrainer(model=_model(checkpoint), args=args, train_dataset=data,
                         processing_class=AutoTokenizer.from_pretrained(checkpoint))
    report = packsim.audit_trainer(trainer)
    assert report.ok, report.table()
    assert "language-modelling data" in report.probes["loss_coverage"].summary


# ----------------------------------------------------------------------------- transformers Trainer


def test_plain_trainer_with_packing_collator_passes(checkpoint, tmp_path):
    trainer = plain(checkpoint, tmp_path, PackingCollator())
    report = packsim.audit_trainer(trainer)
    assert report.ok, report.table()
    counts = report.probes["loss_coverage"].details["counts"]
    assert counts["prompt"][0] == 0 and counts["response"][0] == counts["response"][1] > 0
    assert "features' prompt/completion split" in report.probes["loss_coverage"].summary
    assert agrees(report, trainer)


def test_plain_trainer_with_a_cache_fails(checkpoint, tmp_path):
    trainer = plain(checkpoint, tmp_path, PackingCollator(), use_cache=True)
    report = packsim.audit_trainer(trainer)
    assert {"perturbation", "cache"} <= set(report.failed), report.table()
    cache = next(f for f in report.findings if f.name == "cache")
    assert "DynamicCache" in cache.evidence and "use_cache=False" in cache.fix
    assert agrees(report, trainer)


def test_plain_trainer_prompt_labels_fail_the_completion_check(checkpoint, tmp_path):
    trainer = plain(checkpoint, tmp_path, PackingCollator(setup="mask_fix"))  # loss "all"
    report = packsim.audit_trainer(trainer)
    assert set(report.failed) == {"loss_coverage", "completion_only_loss"}, report.table()


def test_mean_of_micro_batch_means_fails_loss_over_accumulation(checkpoint, tmp_path):
    trainer = plain(checkpoint, tmp_path, PackingCollator(), gradient_accumulation_steps=2, batch_size=3)
    trainer.model_accepts_loss_kwargs = False  # as for a model whose forward takes no loss kwargs
    report = packsim.audit_trainer(trainer)
    finding = next(f for f in report.findings if f.name == "loss_over_accumulation")
    assert finding.status == "fail" and "then divided by 2" in finding.evidence, report.table()
    assert report.failed == ["loss_over_accumulation"]


def test_several_batches_and_the_model_mode_is_restored(checkpoint, tmp_path):
    trainer = plain(checkpoint, tmp_path, PackingCollator(), batch_size=2)
    trainer.model.eval()
    report = packsim.audit_trainer(trainer, batches=3)
    batches = next(f for f in report.findings if f.name == "batches")
    assert batches.status == "pass" and batches.evidence.startswith("3 batches audited, 0 failed")
    assert not trainer.model.training


# ----------------------------------------------------------------------------- report and input


def test_bad_input():
    with pytest.raises(PacksimError, match="Trainer or trl.SFTTrainer"):
        packsim.audit_trainer(object())
    with pytest.raises(ValueError, match="status"):
        Finding("x", "ok", "evidence")
