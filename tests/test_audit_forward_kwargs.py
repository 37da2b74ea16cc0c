"""Batch fields passed to :func:`packsim.audit` as forward keywords, as the docs allow.

The most famous trap: an all-ones ``attention_mask`` next to packed ``position_ids`` turns
transformers' packed-sequence detection off (sdpa), so the examples attend across boundaries.
Passed as ``audit(model, batch, attention_mask=ones)`` it is the same forward as the field in the
batch: the audit must answer FAIL with the fix, never crash. The ground truth is computed here
without packsim's audit: each example's logits in the forward vs the example run alone.
"""

from __future__ import annotations

import pytest
import torch

import packsim
from packsim import PackedBatch, build_model, make_examples


@pytest.fixture(scope="module")
def setup():
    model = build_model("tiny", seed=0, attn_implementation="sdpa")
    batch = PackedBatch.from_examples(make_examples(6, seed=0), 128, setup="correct").to_flattening()
    return model, batch


def _true_leak(model, batch, **kw) -> float:
    """max over examples of |logits in the packed forward - logits alone| (B = 1 row)."""
    ids, pos = batch["input_ids"], batch["position_ids"]
    starts = (pos[0] == 0).nonzero().flatten().tolist() + [ids.shape[1]]
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=pos, use_cache=False, **kw).logits[0]  # (T, V)
        worst = 0.0
        for a, b in zip(starts[:-1], starts[1:], strict=True):
            alone = model(input_ids=ids[:, a:b], use_cache=False).logits[0]  # (L, V)
            worst = max(worst, float((packed[a:b] - alone).abs().max()))
    return worst


@pytest.mark.parametrize("keys", [("input_ids", "labels", "position_ids"), None])
def test_an_all_ones_mask_as_a_forward_keyword_is_a_fail_with_its_fix(setup, keys):
    model, full = setup
    batch = dict(full) if keys is None else {k: full[k] for k in keys}
    ones = torch.ones_like(batch["input_ids"])
    assert _true_leak(model, batch, attention_mask=ones) > 1e-2  # ground truth: it leaks
    assert _true_leak(model, batch) < 1e-5  # and without the mask it does not
    report = packsim.audit(model, batch, use_cache=False, attention_mask=ones)
    assert report.status == "fail" and "perturbation" in report.failed
    assert "Drop attention_mask" in str(report)


def test_position_ids_as_a_forward_keyword_are_read_as_the_batch_field(setup):
    model, full = setup
    batch = {"input_ids": full["input_ids"], "labels": full["labels"]}
    report = packsim.audit(model, batch, use_cache=False, position_ids=full["position_ids"])
    assert report.status == "pass" and len(report.example_ids) == 6
