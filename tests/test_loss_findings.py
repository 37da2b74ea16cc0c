"""packsim.auditing.loss_findings on stand-in trainers: the settings read, each verdict from its rule.

Real SFTTrainers and Trainers through audit_trainer are in tests/test_trainer_audit.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from packsim.auditing.loss_findings import (
    UNSET_FIX,
    completion_only_loss,
    loss_across_devices,
    sft_language_modelling,
)
from packsim.auditing.report import ProbeResult


class SFTTrainer(SimpleNamespace):
    """Read as TRL's SFTTrainer by its class name, as the findings read it (no TRL needed)."""


def sft(columns, completion_only_loss=None, masks=False) -> SFTTrainer:
    args = SimpleNamespace(completion_only_loss=completion_only_loss, assistant_only_loss=False,
                           dataset_text_field="text")
    return SFTTrainer(args=args, completion_only_loss=masks, train_dataset=SimpleNamespace(column_names=columns))


def coverage(objective="sft", **details) -> ProbeResult:
    return ProbeResult("loss_coverage", "pass", None, None, "", details={"objective": objective, **details})


@pytest.mark.parametrize("world, avg, counts, status", [
    (1, True, True, "skipped"), (4, True, True, "pass"), (4, False, True, "fail"), (4, True, False, "fail"),
])
def test_loss_across_devices(world, avg, counts, status):
    trainer = SimpleNamespace(args=SimpleNamespace(world_size=world, average_tokens_across_devices=avg))
    assert loss_across_devices(trainer, counts).status == status


def test_trl_trains_text_data_as_language_modelling_and_nothing_else():
    assert "completion_only_loss unset on language-modelling data" in sft_language_modelling(sft(["text"]))
    assert "completion_only_loss=False" in sft_language_modelling(sft(["messages"], completion_only_loss=False))
    assert sft_language_modelling(sft(["prompt", "completion"])) == ""
    assert sft_language_modelling(sft(["input_ids", "labels", "seq_lengths"])) == ""  # packed: unknown
    assert sft_language_modelling(sft(["text"], masks=True)) == ""
    assert sft_language_modelling(SimpleNamespace(args=SimpleNamespace())) == ""  # not an SFTTrainer


@pytest.mark.parametrize("trainer, counted, status", [
    (sft(["input_ids", "labels"], masks=True), (5, 9), "pass"),  # TRL masked the prompts
    (sft(["input_ids", "labels"]), (9, 9), "fail"),  # unset on packed data: nothing says LM
    (sft(["input_ids", "labels"], completion_only_loss=False), (9, 9), "fail"),
    (sft(["text"]), (9, 9), "pass"),  # language modelling: every token a target
])
def test_completion_only_loss_on_an_sft_trainer(trainer, counted, status):
    finding = completion_only_loss(trainer, None, counted, coverage())
    assert finding.status == status, finding
    assert f"{counted[0]} of {counted[1]}" in finding.evidence or status == "pass"


def test_an_unset_completion_only_loss_names_both_fixes():
    finding = completion_only_loss(sft(["input_ids", "labels"]), None, (9, 9), coverage())
    assert finding.fix == UNSET_FIX and "objective='lm'" in finding.fix


def test_objective_lm_on_a_plain_trainer_fails_a_token_left_out():
    plain = SimpleNamespace(args=SimpleNamespace())
    assert completion_only_loss(plain, None, (8, 9), coverage("lm")).status == "fail"
    assert completion_only_loss(plain, None, (9, 9), coverage("lm")).status == "pass"
    assert completion_only_loss(sft(["input_ids"], masks=True), None, (5, 9), coverage("lm")).status == "fail"


def test_a_plain_trainer_is_judged_by_the_loss_coverage_probe_or_skipped():
    plain = SimpleNamespace(args=SimpleNamespace())
    counts = {"prompt": (3, 4)}
    assert completion_only_loss(plain, "the features", (9, 9),
                                coverage(problems=["prompt"], counts=counts)).status == "fail"
    assert completion_only_loss(plain, "the features", (5, 9), coverage(counts={"prompt": (0, 4)})).status == "pass"
    assert completion_only_loss(plain, None, (9, 9), coverage()).status == "skipped"
