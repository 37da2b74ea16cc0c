"""The minimal trainer: deterministic on CPU, same examples for every setup, loss goes down."""

import torch
from conftest import VOCAB, toy_examples

from packsim.model import build_model
from packsim.train import make_batches, train_steps


def _data(n=160, seed=3):
    shapes = [((i * 7) % 9 + 1, (i * 5) % 6 + 1) for i in range(n)]
    return toy_examples(shapes, seed)


def _run(setup, steps=20, seed=0):
    batches = make_batches(_data(), capacity=48, setup=setup, examples_per_step=8)[:steps]
    model = build_model("tiny", vocab_size=VOCAB, seed=seed)
    return batches, train_steps(model, batches, lr=3e-3, seed=seed, backend="blocked")


def test_same_seed_gives_identical_packs_and_first_20_losses():
    b1, l1 = _run("correct")
    b2, l2 = _run("correct")
    assert len(l1) == 20 and l1 == l2
    assert all(torch.equal(x.input_ids, y.input_ids) for x, y in zip(b1, b2, strict=True))


def test_every_setup_sees_the_same_examples_in_the_same_order():
    data = _data()
    per_setup = {s: make_batches(data, 48, s, examples_per_step=8) for s in ("buggy", "correct", "padded")}
    seen = {s: [sorted(seg.example for seg in b.segments) for b in bs] for s, bs in per_setup.items()}
    assert seen["buggy"] == seen["correct"] == seen["padded"]


def test_loss_decreases_on_a_trivial_task():
    data = toy_examples([(2, 2)] * 8, seed=0) * 30  # the same 8 examples over and over
    model = build_model("tiny", vocab_size=VOCAB, seed=0)
    losses = train_steps(model, make_batches(data, 48, "correct", examples_per_step=8), lr=3e-3)
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
