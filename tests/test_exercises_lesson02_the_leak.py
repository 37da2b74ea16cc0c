"""Checks of notebook 02_the_leak: the reference solutions pass, typical mistakes fail by name."""

from __future__ import annotations

import pytest
import torch

from packsim.core.attention_share import outside_share
from packsim.core.model import attention_maps, build_model
from packsim.course.exercises.lesson02_the_leak import (
    check_outside_attention_share,
    check_which_examples_move,
)
from packsim.course.solutions import lesson02_the_leak as sol


def test_other_correct_forms_pass():
    import numpy as np

    def as_list(k, n, mask):  # a list, or numpy ints, is fine too
        return [torch.tensor(j).item() for j in range(k + 1, n)] if mask == "causal" else []

    def as_tensor(k, n, mask):  # a tensor of indices; the empty one is float (torch.tensor([]))
        return torch.arange(k + 1, n) if mask == "causal" else torch.tensor([])

    def by_comprehension(k, n, mask):  # a frozenset from a scan over every example
        return frozenset(j for j in range(n) if j > k and mask != "block_diagonal")

    def numpy_array(k, n, mask):
        return np.arange(n)[np.arange(n) > k] if mask == "causal" else np.array([], dtype=int)

    for fn in (as_list, as_tensor, by_comprehension, numpy_array):
        fb = check_which_examples_move(fn)
        assert fb.passed, (fn.__name__, fb)

    def numpy_shares(attn, seq):
        return sol.outside_attention_share(attn, seq).numpy()

    def one_minus_inside_float32(attn, seq):  # 1 - share inside, in float32
        same = seq[:, None] == seq[None, :]
        return 1 - attn.float().masked_fill(~same, 0).sum(dim=1)

    def loop_of_floats(attn, seq):  # one Python float per query
        return [sum(float(attn[q, k]) for k in range(len(seq)) if seq[k] != seq[q]) for q in range(len(seq))]

    for fn in (numpy_shares, one_minus_inside_float32, loop_of_floats):
        fb = check_outside_attention_share(fn)
        assert fb.passed, (fn.__name__, fb)


# --- which examples move ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "wrong, words",
    [
        (lambda k, n, m: set(range(k, n)) if m == "causal" else {k}, "included example"),
        (lambda k, n, m: set(range(k)) if m == "causal" else set(), "packed before"),
        (lambda k, n, m: set(range(n)) - {k} if m == "causal" else set(), "packed before"),
        (lambda k, n, m: set(range(k + 1, n - 1)) if m == "causal" else set(), "missed the last"),
        (lambda k, n, m: set(range(k + 2, n)) if m == "causal" else set(), "right after"),
        (lambda k, n, m: set(range(k + 1, n + 1)) if m == "causal" else set(), "no example"),
        (lambda k, n, m: set(range(k + 1, n)), "block-diagonal"),
        (lambda k, n, m: n - k - 1, "not a set"),
        (lambda k, n, m: {"later"}, "ints"),
    ],
)
def test_which_examples_move_mistakes(wrong, words):
    fb = check_which_examples_move(wrong)
    assert not fb.passed and fb.attempted
    assert words in str(fb), fb


# --- outside attention share --------------------------------------------------------------------


def _other(seq):
    return seq[:, None] != seq[None, :]


def _shift_queries(attn, seq):  # each example "starts" one token late
    shifted = torch.cat([seq[:1], seq[:-1]])
    return (attn * (shifted[:, None] != seq[None, :])).sum(-1)


def _padding_ignored(attn, seq):  # padding queries get 0
    return (attn * _other(seq)).sum(-1) * (seq >= 0)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (lambda a, s: (a * ~_other(s)).sum(-1), "inside"),
        (lambda a, s: (a * _other(s)).sum(0), "summed over the queries"),
        (lambda a, s: (a * _other(s)).sum(-1).mean(), "one number"),
        (lambda a, s: a * _other(s), "shape"),
        (_shift_queries, "off-by-one"),
        (_padding_ignored, "padding"),
        (lambda a, s: (a * (s[None, :] < s[:, None])).sum(-1), "expected"),
        (lambda a, s: "leak", "not numbers"),
    ],
)
def test_outside_share_mistakes(wrong, words):
    fb = check_outside_attention_share(wrong)
    assert not fb.passed and fb.attempted
    assert words in str(fb), fb


def test_solution_matches_library_on_real_attention():
    from packsim.core.batch import PackedBatch
    from packsim.core.data import make_examples

    batch = PackedBatch.from_examples(make_examples(3, seed=0), 64, "buggy", strategy="sequential")
    maps = attention_maps(build_model(seed=0), batch)  # (L, B, H, T, T)
    attn, seq = maps[1, 0, 2], batch.seq_ids[0]
    mine = sol.outside_attention_share(attn, seq)
    assert torch.allclose(mine, outside_share(maps, batch.seq_ids)[1, 0, 2])
    assert mine[batch.segments[-1].start :][seq[batch.segments[-1].start :] >= 0].min() > 0
