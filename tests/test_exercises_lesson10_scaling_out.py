"""Checks of notebook 10_scaling_out: the references and other right answers pass, typical mistakes fail by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from packsim.course.exercises import show_solution, solution_source
from packsim.course.exercises.lesson10_scaling_out import (
    TABLES,
    check_backward_scale,
    check_global_loss,
    table,
)
from packsim.course.solutions import lesson10_scaling_out as sol


def _text(fb) -> str:
    return f"{fb.message} {fb.hint}".lower()


def test_tables_hold_unequal_counts_an_empty_micro_batch_and_an_empty_step():
    counts = [table(i)[1] for i in range(len(TABLES))]
    assert any(c.shape[0] > 1 and len(set(c.sum(1).tolist())) > 1 for c in counts)  # ranks differ
    assert any(bool((c == 0).any()) and int(c.sum()) > 0 for c in counts)
    assert any(int(c.sum()) == 0 for c in counts)
    sums, counts = table(3)
    assert bool((sums[counts == 0] == 0).all())  # an empty micro-batch sums to 0


# --- global loss --------------------------------------------------------------------------------


def _by_hand(sums, counts):
    """The one-process loss by a loop over every (rank, micro-batch): total loss / total count."""
    total, n = 0.0, 0
    for r in range(counts.shape[0]):
        for m in range(counts.shape[1]):
            total += float(sums[r, m])
            n += int(counts[r, m])
    return total / n if n else 0.0


@pytest.mark.parametrize("answer", [
    sol.global_loss,
    _by_hand,  # Python floats
    lambda s, c: s.sum() / c.sum().clamp(min=1),  # a 0-d tensor; the clamp gives 0 on an empty step
    lambda s, c: np.float32(s.numpy().sum() / max(int(c.sum()), 1)),  # numpy float32
    lambda s, c: round(_by_hand(s, c), 4),  # 4 decimals
], ids=["reference", "python_loop", "clamped_tensor", "numpy_float32", "four_decimals"])
def test_global_loss_right_answers_pass(answer):
    fb = check_global_loss(answer)
    assert fb.passed, fb


def _mean_of_means(s, c):
    means = [float(s[r, m] / c[r, m]) for r in range(c.shape[0]) for m in range(c.shape[1]) if c[r, m] > 0]
    return sum(means) / len(means) if means else 0.0


def _local(s, c):  # each rank's per-token mean, then the mean over ranks (average_tokens_across_devices=False)
    per_rank = [float(s[r].sum() / c[r].sum()) for r in range(c.shape[0]) if c[r].sum() > 0]
    return sum(per_rank) / len(per_rank) if per_rank else 0.0


@pytest.mark.parametrize(("answer", "words"), [
    (_mean_of_means, "mean of the per-micro-batch means"),
    (_local, "each rank's per-token mean"),
    (lambda s, c: s.sum(), "not normalised"),
    (lambda s, c: s.sum() / c.sum(), "nan"),  # 0 / 0 on the empty step
    (lambda s, c: round(_by_hand(s, c), 2), "expected"),
    (lambda s, c: {"loss": 1.5}, "not a number"),
])
def test_global_loss_mistakes_are_named(answer, words):
    fb = check_global_loss(answer)
    assert not fb.passed and fb.attempted
    assert words in _text(fb), fb


# --- the factor before backward() ---------------------------------------------------------------


@pytest.mark.parametrize("answer", [
    sol.backward_scale,
    lambda c: (c.shape[0] / c.sum().clamp(min=1)) * (c > 0),  # 0 where a micro-batch counts nothing
    lambda c: torch.full(c.shape, c.shape[0] / max(int(c.sum()), 1), dtype=torch.float32),  # float32
    lambda c: c.shape[0] / max(int(c.sum()), 1),  # one number for the whole table
    lambda c: [[c.shape[0] / max(int(c.sum()), 1)] * c.shape[1] for _ in range(c.shape[0])],  # nested lists
], ids=["reference", "zero_where_empty", "float32", "one_number", "nested_lists"])
def test_backward_scale_right_answers_pass(answer):
    fb = check_backward_scale(answer)
    assert fb.passed, fb


@pytest.mark.parametrize(("answer", "words"), [
    (lambda c: torch.full(c.shape, 1 / max(int(c.sum()), 1), dtype=torch.float64), "ddp then divides"),
    (lambda c: 1 / c.sum(dim=1, keepdim=True).double().clamp(min=1).expand(c.shape), "each rank's own count"),
    (lambda c: (c.shape[0] / c.sum()).expand(c.shape), "inf or nan"),  # R / 0 on the empty step
    (lambda c: torch.ones(c.shape, dtype=torch.float64), "expected"),
    (lambda c: "R / N", "not a number"),
])
def test_backward_scale_mistakes_are_named(answer, words):
    fb = check_backward_scale(answer)
    assert not fb.passed and fb.attempted
    assert words in _text(fb), fb


def test_backward_scale_makes_ddp_match_one_process():
    """Ground truth without the check: R ranks each scale their sums by the factor, DDP averages
    over R, and the result is the one-process loss sum / total (here, on the values themselves)."""
    for i in range(len(TABLES) - 1):  # the empty step has no loss to match
        sums, counts = table(i)
        R = counts.shape[0]
        ddp = float((sums * sol.backward_scale(counts)).sum(dim=1).sum() / R)
        assert ddp == pytest.approx(float(sums.sum() / counts.sum()), rel=1e-6)


def test_solutions_can_be_shown(capsys):
    show_solution(10, "global_loss")
    assert "def global_loss" in capsys.readouterr().out
    assert "counts.shape[0]" in solution_source(10, "backward_scale")
