"""Forensics from a finished checkpoint: tiny models trained here for a few steps, buggy vs correct."""

from __future__ import annotations

import pytest
from pipelines import one_thread  # noqa: E402, F401

from packsim.core.data import make_dataset
from packsim.core.errors import PacksimError
from packsim.core.model import build_model
from packsim.experiment.forensics import Evidence, forensics, measure
from packsim.experiment.training import TrainConfig, train

STEPS, PER_STEP = 16, 16


@pytest.fixture(scope="module")
def runs():
    """{(setup, seed): model} trained on the same kind of data; and a sample of seed 0's training stream."""
    cfg = TrainConfig(steps=STEPS, examples_per_step=PER_STEP, capacity=128, warmup_steps=4, eval_every=0)
    models = {}
    for setup, seed in (("buggy", 0), ("correct", 0), ("correct", 1)):
        examples, _ = make_dataset(STEPS * PER_STEP, 0, seed=seed)
        model = build_model("tiny", seed=seed)
        train(model, examples, setup, cfg, seed=seed, progress=False)
        models[setup, seed] = model
    return models, make_dataset(STEPS * PER_STEP, 0, seed=0)[0][:64]


def test_a_leaky_run_is_flagged_against_a_correct_control(runs):
    models, sample = runs
    report = forensics(models["buggy", 0], sample, control=models["correct", 1], capacity=128)
    assert report.flagged is True, report.table()
    assert report.suspect.pack_gap < report.threshold * report.control.pack_gap
    assert report.verdict.startswith("CONTAMINATED") and "control" in report.table()


def test_a_correct_run_is_not_flagged(runs):
    models, sample = runs
    report = forensics(models["correct", 0], sample, control=models["correct", 1], capacity=128)
    assert report.flagged is False, report.table()
    assert report.verdict.startswith("CLEAN")


def test_measure_is_deterministic_and_takes_dicts(runs):
    models, sample = runs
    model = models["buggy", 0]
    a = measure(model, sample, capacity=128)
    dicts = [{"prompt_ids": ex.tokens[:ex.n_prompt], "response_ids": ex.tokens[ex.n_prompt:]} for ex in sample]
    assert measure(model, dicts, capacity=128) == a
    assert a.n > 0 and a.neighbour_influence > 0 and a.packed_loss == pytest.approx(a.alone_loss + a.pack_gap)
    assert isinstance(forensics(model, sample, control=a, capacity=128).control, Evidence)


def test_without_a_control_there_is_no_verdict(runs):
    models, sample = runs
    report = forensics(models["buggy", 0], sample, capacity=128)
    assert report.flagged is None and report.verdict.startswith("UNCALIBRATED")


def test_bad_input():
    model = build_model("tiny", seed=0)
    sample = make_dataset(8, 0, seed=0)[0]
    with pytest.raises(PacksimError, match="at least 4 training examples"):
        forensics(model, sample[:2])
    with pytest.raises(PacksimError, match="threshold"):
        forensics(model, sample, threshold=2.0)
    with pytest.raises(PacksimError, match="example 0 is a dict with keys .*'prompt_ids' and 'response_ids'"):
        forensics(model, [{"input_ids": [1, 2]}] * 4)


def test_paired_gap_is_the_mean_difference_with_a_bootstrap_interval():
    # ground truth computed here: the differences on the shared examples, their mean, and the
    # interval of the exact bootstrap distribution (sampled resamples must come close to it)
    import itertools

    import numpy as np

    from packsim.experiment.forensics import paired_gap

    suspect = {0: 0.10, 1: 0.30, 2: -0.20, 5: 0.05, 7: 0.40}
    control = {0: 0.50, 1: 0.60, 2: 0.35, 5: 0.45, 9: 9.0}  # 7 and 9 are not shared: left out
    d = np.array([0.10 - 0.50, 0.30 - 0.60, -0.20 - 0.35, 0.05 - 0.45])
    got = paired_gap(suspect, control, resamples=20000, seed=3)
    # the exact bootstrap distribution of the mean: all 4**4 equally likely resamples, enumerated
    exact = np.array([d[list(pick)].mean() for pick in itertools.product(range(4), repeat=4)])
    lo, hi = np.percentile(exact, [2.5, 97.5])
    assert (got.n, got.resamples) == (4, 20000)
    assert got.mean == pytest.approx(d.mean()) and (got.low, got.high) == pytest.approx((lo, hi), abs=0.01)
    assert got.low <= got.mean <= got.high < 0
    assert paired_gap({0: 1.0}, {0: 2.0}) is None  # one pair: no interval


def test_paired_gap_of_two_runs_pairs_the_same_examples(runs):
    models, sample = runs
    report = forensics(models["buggy", 0], sample, control=models["correct", 1], capacity=128)
    s, c = report.suspect, report.control
    assert set(s.gaps) == set(c.gaps) and len(s.gaps) == s.n  # the same examples, model-independent
    paired = report.paired_gap()
    # the mean of differences is the difference of means on the same examples
    assert paired.n == s.n and paired.mean == pytest.approx(s.pack_gap - c.pack_gap, abs=1e-6)
    assert paired.high < 0, paired  # the leaky run's gap is smaller, beyond the interval
    assert "paired, suspect minus control pack gap" in report.table()
    bare = Evidence(c.n, c.alone_loss, c.packed_loss, c.pack_gap, c.neighbour_influence)  # no per-example gaps
    assert forensics(models["buggy", 0], sample, control=bare, capacity=128).paired_gap() is None
    # a control measured on other examples, or in other packs, has nothing to pair with
    other = measure(models["correct", 1], sample[::-1], capacity=128)
    assert forensics(models["buggy", 0], sample, control=other, capacity=128).paired_gap() is None
    wider = measure(models["correct", 1], sample, capacity=256)
    report = forensics(models["buggy", 0], sample, control=wider, capacity=128)
    assert report.paired_gap() is None and "paired" not in report.table()
