"""packsim.auditing.tolerance: a tolerance the user gives is checked before any forward, at every entry.

A NaN tolerance would read every change as "unchanged" (a comparison with NaN is False): before
this check ``packsim.audit(..., tol=float("nan"))`` passed a leaking batch. The leak here is built
in the test (the plain causal pack) and measured without packsim.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

import packsim
from packsim.auditing.context_parallel import audit_context_parallel
from packsim.auditing.tolerance import given_tolerance
from packsim.core.errors import PacksimError

FEATURES = [{"prompt_ids": [5, 6, 7], "response_ids": [8, 9, 10]}, {"prompt_ids": [11, 12], "response_ids": [13, 14]}]
BAD = [math.nan, math.inf, -1e-6, "x", [1e-5]]


def test_given_tolerance_keeps_numbers_and_refuses_the_rest():
    assert given_tolerance(None) is None and given_tolerance(0) == 0.0 and given_tolerance("1e-5") == 1e-5
    for tol in BAD:
        with pytest.raises(PacksimError, match="give a finite tolerance >= 0"):
            given_tolerance(tol)


def test_a_nan_tolerance_can_no_longer_pass_a_leaking_batch():
    model = packsim.build_model("tiny", seed=0).eval()
    batch = packsim.PackingCollator("buggy")(FEATURES)
    ids = batch["input_ids"]
    moved = ids.clone()
    moved[0, 1:6] = 3  # example 0's tokens after its first: example 1 (tokens 6..) must not see them
    with torch.no_grad():
        leak = (model(input_ids=moved).logits - model(input_ids=ids).logits)[0, 6:].abs().max()
    assert float(leak) > 1e-3  # the ground truth: one causal row, example 1 reads example 0
    assert packsim.audit(model, {"input_ids": ids, "labels": batch["labels"]}, examples=[[5, 6, 7, 8, 9, 10],
                         [11, 12, 13, 14]]).status == "fail"
    for tol in BAD:
        with pytest.raises(PacksimError, match="give a finite tolerance"):
            packsim.audit(model, {"input_ids": ids, "labels": batch["labels"]}, tol=tol)


@pytest.mark.parametrize("tol", BAD)
def test_every_entry_checks_the_tolerance_first(tol):
    model = packsim.build_model("tiny", seed=0).eval()
    batch = packsim.PackingCollator("correct")(FEATURES)
    with pytest.raises(PacksimError, match="give a finite tolerance"):
        packsim.audit_logprobs(model, batch, completion_mask=batch["labels"] != -100, tol=tol)
    with pytest.raises(PacksimError, match="give a finite tolerance"):  # before any process group is needed
        audit_context_parallel(model, None, batch["input_ids"], [6, 4], torch.arange(10), tol=tol)
    trainer = SimpleNamespace(model=model, get_train_dataloader=lambda: iter(()))  # no batch is drawn first
    with pytest.raises(PacksimError, match="give a finite tolerance"):
        packsim.audit_trainer(trainer, tol=tol)
