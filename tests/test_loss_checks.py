"""The loss checks the audit's probes cannot make: a batch with no counted label, and token weights
under gradient accumulation (read exactly from the gradient of the accumulated loss)."""

from __future__ import annotations

import pytest
import torch

from packsim.auditing.loss_checks import (
    check_counted_labels,
    check_loss_normalisation,
    global_token_mean,
    mean_of_means,
    token_weights,
)
from packsim.core.loss import IGNORE_INDEX
from packsim.exhibits.museum import collate, examples, tiny_llama


@pytest.fixture(scope="module")
def micro_batches():
    short, long = examples(shapes=((6, 1),), seed=1), examples(shapes=((2, 9), (3, 8)), seed=2)
    return [collate(short), collate(long)]  # 2 and 19 counted tokens


def test_mean_of_means_weighs_a_short_micro_batch_more(micro_batches):
    short, long = token_weights(tiny_llama(), micro_batches, mean_of_means)
    assert torch.allclose(short, torch.full_like(short, 1 / (2 * 2)), rtol=1e-4)  # 1 / (K n_1)
    assert torch.allclose(long, torch.full_like(long, 1 / (2 * 19)), rtol=1e-4)
    bad = check_loss_normalisation(tiny_llama(), micro_batches, mean_of_means)
    assert bad.name == "equal_token_weights"  # not the trainer audit's loss_over_accumulation
    assert bad.failed and "max/min 9.500" in bad.evidence and "[2, 19] counted tokens" in bad.evidence
    assert "num_items_in_batch" in bad.fix


def test_global_token_mean_weighs_every_token_the_same(micro_batches):
    weights = torch.cat(token_weights(tiny_llama(), micro_batches, global_token_mean))
    assert torch.allclose(weights, torch.full_like(weights, 1 / 21), rtol=1e-4)
    good = check_loss_normalisation(tiny_llama(), micro_batches, global_token_mean)
    assert good.status == "pass" and "1/N = 0.0476" in good.evidence


def test_equal_weights_divided_by_another_count_fail(micro_batches):
    """unsloth-zoo#1066's shape: num_items_in_batch with the packed boundaries subtracted once more."""
    counted = sum(int((b["labels"][..., 1:] != IGNORE_INDEX).sum()) for b in micro_batches)  # N, counted here
    starts = sum(int((b["position_ids"][..., 1:] == 0).sum()) for b in micro_batches)
    assert counted == 21 and starts > 0

    def boundaries_twice(logits, labels):
        return global_token_mean(logits, labels) * counted / (counted - starts)

    weights = torch.cat(token_weights(tiny_llama(), micro_batches, boundaries_twice))
    assert torch.allclose(weights, torch.full_like(weights, 1 / (counted - starts)), rtol=1e-4)
    bad = check_loss_normalisation(tiny_llama(), micro_batches, boundaries_twice)
    assert bad.failed and f"divides by {counted - starts:.2f}, not by the {counted} counted tokens" in bad.evidence
    assert "count them once" in bad.fix


def test_the_two_reductions_agree_when_micro_batches_count_the_same(micro_batches):
    same = [micro_batches[1], micro_batches[1]]
    assert not check_loss_normalisation(tiny_llama(), same, mean_of_means).failed


def test_counted_labels():
    batch = collate(examples())
    assert not check_counted_labels(batch).failed
    batch["labels"] = torch.full_like(batch["labels"], IGNORE_INDEX)
    finding = check_counted_labels(batch)
    assert finding.failed and "0/0" in finding.evidence and "max_length" in finding.fix
    batch["labels"][0, 0] = 5  # the first token of a row is never a target (the shift drops it)
    assert check_counted_labels(batch).failed
