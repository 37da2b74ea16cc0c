"""The check of notebook 04_transformers_traps: the reference passes, typical mistakes are named."""

from __future__ import annotations

import torch

from packsim.course.exercises.lesson04_transformers_traps import check_position_ids_from_lengths
from packsim.course.solutions import lesson04_transformers_traps as sol


def _text(fb) -> str:
    return f"{fb.message} {fb.hint}".lower()


def test_positions_continuous():
    fb = check_position_ids_from_lengths(lambda ls: torch.arange(sum(ls)))
    assert not fb.passed and "restart" in _text(fb)


def test_positions_start_at_one():
    fb = check_position_ids_from_lengths(lambda ls: torch.cat([torch.arange(1, n + 1) for n in ls]))
    assert not fb.passed and "start at 1" in _text(fb)


def test_positions_float_dtype():
    fb = check_position_ids_from_lengths(lambda ls: sol.position_ids_from_lengths(ls).float())
    assert not fb.passed and "torch.long" in _text(fb)


def test_positions_other_right_answers_pass():
    def minus_starts(ls):  # one arange over the pack minus each token's example start
        lengths = torch.tensor(ls)
        starts = torch.cumsum(lengths, 0) - lengths
        return torch.arange(int(lengths.sum())) - torch.repeat_interleave(starts, lengths)

    def from_a_list(ls):  # a Python loop, then one tensor
        return torch.tensor([p for n in ls for p in range(n)], dtype=torch.long)

    def batch_of_one(ls):  # (1, N): the shape a transformers batch carries
        return sol.position_ids_from_lengths(ls)[None]

    for fn in (minus_starts, from_a_list, batch_of_one):
        fb = check_position_ids_from_lengths(fn)
        assert fb.passed, (fn.__name__, fb)


def test_positions_list_and_wrong_count_are_named():
    fb = check_position_ids_from_lengths(lambda ls: [p for n in ls for p in range(n)])
    assert not fb.passed and "torch.long tensor" in _text(fb)
    fb = check_position_ids_from_lengths(lambda ls: torch.cat([torch.arange(n - 1) for n in ls]))
    assert not fb.passed and "positions for" in _text(fb)
