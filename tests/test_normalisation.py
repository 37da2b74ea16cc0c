"""packsim.scaling.normalisation: the three kinds, exact values, empty micro-batches, DDP's average."""

from __future__ import annotations

import pytest
import torch

from packsim.core.errors import PacksimError
from packsim.core.loss import MICRO_BATCH_REDUCTIONS, micro_batch_weights
from packsim.scaling.normalisation import NORMALISATIONS, backward_scales, objective, weights

# 2 ranks x 2 micro-batches with unequal counts
COUNTS = torch.tensor([[3, 1], [2, 6]])
SUMS = torch.tensor([[6.0, 4.0], [1.0, 12.0]], dtype=torch.float64)


def test_exact_values():
    assert float(objective(SUMS, COUNTS, "global")) == pytest.approx(23 / 12)
    assert float(objective(SUMS, COUNTS, "local")) == pytest.approx((10 / 4 + 13 / 8) / 2)
    assert float(objective(SUMS, COUNTS, "mean")) == pytest.approx((6 / 3 + 4 / 1 + 1 / 2 + 12 / 6) / 4)


def test_each_kind_is_a_one_process_reduction_over_the_step_or_each_rank():
    """On one rank every kind is its reduction of core.loss; global and local then coincide."""
    assert list(NORMALISATIONS) == ["global", "local", "mean"]
    assert {reduction for reduction, _ in NORMALISATIONS.values()} == set(MICRO_BATCH_REDUCTIONS)
    one_rank = torch.tensor([[3, 1, 4]])
    for kind, (reduction, _) in NORMALISATIONS.items():
        assert torch.equal(weights(one_rank, kind), micro_batch_weights(one_rank, reduction))
    assert torch.equal(weights(one_rank, "local"), torch.full((1, 3), 1 / 8, dtype=torch.float64))
    assert torch.allclose(weights(one_rank, "mean"), torch.tensor([[1 / 9, 1 / 3, 1 / 12]], dtype=torch.float64))


def test_all_agree_when_counts_are_equal():
    counts = torch.full((2, 3), 5)
    sums = torch.rand(2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    values = [float(objective(sums, counts, k)) for k in NORMALISATIONS]
    assert values == pytest.approx([values[0]] * 3)


def test_local_equals_global_when_ranks_count_the_same_but_mean_does_not():
    counts = torch.tensor([[1, 5], [4, 2]])  # 6 per rank, unequal micro-batches
    assert float(objective(SUMS, counts, "local")) == pytest.approx(float(objective(SUMS, counts, "global")))
    assert float(objective(SUMS, counts, "mean")) != pytest.approx(float(objective(SUMS, counts, "global")))


def test_empty_micro_batch_weighs_zero_and_never_nan():
    counts = torch.tensor([[3, 0], [2, 6]])
    sums = torch.tensor([[6.0, 0.0], [1.0, 12.0]], dtype=torch.float64)
    for kind in NORMALISATIONS:
        w = weights(counts, kind)
        assert bool(torch.isfinite(w).all()) and float(w[0, 1]) == 0.0
    assert float(objective(sums, counts, "global")) == pytest.approx(19 / 11)
    nothing = torch.zeros(2, 2, dtype=torch.long)
    for kind in NORMALISATIONS:
        assert float(objective(torch.zeros(2, 2), nothing, kind)) == 0.0


def test_backward_scales_undo_ddps_average():
    """Each rank backpropagates its micro-batches with the scales; DDP averages: the result is the
    gradient of the one-process per-token loss (global) over all tokens."""
    gen = torch.Generator().manual_seed(0)
    theta = torch.randn(4, dtype=torch.float64, generator=gen, requires_grad=True)
    tokens = [[torch.randn(int(n), 4, dtype=torch.float64, generator=gen) for n in row] for row in COUNTS]

    def token_loss(x):  # (n, 4) -> (n,): any smooth per-token loss
        return (x @ theta).sin() ** 2

    ddp_grads = {}
    for kind in NORMALISATIONS:
        scales = backward_scales(COUNTS, kind)
        per_rank = []
        for r, row in enumerate(tokens):
            theta.grad = None
            sum(token_loss(x).sum() * scales[r, m] for m, x in enumerate(row)).backward()
            per_rank.append(theta.grad.clone())
        ddp = torch.stack(per_rank).mean(0)  # what DDP's all-reduce leaves on every rank
        theta.grad = None
        sums = torch.stack([torch.stack([token_loss(x).sum() for x in row]) for row in tokens])  # (R, M)
        (weights(COUNTS, kind) * sums).sum().backward()
        assert torch.allclose(ddp, theta.grad)
        ddp_grads[kind] = ddp
    theta.grad = None
    flat = torch.cat([x for row in tokens for x in row])
    token_loss(flat).mean().backward()  # one process, all 12 tokens in one batch
    assert torch.allclose(ddp_grads["global"], theta.grad)
    assert not torch.allclose(ddp_grads["local"], theta.grad) and not torch.allclose(ddp_grads["mean"], theta.grad)
    assert torch.allclose(backward_scales(COUNTS, "global"), torch.full((2, 2), 2 / 12, dtype=torch.float64))


@pytest.mark.parametrize(("counts", "kind", "match"), [
    (COUNTS, "median", "unknown normalisation 'median'"),
    (torch.tensor([1, 2]), "global", "non-empty \\(ranks, micro_batches\\)"),
    (torch.tensor([[1, -1]]), "global", ">= 0"),
])
def test_bad_input(counts, kind, match):
    with pytest.raises(PacksimError, match=match):
        weights(counts, kind)


def test_shape_mismatch():
    with pytest.raises(PacksimError, match="same"):
        objective(torch.zeros(3, 2), COUNTS)
