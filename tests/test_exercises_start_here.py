"""The check of notebook 00's exercise: the reference passes, typical mistakes are named."""

from __future__ import annotations

from packsim.exercises.start_here import check_padding_share
from packsim.solutions.start_here import padding_share


def test_reference_solution_passes():
    fb = check_padding_share(padding_share)
    assert fb.passed and fb.attempted and fb.exercise == "padding share", fb


def test_real_share_instead_of_padding_is_named():
    fb = check_padding_share(lambda b: b.real_mask.float().mean().item())
    assert not fb.passed and "real" in fb.message and "real_mask" in fb.hint


def test_count_instead_of_share_is_named():
    fb = check_padding_share(lambda b: int((~b.real_mask).sum()))
    assert not fb.passed and "number of padding tokens" in fb.message and "B * T" in fb.hint


def test_dividing_by_real_tokens_is_named():
    fb = check_padding_share(lambda b: (~b.real_mask).sum().item() / b.n_real_tokens)
    assert not fb.passed and "divided by the real tokens" in fb.message


def test_non_number_and_stub():
    assert "not a number" in check_padding_share(lambda b: "0.5").message

    def stub(batch):
        raise NotImplementedError

    for unfinished in (..., stub):
        fb = check_padding_share(unfinished)
        assert not fb.passed and not fb.attempted and fb.status == "not done yet"


def test_learner_exception_is_reported_not_raised():
    fb = check_padding_share(lambda b: b.no_such_field)
    assert not fb.passed and fb.attempted and "AttributeError" in fb.message
