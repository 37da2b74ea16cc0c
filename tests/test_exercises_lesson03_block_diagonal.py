"""The checks of notebook 03_block_diagonal: the reference passes, typical mistakes are named."""

from __future__ import annotations

import torch

from packsim.course.exercises.lesson03_block_diagonal import (
    check_block_causal_mask,
    check_cu_seqlens_from_lengths,
)
from packsim.course.solutions import lesson03_block_diagonal as sol


def _text(fb) -> str:
    return f"{fb.message} {fb.hint}".lower()


# ----------------------------------------------------------------------------- cu_seqlens


def test_cu_seqlens_missing_leading_zero():
    fb = check_cu_seqlens_from_lengths(lambda ls: torch.tensor(ls).cumsum(0).int())
    assert not fb.passed and fb.attempted and "leading 0" in _text(fb)


def test_cu_seqlens_int64_is_named():
    fb = check_cu_seqlens_from_lengths(lambda ls: torch.tensor([0, *ls]).cumsum(0))
    assert not fb.passed and "int32" in _text(fb) and "int64" in _text(fb)


def test_cu_seqlens_lengths_instead_of_offsets():
    fb = check_cu_seqlens_from_lengths(lambda ls: torch.tensor([0, *ls], dtype=torch.int32))
    assert not fb.passed and "lengths, not the offsets" in _text(fb)


def test_cu_seqlens_not_a_tensor():
    fb = check_cu_seqlens_from_lengths(lambda ls: [0, *torch.tensor(ls).cumsum(0).tolist()])
    assert not fb.passed and "torch.tensor" in _text(fb)


# ----------------------------------------------------------------------------- mask


def test_mask_not_causal():
    fb = check_block_causal_mask(lambda s: (s[:, None] == s[None, :]) & (s >= 0)[:, None] & (s >= 0))
    assert not fb.passed and "not causal" in _text(fb)


def test_mask_causal_but_not_block():
    fb = check_block_causal_mask(lambda s: torch.ones(len(s), len(s), dtype=torch.bool).tril())
    assert not fb.passed and "not block-diagonal" in _text(fb)


def test_mask_transposed():
    fb = check_block_causal_mask(lambda s: sol.block_causal_mask(s).T)
    assert not fb.passed and "transposed" in _text(fb)


def test_mask_padding_attends():
    def leaky_padding(s):
        T = len(s)
        return (s[:, None] == s[None, :]) & torch.ones(T, T, dtype=torch.bool).tril()

    fb = check_block_causal_mask(leaky_padding)
    assert not fb.passed and "padding" in _text(fb)


def test_mask_wrong_dtype():
    fb = check_block_causal_mask(lambda s: sol.block_causal_mask(s).float())
    assert not fb.passed and "torch.bool" in _text(fb)


# ----------------------------------------------------------------------------- other right answers


def test_cu_seqlens_other_right_answers_pass():
    import itertools

    import torch.nn.functional as F

    answers = {
        "accumulate with initial=0": lambda ls: torch.tensor(list(itertools.accumulate(ls, initial=0)), dtype=torch.int32),
        "F.pad of an int32 cumsum": lambda ls: F.pad(torch.tensor(ls).cumsum(0, dtype=torch.int32), (1, 0)),
        "cat, then .int()": lambda ls: torch.cat([torch.zeros(1, dtype=torch.long), torch.tensor(ls).cumsum(0)]).int(),
    }
    for what, fn in answers.items():
        fb = check_cu_seqlens_from_lengths(fn)
        assert fb.passed, (what, fb)


def test_mask_other_right_answers_pass():
    def from_aranges(s):  # positions compared, padding excluded on both sides
        i = torch.arange(len(s))
        return (s[:, None] == s[None, :]) & (i[:, None] >= i[None, :]) & (s[:, None] >= 0) & (s[None, :] >= 0)

    def keys_only(s):  # padding keys excluded suffice: a padding query shares its id with padding keys only
        return torch.tril(s[:, None] == s[None, :]) & (s >= 0)[None, :]

    for fn in (from_aranges, keys_only):
        fb = check_block_causal_mask(fn)
        assert fb.passed, (fn.__name__, fb)


# ----------------------------------------------------------------------------- every fault named (issue 40)


def test_cu_seqlens_two_faults_are_both_named():
    # the learner's answer: torch.cumsum of the lengths, no leading 0, int64 (cumsum's dtype for int64 input)
    answer = lambda ls: torch.tensor(ls).cumsum(0)  # noqa: E731
    assert answer([3, 2, 4]).tolist() == [3, 5, 9] and answer([3, 2, 4]).dtype == torch.int64  # ground truth
    fb = check_cu_seqlens_from_lengths(answer)
    text = _text(fb)
    assert not fb.passed and "two faults" in text and "leading 0" in text and "int64" in text and "int32" in text
    assert "prepend a 0" in text and "dtype=torch.int32" in text  # a fix for each


def test_cu_seqlens_a_list_without_the_leading_zero_hears_both():
    fb = check_cu_seqlens_from_lengths(lambda ls: torch.tensor(ls).cumsum(0).tolist())
    text = _text(fb)
    assert "two faults" in text and "not a torch.tensor" in text and "leading 0" in text


def test_cu_seqlens_three_faults():
    fb = check_cu_seqlens_from_lengths(lambda ls: torch.tensor([0, *ls])[None].float())  # lengths, 2-D, float
    text = _text(fb)
    assert "three faults" in text and "lengths, not the offsets" in text and "1-d" in text and "float32" in text
