"""Checks of notebook 06_train_side_by_side: the reference solutions pass, typical mistakes fail by name."""

from __future__ import annotations

from statistics import fmean, median

import pytest

from packsim.course.exercises import show_solution, solution_source
from packsim.course.exercises.lesson06_train_side_by_side import (
    check_em_gap,
    check_fix_share,
    check_warning_sign,
    toy_results,
)
from packsim.course.solutions import lesson06_train_side_by_side as sol
from packsim.experiment.results import Results


def test_solutions_on_the_committed_runs():
    res = Results.load("results/tasks-full")
    em = res.summary("isolated_exact_match")
    assert sol.em_gap(res) == pytest.approx(em["correct"]["mean"] - em["buggy"]["mean"])
    assert sol.em_gap(res) > 0.3
    shares = sol.fix_share(res)
    assert shares["mask_fix"] > 0.9 > 0.1 > shares["loss_fix"]


def _em(res, setup, pick):
    return pick([r.final["isolated_exact_match"] for r in res.by_setup()[setup]])


@pytest.mark.parametrize(("answer", "words"), [
    (lambda res: _em(res, "buggy", fmean) - _em(res, "correct", fmean), "wrong way round"),
    (lambda res: 100 * (_em(res, "correct", fmean) - _em(res, "buggy", fmean)), "percentage"),
    (lambda res: _em(res, "correct", median) - _em(res, "buggy", median), "median"),
    (lambda res: {r.setup: r.final["isolated_exact_match"] for r in res.runs if r.seed == 0}["correct"]
     - {r.setup: r.final["isolated_exact_match"] for r in res.runs if r.seed == 0}["buggy"], "seed 0"),
    (lambda res: [r for r in res.runs if r.setup == "correct"][0].final["isolated_exact_match"]
     - [r for r in res.runs if r.setup == "buggy"][0].final["isolated_exact_match"], "first run"),
    (lambda res: "0.4", "not a number"),
])
def test_em_gap_mistakes_are_named(answer, words):
    fb = check_em_gap(answer)
    assert not fb.passed and fb.attempted
    assert words in str(fb), fb


def _per_setup(res, fn):
    return {s: fmean(fn(r.final) for r in runs) for s, runs in res.by_setup().items()}


@pytest.mark.parametrize(("answer", "words"), [
    (lambda res: _per_setup(res, lambda f: f["train_packed_response_loss"] - f["train_isolated_response_loss"]),
     "wrong way round"),
    (lambda res: _per_setup(res, lambda f: f["isolated_response_loss"] - f["reported_loss"]), "reported loss"),
    (lambda res: _per_setup(res, lambda f: f["isolated_response_loss"] - f["train_packed_response_loss"]),
     "held-out"),
    (lambda res: {"buggy": 1.0}, "every setup"),
    (lambda res: [1.0], "not a dict"),
])
def test_warning_sign_mistakes_are_named(answer, words):
    fb = check_warning_sign(answer)
    assert not fb.passed and fb.attempted
    assert words in str(fb), fb


def _seed(res, setup, seed):
    return next(r.final["isolated_exact_match"] for r in res.by_setup()[setup] if r.seed == seed)


def _gain(res, fix, scale):
    em = {s: fmean(r.final["isolated_exact_match"] for r in rs) for s, rs in res.by_setup().items()}
    return scale(em, fix)


@pytest.mark.parametrize(("answer", "words"), [
    (lambda res: {f: _gain(res, f, lambda em, f: em[f] - em["buggy"]) for f in ("mask_fix", "loss_fix")},
     "raw gain"),
    (lambda res: {f: _gain(res, f, lambda em, f: (em["correct"] - em[f]) / (em["correct"] - em["buggy"]))
                  for f in ("mask_fix", "loss_fix")}, "still missing"),
    (lambda res: {f: 100 * v for f, v in sol.fix_share(res).items()}, "percent"),
    (lambda res: {"mask_fix": 1.0}, "expected ['loss_fix', 'mask_fix']"),
    (lambda res: {"mask_fix": sol.fix_share(res)["loss_fix"], "loss_fix": sol.fix_share(res)["mask_fix"]},
     "keys are swapped"),
    (lambda res: {f: fmean((_seed(res, f, k) - _seed(res, "buggy", k)) / (_seed(res, "correct", k) - _seed(res, "buggy", k))
                           for k in (0, 1, 2)) for f in ("mask_fix", "loss_fix")}, "mean of ratios"),
    (lambda res: {f: _gain(res, f, lambda em, f: em[f] / em["correct"]) for f in ("mask_fix", "loss_fix")},
     "divided the fix's exact match by correct's"),
    (lambda res: {f: _gain(res, f, lambda em, f: (em[f] - em["buggy"]) / em["correct"]) for f in ("mask_fix", "loss_fix")},
     "not by the gap"),
    (lambda res: {f: (_seed(res, f, 0) - _seed(res, "buggy", 0)) / (_seed(res, "correct", 0) - _seed(res, "buggy", 0))
                  for f in ("mask_fix", "loss_fix")}, "seed 0 only"),
    (lambda res: {f: -v for f, v in sol.fix_share(res).items()}, "sign is wrong"),
    (lambda res: {f: v + 0.123 for f, v in sol.fix_share(res).items()}, "start at buggy"),
])
def test_fix_share_mistakes_are_named(answer, words):
    fb = check_fix_share(answer)
    assert not fb.passed and fb.attempted
    assert words in str(fb), fb


def test_toy_results_have_disagreeing_seeds():
    res = toy_results(0)
    assert res.runs[0].seed == 2 and len(res.setups()) == 4
    assert sol.em_gap(toy_results(0)) != pytest.approx(sol.em_gap(toy_results(1)))


def test_solutions_can_be_shown(capsys):
    show_solution(6, "em_gap")
    assert "def em_gap" in capsys.readouterr().out
    assert "mask_fix" in solution_source(6, "fix_share")


# --- other right answers pass: the value is judged, not the formula or the number type ---------


def _summary_mean(res, key, setup):
    return res.summary(key)[setup]["mean"]


def test_em_gap_other_right_answers_pass():
    import numpy as np
    import torch

    def by_summary(res):  # Results.summary's means
        return _summary_mean(res, "isolated_exact_match", "correct") - _summary_mean(res, "isolated_exact_match", "buggy")

    def torch_float32(res):  # a 0-d float32 tensor from a scan over res.runs
        em = {s: torch.tensor([r.final["isolated_exact_match"] for r in res.runs if r.setup == s]) for s in ("correct", "buggy")}
        return em["correct"].float().mean() - em["buggy"].float().mean()

    def numpy_rounded(res):  # numpy, rounded to 4 decimals
        em = {s: np.mean([r.final["isolated_exact_match"] for r in rs]) for s, rs in res.by_setup().items()}
        return round(float(em["correct"] - em["buggy"]), 4)

    for fn in (by_summary, torch_float32, numpy_rounded):
        fb = check_em_gap(fn)
        assert fb.passed, (fn.__name__, fb)


def test_warning_sign_other_right_answers_pass():
    import torch

    def difference_of_means(res):  # the mean of a difference is the difference of the means
        return {s: _summary_mean(res, "train_isolated_response_loss", s) - _summary_mean(res, "train_packed_response_loss", s)
                for s in res.setups()}

    def tensors(res):  # one 0-d tensor per setup
        return {s: torch.tensor([r.final["train_isolated_response_loss"] - r.final["train_packed_response_loss"]
                                 for r in runs]).mean() for s, runs in res.by_setup().items()}

    for fn in (difference_of_means, tensors):
        fb = check_warning_sign(fn)
        assert fb.passed, (fn.__name__, fb)


def test_fix_share_other_right_answers_pass():
    import numpy as np

    def every_setup(res):  # a comprehension over every setup: buggy 0 and correct 1 come along
        em = {s: _summary_mean(res, "isolated_exact_match", s) for s in res.setups()}
        return {s: (em[s] - em["buggy"]) / (em["correct"] - em["buggy"]) for s in em}

    def numpy_values(res):  # numpy scalars
        return {f: np.float64(v) for f, v in sol.fix_share(res).items()}

    for fn in (every_setup, numpy_values):
        fb = check_fix_share(fn)
        assert fb.passed, (fn.__name__, fb)


def test_fix_share_wrong_ends_are_not_dropped():
    fb = check_fix_share(lambda res: {**sol.fix_share(res), "buggy": 0.3, "correct": 0.8})
    assert not fb.passed and "expected ['loss_fix', 'mask_fix']" in str(fb)
