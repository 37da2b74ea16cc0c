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
