"""Multi-turn examples: several EOS inside each example must not fail the special-token evidence.

Issue 21: without the dataset's examples, an EOS-only tokenizer (Qwen-style: eos == pad, no BOS)
with a multi-turn chat template (every turn ends with EOS) made the audit read each turn as an
example and fail ``special_tokens`` / ``boundary_fields`` on a correct batch. The EOS tokens are
evidence only where their count ties to the example count; here they cannot be tied, so the
report must say the verdict rests on the batch's own metadata (not FAIL), while a boundary moved
by one token (one EOS per example) stays caught, and with the examples (``audit_trainer`` reads
them from the dataset) the multi-turn fault is caught too. Pipelines and ground truth from
tests/test_evidence.py: a transformers Trainer with a padding-free collator written there, tiny
qwen3 (eos == pad, no BOS) and mistral (BOS + pad) models from configs; the leak through the
trainer's own ``compute_loss``, the fields against the example lengths the test knows.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")

import datasets  # noqa: E402
from pipelines import one_thread  # noqa: E402, F401
from test_evidence import FAMILIES, Flatten, build_model, draw, true_field_faults, true_leak  # noqa: E402
from transformers import Trainer, TrainingArguments  # noqa: E402

import packsim  # noqa: E402
from packsim.core.tokenizer import BOS_ID, EOS_ID, encode  # noqa: E402

# (user, assistant, user, assistant): each turn ends with EOS, as a chat template's end-of-turn
CHATS = [("hi:", "yo", "rev ab:", "ba"), ("abc=", "cba", "again:", "ok"), ("x+y=", "z", "and z?", "y"),
         ("sort 21:", "12", "up:", "UP"), ("k=v;", "v", "k?", "v"), ("add 2 3:", "5", "sub:", "1")]
TURNS_EOS = 4  # EOS tokens per example


def chat_features(family: str) -> list[dict]:
    bos = [BOS_ID] if FAMILIES[family][2] else []
    out = []
    for u1, a1, u2, a2 in CHATS:
        prompt = bos + encode(u1) + [EOS_ID] + encode(a1) + [EOS_ID] + encode(u2) + [EOS_ID]
        out.append({"prompt_ids": prompt, "response_ids": encode(a2) + [EOS_ID]})
    return out


def chat_trainer(family: str, collator, tmp_path) -> Trainer:
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=len(CHATS),
                             max_steps=1, report_to="none", save_strategy="no", use_cpu=True,
                             remove_unused_columns=False, seed=0)
    return Trainer(model=build_model(family), args=args, data_collator=collator,
                   train_dataset=datasets.Dataset.from_list(chat_features(family)))


def finding(report, name):
    return next(f for f in report.findings if f.name == name)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_multi_turn_batch_without_examples_is_not_a_false_failure(family, tmp_path):
    trainer = chat_trainer(family, Flatten(), tmp_path)
    batch, shapes = draw(trainer)
    # ground truth: the batch is right (no leak, every field matches the lengths), several EOS per example
    assert true_leak(trainer, batch, shapes) <= 1e-6 and true_field_faults(batch, shapes) == set()
    assert int((batch["input_ids"] == EOS_ID).sum()) == TURNS_EOS * len(CHATS)
    report = packsim.audit(trainer.model, batch, use_cache=False)
    metadata_only = family == "qwen3"  # eos only: nothing independent locates the examples
    assert report.status == ("unverified" if metadata_only else "pass") and report.ok != metadata_only, \
        report.table()
    assert not report.failed  # never a false failure
    trusted = packsim.audit(trainer.model, batch, use_cache=False, trust_boundaries=True)
    assert trusted.ok and trusted.status == "pass", trusted.table()
    tokens = finding(report, "special_tokens")
    if family == "qwen3":  # eos only: the EOS count (24 pieces) cannot be tied to 6 examples
        assert tokens.status == "skipped", report.table()
        assert f"split the rows into {TURNS_EOS * len(CHATS)} pieces where the batch's fields mark " \
               f"{len(CHATS)} examples" in tokens.evidence
        assert "not independent evidence" in tokens.evidence
        assert finding(report, "boundary_fields").status == "skipped"
        assert "rests on the batch's own metadata" in report.boundaries
        assert "rests on the batch's own metadata" in report.verdict
    else:  # a BOS starts each example: the tokens are evidence, the EOS inside are turn ends
        assert tokens.status == "pass" and "EOS token(s) sit inside an example" in tokens.evidence
        assert finding(report, "boundary_fields").status == "pass", report.table()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_one_token_moved_boundary_is_still_caught_without_examples(family, tmp_path):
    """One EOS per example: the count ties, so a late restart fails on the tokens alone."""
    from test_evidence import trainer_for

    trainer = trainer_for(family, Flatten("late"), tmp_path)
    batch, shapes = draw(trainer)
    assert true_leak(trainer, batch, shapes) > 1e-6 and "position_ids" in true_field_faults(batch, shapes)
    report = packsim.audit(trainer.model, batch, use_cache=False)
    assert finding(report, "special_tokens").status == "fail", report.table()
    assert {"perturbation", "boundary_fields"} <= set(report.failed), report.table()


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("fault", [None, "late"])
def test_multi_turn_trainer_audit_reads_the_examples(family, fault, tmp_path):
    """audit_trainer locates the dataset's multi-turn examples: right batch passes, late restart fails."""
    trainer = chat_trainer(family, Flatten(fault), tmp_path)
    report = packsim.audit_trainer(trainer)
    batch, shapes = draw(trainer)
    leak = true_leak(trainer, batch, shapes) > 1e-6
    fields = true_field_faults(batch, shapes)
    assert report.boundaries.startswith("the trainer's dataset examples"), report.boundaries
    assert ("perturbation" in report.failed) == leak, report.table()
    assert ("boundary_fields" in report.failed) == bool(fields), report.table()
    assert finding(report, "special_tokens").status == "pass", report.table()
    assert report.ok == (fault is None), report.table()


def test_multi_turn_fault_without_examples_does_not_claim_independent_evidence(tmp_path):
    """The honest limit: a late restart in multi-turn rows, batch alone, eos-only tokenizer."""
    trainer = chat_trainer("qwen3", Flatten("late"), tmp_path)
    batch, shapes = draw(trainer)
    assert true_leak(trainer, batch, shapes) > 1e-6  # ground truth: it leaks
    report = packsim.audit(trainer.model, batch, use_cache=False)
    assert finding(report, "boundary_fields").status == "skipped", report.table()
    assert finding(report, "special_tokens").status == "skipped", report.table()
    assert "rests on the batch's own metadata" in report.verdict, report.verdict
    assert report.status == "unverified" and not report.ok  # the leak goes unseen: never a pass
    given = packsim.audit(trainer.model, batch, use_cache=False,
                          examples=[f["prompt_ids"] + f["response_ids"] for f in chat_features("qwen3")])
    assert {"perturbation", "boundary_fields"} <= set(given.failed), given.table()
    assert torch.is_tensor(given.logit_change)
