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


# --- other right answers pass: any formula, any number type, rounded to 4 decimals ----------


def test_different_correct_answers_pass():
    from fractions import Fraction

    import numpy as np

    answers = {
        "a 0-d float tensor": lambda b: (~b.real_mask).float().mean(),
        "one minus the fill, from the token count": lambda b: 1 - b.n_real_tokens / b.real_mask.numel(),
        "an exact Fraction": lambda b: Fraction(int((~b.real_mask).sum()), b.real_mask.numel()),
        "the mean of per-row shares, numpy float32": lambda b: np.float32((~b.real_mask).numpy().mean(1).mean()),
        "rounded to 4 decimals": lambda b: round((~b.real_mask).sum().item() / b.real_mask.numel(), 4),
    }
    for what, fn in answers.items():
        fb = check_padding_share(fn)
        assert fb.passed, (what, fb)


def test_percent_is_named():
    fb = check_padding_share(lambda b: 100 * (~b.real_mask).float().mean().item())
    assert not fb.passed and "percentage" in fb.message and "fraction" in fb.hint


def test_rounding_too_coarse_and_per_row_shares_fail():
    fb = check_padding_share(lambda b: round((~b.real_mask).sum().item() / b.real_mask.numel(), 1))
    assert not fb.passed and "the padding share is" in fb.message
    fb = check_padding_share(lambda b: (~b.real_mask).float().mean(1))  # one share per row
    assert not fb.passed and "not a number" in fb.message
