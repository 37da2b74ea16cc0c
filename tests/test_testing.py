"""packsim.testing.assert_isolated: passes a clean pipeline, raises AssertionError with the table otherwise."""

from __future__ import annotations

import pytest
import torch
from toy import VOCAB, toy_examples
from transformers import DataCollatorWithFlattening

from packsim import PackedBatch, PacksimError
from packsim.auditing import AuditReport
from packsim.auditing.features import response_mask_from_features
from packsim.core.loss import IGNORE_INDEX
from packsim.core.model import build_model
from packsim.testing import assert_isolated

SHAPES = [(4, 3), (6, 5), (2, 5)]


@pytest.fixture(scope="module")
def examples():
    return toy_examples(SHAPES, seed=3)


@pytest.fixture(scope="module")
def sdpa_model():
    return build_model("tiny", vocab_size=VOCAB, attn_implementation="sdpa", seed=0)


def collated(examples) -> dict:
    feats = [{"input_ids": list(ex.tokens),
              "labels": [IGNORE_INDEX] * ex.n_prompt + list(ex.tokens[ex.n_prompt:])} for ex in examples]
    return DataCollatorWithFlattening(return_flash_attn_kwargs=True)(feats)


response_mask = response_mask_from_features  # (1, N) bool, True on response tokens and EOS


def test_clean_collator_batch_passes_and_returns_the_report(examples, sdpa_model):
    report = assert_isolated(sdpa_model, collated(examples), response_mask=response_mask(examples),
                             use_cache=False)
    assert isinstance(report, AuditReport) and report.ok
    assert "attention_mass" in report.skipped  # sdpa gives no probabilities: skipped, not failed


def test_cache_leak_raises_with_the_table(examples, sdpa_model):
    with pytest.raises(AssertionError) as info:
        assert_isolated(sdpa_model, collated(examples), response_mask=response_mask(examples),
                        use_cache=True)
    message = str(info.value)
    assert "FAIL (perturbation, gradient)" in message
    assert "probe" in message and "evidence" in message  # the table's header
    assert "a cache was created" in message  # the likely cause


def test_packed_batch_and_audit_options_pass_through(examples):
    model = build_model("tiny", vocab_size=VOCAB, seed=0)
    assert_isolated(model, PackedBatch.from_examples(examples, capacity=32, setup="correct"),
                    max_examples=2, seed=1)
    with pytest.raises(AssertionError, match=r"FAIL \(perturbation, gradient, attention_mass, loss_coverage\)"):
        assert_isolated(model, PackedBatch.from_examples(examples, capacity=32, setup="buggy"))


def test_loss_coverage_failure_is_an_assertion_too(examples, sdpa_model):
    batch = collated(examples)
    batch["labels"] = batch["input_ids"].clone()  # prompts and boundaries counted
    with pytest.raises(AssertionError, match="loss_coverage"):
        assert_isolated(sdpa_model, batch, response_mask=response_mask(examples), use_cache=False)


def test_bad_input_is_a_packsim_error_not_an_assertion(sdpa_model):
    with pytest.raises(PacksimError, match="PackedBatch or the collator's dict"):
        assert_isolated(sdpa_model, [1, 2, 3])


def test_no_example_boundaries_is_an_assertion(examples, sdpa_model):
    batch = collated(examples)
    ids = batch["input_ids"].clone()
    ids[(ids == 1) | (ids == 2)] = 5  # no BOS / EOS left: neither a field nor a token marks a start
    wrapped = {"input_ids": ids, "labels": ids.clone()}  # one row, as wrapped packing leaves it
    with pytest.raises(AssertionError) as info:  # not PacksimError: a verdict, not bad input
        assert_isolated(sdpa_model, wrapped, use_cache=False)
    assert "packsim.audit" in str(info.value).splitlines()[0]


def test_one_example_is_not_measured_and_not_a_pass(examples):
    model = build_model("tiny", vocab_size=VOCAB, seed=0)
    one = PackedBatch.from_examples(examples[:1], capacity=32, setup="correct")
    assert int(one.seq_ids.max()) == 0  # ground truth: nothing else in the batch to leak into
    with pytest.raises(AssertionError, match="could not measure isolation"):
        assert_isolated(model, one)


def test_check_loss_false_leaves_the_loss_out(examples, sdpa_model):
    batch = collated(examples)
    batch["labels"] = batch["input_ids"].clone()  # prompts and boundaries counted: a loss fault only
    with pytest.raises(AssertionError, match="loss_coverage"):
        assert_isolated(sdpa_model, batch, response_mask=response_mask(examples), use_cache=False)
    report = assert_isolated(sdpa_model, batch, response_mask=response_mask(examples), use_cache=False,
                             check_loss=False)
    assert report.failed == ["loss_coverage"]  # still in the report, not in the assertion
    with pytest.raises(AssertionError) as info:  # isolation faults still raise
        assert_isolated(sdpa_model, batch, response_mask=response_mask(examples), use_cache=True, check_loss=False)
    assert "perturbation" in str(info.value).splitlines()[0] and "loss" not in str(info.value).splitlines()[0]


def test_a_batch_counting_no_label_fails(examples, sdpa_model):
    batch = collated(examples)
    batch["labels"] = torch.full_like(batch["input_ids"], IGNORE_INDEX)  # ground truth: 0 counted labels
    with pytest.raises(AssertionError, match="no label is counted"):
        assert_isolated(sdpa_model, batch, response_mask=response_mask(examples), use_cache=False)


def test_the_verdict_claims_only_the_loss_it_measured(examples, sdpa_model):
    report = assert_isolated(sdpa_model, collated(examples), use_cache=False)  # no response_mask
    assert report.probes["loss_coverage"].details["counts"]["unknown"][1] > 0
    assert "the loss counts only responses" not in report.verdict
    assert "which labels are prompt and which response was not measured" in report.verdict
    with_split = assert_isolated(sdpa_model, collated(examples), response_mask=response_mask(examples),
                                 use_cache=False)
    assert "the loss counts only responses" in with_split.verdict


def test_the_gradient_ratio_reads_as_a_sentence(examples, sdpa_model):
    with pytest.raises(AssertionError) as info:
        assert_isolated(sdpa_model, collated(examples), response_mask=response_mask(examples), use_cache=True)
    text = " ".join(str(info.value).split())  # the report wraps at 100 columns
    worst = text[text.index("worst pair:"):][:400]
    assert "times as much as example" in worst and "own tokens do" in worst and "e+0" not in worst



def test_a_verdict_resting_on_the_batch_fields_alone_is_not_an_assertion_pass():
    """Positions restarting one token late, no BOS / EOS, no examples: the true examples leak, and the
    audit can only see the batch's own (wrong) boundaries, so it must not pass."""
    import torch

    from packsim import build_model

    model = build_model("tiny", seed=0, attn_implementation="sdpa")
    model.config.bos_token_id = model.config.eos_token_id = None  # no special token to locate examples by
    lengths = [9, 7, 11, 8]
    ids = torch.randint(5, 40, (1, sum(lengths)), generator=torch.Generator().manual_seed(0))  # (1, T)
    pos = torch.cat([torch.arange(lengths[0] + 1)] + [torch.arange(n) for n in lengths[1:-1]]
                    + [torch.arange(lengths[-1] - 1)])[None]  # (1, T): each restart one token late
    cut = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    with torch.no_grad():  # ground truth: the true example 1 packed vs alone
        packed = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0]
        alone = model(input_ids=ids[:, cut[1]:cut[2]], use_cache=False).logits[0]
    assert float((packed[cut[1]:cut[2]] - alone).abs().max()) > 1e-3
    batch = {"input_ids": ids, "position_ids": pos}
    with pytest.raises(AssertionError, match="only as the batch's own boundary fields"):
        assert_isolated(model, batch, check_loss=False, use_cache=False)
    report = assert_isolated(model, batch, check_loss=False, use_cache=False, trust_boundaries=True)
    assert report.status == "pass"  # what the user asserts by trusting the fields
