"""The trainer: every setup runs, same seed gives the same curves, every setup sees the same data."""

import math

import pytest
import torch
from toy import VOCAB, toy_examples

from packsim.core.errors import PacksimError
from packsim.core.model import build_model
from packsim.core.setups import SETUPS
from packsim.experiment.results import StepRecord
from packsim.experiment.training import TrainConfig, lr_at, make_batches, train


def _data(n=160, seed=3):
    shapes = [((i * 7) % 9 + 1, (i * 5) % 6 + 1) for i in range(n)]
    return toy_examples(shapes, seed)


CFG = TrainConfig(steps=12, examples_per_step=8, capacity=48, lr=3e-3, warmup_steps=2, eval_every=4, backend="blocked")


def _run(setup, seed=0, **kw):
    model = build_model("tiny", vocab_size=VOCAB, seed=seed)
    return train(model, _data(), setup, kw.pop("cfg", CFG), seed=seed, progress=False, **kw)


@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_every_setup_trains_and_records_every_curve(setup):
    calls = []
    run = _run(setup, evaluate=lambda m, step: {"isolated_exact_match": step / 100}, callback=calls.append)
    tr = run.curves["train"]
    assert tr["step"] == list(range(1, 13))
    for key in ("reported_loss", "response_loss", "real_tokens_per_s", "padded_tokens_per_s", "elapsed_s"):
        assert len(tr[key]) == 12 and all(math.isfinite(v) and v > 0 for v in tr[key]), key
    assert all(p >= r for p, r in zip(tr["padded_tokens_per_s"], tr["real_tokens_per_s"], strict=True))
    assert run.curves["eval"]["step"] == [4, 8, 12]
    assert run.curves["eval"]["isolated_exact_match"] == [0.04, 0.08, 0.12]
    assert [c.kind for c in calls].count("eval") == 3 and len(calls) == 15
    assert all(isinstance(c, StepRecord) and c.setup == setup and c.seed == 0 for c in calls)
    assert run.final["isolated_exact_match"] == 0.12 and run.final["reported_loss"] > 0


def test_reported_loss_is_the_setups_loss_and_response_loss_what_matters():
    correct, buggy = _run("correct"), _run("buggy")
    # correct counts only response tokens: its reported loss *is* the response loss
    assert correct.curves["train"]["reported_loss"] == pytest.approx(correct.curves["train"]["response_loss"])
    # buggy counts prompt, padding and boundary tokens too: the two differ from step 1
    assert buggy.curves["train"]["reported_loss"][0] != pytest.approx(buggy.curves["train"]["response_loss"][0])


def test_same_seed_gives_identical_curves_and_other_seed_does_not():
    a, b, c = _run("correct", seed=0), _run("correct", seed=0), _run("correct", seed=1)
    assert a.curves["train"]["reported_loss"] == b.curves["train"]["reported_loss"]
    assert a.curves["train"]["reported_loss"] != c.curves["train"]["reported_loss"]


def test_padded_and_correct_take_identical_steps():
    """Same examples, both isolate them and count only responses: identical losses (up to float)."""
    padded, correct = _run("padded"), _run("correct")
    assert padded.curves["train"]["reported_loss"][:3] == pytest.approx(correct.curves["train"]["reported_loss"][:3], abs=1e-5)


def test_every_setup_sees_the_same_examples_in_the_same_order():
    data = _data()
    per_setup = {s: make_batches(data, 48, s, examples_per_step=8) for s in ("buggy", "correct", "padded")}
    seen = {s: [sorted(seg.example for seg in b.segments) for b in bs] for s, bs in per_setup.items()}
    assert seen["buggy"] == seen["correct"] == seen["padded"]
    tokens = {s: [[b.input_ids[seg.row, seg.start:seg.stop].tolist() for seg in sorted(b.segments, key=lambda g: g.example)]
                  for b in bs] for s, bs in per_setup.items()}
    assert tokens["buggy"] == tokens["correct"] == tokens["padded"]
    runs = {s: _run(s) for s in ("buggy", "padded")}
    assert runs["buggy"].curves["train"]["real_tokens"] == runs["padded"].curves["train"]["real_tokens"]


def test_loss_decreases_on_a_trivial_task():
    data = toy_examples([(2, 2)] * 8, seed=0) * 40  # the same 8 examples over and over
    cfg = TrainConfig(steps=40, examples_per_step=8, capacity=48, lr=3e-3, warmup_steps=2, eval_every=0)
    run = train(build_model("tiny", vocab_size=VOCAB, seed=0), data, "correct", cfg, progress=False)
    losses = run.curves["train"]["reported_loss"]
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5


def test_group_losses_are_recorded_per_label():
    groups = ["first", "repeat"] * 80
    run = _run("buggy", groups=groups)
    tr = run.curves["train"]
    assert len(tr["response_loss_first"]) == len(tr["response_loss_repeat"]) == 12
    assert tr["response_loss_first"] != tr["response_loss_repeat"]


def test_learning_rate_warms_up_then_decays_to_the_floor():
    cfg = TrainConfig(steps=100, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == pytest.approx(1.0) and lr_at(100, cfg) == pytest.approx(0.1)
    assert all(lr_at(s, cfg) >= lr_at(s + 1, cfg) for s in range(10, 100))


def test_too_few_examples_for_the_budget_is_a_clear_error():
    with pytest.raises(PacksimError, match="12 steps x 8 examples need 96 training examples, got 10"):
        train(build_model("tiny", vocab_size=VOCAB), _data(10), "correct", CFG, progress=False)


def test_training_is_deterministic_whatever_the_global_rng_state():
    torch.manual_seed(123)  # global RNG state before the call must not matter
    a = _run("buggy").curves["train"]["reported_loss"]
    torch.manual_seed(999)
    assert _run("buggy").curves["train"]["reported_loss"] == a
