"""packsim.experiment.throughput.timed_step: one optimizer step, its loss over every counted target of
the step, its token counts and a time; the ground truth is the shifted cross-entropy computed here."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from packsim import build_model, make_examples
from packsim.core.errors import PacksimError
from packsim.core.model import forward
from packsim.experiment.throughput import timed_step
from packsim.experiment.training import make_batches


def summed_loss_and_count(model, batch) -> tuple[float, int]:
    """Summed next-token cross-entropy over the counted labels, and how many were counted."""
    with torch.no_grad():
        logits = forward(model, batch).float()  # (B, T, V)
    target = batch.labels[:, 1:]  # (B, T-1): position t predicts token t + 1
    keep = target != -100
    losses = F.cross_entropy(logits[:, :-1][keep], target[keep], reduction="sum")
    return float(losses), int(keep.sum())


@pytest.fixture()
def setting():
    torch.manual_seed(0)
    model = build_model(seed=0).train()
    examples = make_examples(16, seed=3)
    return model, make_batches(examples, 128, "correct", 8) + make_batches(examples, 128, "padded", 8)


def test_one_batch_gives_the_mean_loss_and_updates_the_weights(setting):
    model, (packed, *_) = setting
    before = copy.deepcopy(model)
    total, n = summed_loss_and_count(before, packed)
    rec = timed_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), packed)
    assert rec["loss"] == pytest.approx(total / n, rel=1e-5)
    assert rec["real_tokens"] == packed.n_real_tokens and rec["rows"] == packed.shape[0]
    assert rec["all_tokens"] == packed.input_ids.numel() and rec["seconds"] > 0
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), before.parameters(), strict=True))


def test_micro_batches_weigh_every_counted_target_the_same(setting):
    model, (_, packed2, padded1, _) = setting
    (s1, n1), (s2, n2) = (summed_loss_and_count(model, b) for b in (packed2, padded1))
    rec = timed_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), [packed2, padded1])
    assert rec["loss"] == pytest.approx((s1 + s2) / (n1 + n2), rel=1e-5)  # not the mean of the two means
    assert rec["real_tokens"] == packed2.n_real_tokens + padded1.n_real_tokens


def test_sync_is_called_around_the_clock_and_bad_input_is_refused(setting):
    model, (packed, *_) = setting
    calls = []
    timed_step(model, torch.optim.SGD(model.parameters(), lr=0.0), [packed], sync=lambda: calls.append(1))
    assert calls == [1, 1]
    with pytest.raises(PacksimError, match="non-empty list of them"):
        timed_step(model, torch.optim.SGD(model.parameters(), lr=0.0), [])
