"""The check of notebook 00's exercise names typical mistakes (reference and stub: test_exercises.py)."""

from __future__ import annotations

from packsim.course.exercises.lesson00_start_here import check_padding_share


def test_real_share_instead_of_padding_is_named():
    fb = check_padding_share(lambda b: b.real_mask.float().mean().item())
    assert not fb.passed and "real" in fb.message and "real_mask" in fb.hint


def test_count_instead_of_share_is_named():
    fb = check_padding_share(lambda b: int((~b.real_mask).sum()))
    assert not fb.passed and "number of padding tokens" in fb.message and "B * T" in fb.hint


def test_dividing_by_real_tokens_is_named():
    fb = check_padding_share(lambda b: (~b.real_mask).sum().item() / b.n_real_tokens)
    assert not fb.passed and "divided by the real tokens" in fb.message


def test_non_number_is_named():
    assert "not a number" in check_padding_share(lambda b: "0.5").message


def test_learner_exception_is_reported_not_raised():
    fb = check_padding_share(lambda b: b.no_such_field)
    assert not fb.passed and fb.attempted and "AttributeError" in fb.message
