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
