"""Checks of notebook 09_interview_drills: the reference passes, typical mistakes are named."""

from __future__ import annotations

from packsim.course.exercises.lesson09_interview_drills import (
    BUGS,
    CAUSES,
    FOLLOWUPS,
    Q1_STATEMENTS,
    REVIEW_SNIPPET,
    SYMPTOMS,
    check_diagnosis,
    check_followups,
    check_q1_answer,
    check_review,
)
from packsim.course.solutions import lesson09_interview_drills as sol


def _text(fb) -> str:
    return (fb.message + " " + fb.hint).lower()


# ----------------------------------------------------------------------------- review


def test_review_reference_passes():
    fb = check_review(sol.review)
    assert fb.passed and fb.attempted, fb
    assert sol.review <= set(BUGS)


def test_review_snippet_shows_the_bugs_the_key_names():
    lines = REVIEW_SNIPPET.splitlines()
    assert "[-100]" in lines[4] and lines[4].rstrip().endswith("[-100]")  # line 5: EOS masked
    assert lines[6].strip() == "cu_seqlens = torch.tensor(starts)"  # line 7: int64
    assert lines[7].strip().startswith("max_seqlen = len(ids) // len(examples)")  # line 8: the mean: too small


def test_review_missed_bug_points_to_line():
    fb = check_review({"eos_masked", "cu_seqlens_int64", "cu_seqlens_on_cpu"})
    assert not fb.passed and fb.attempted
    assert "missed 1 of 4" in _text(fb) and "line 8" in _text(fb)


def test_review_snippet_cu_seqlens_stays_on_the_cpu():
    # ground truth computed here: torch.tensor of Python ints lands on the CPU, and the snippet never moves it
    import torch

    lines = REVIEW_SNIPPET.splitlines()
    assert torch.tensor([0, 3, 7]).device.type == "cpu"
    assert "device" not in REVIEW_SNIPPET and ".to(" not in REVIEW_SNIPPET and ".cuda(" not in REVIEW_SNIPPET
    assert "flash_attn_varlen_func(q, k, v, cu, cu" in lines[11]  # line 12: handed to the CUDA kernel as built
    fb = check_review({"eos_masked", "cu_seqlens_int64", "max_seqlen_too_small"})  # the dtype fix alone is not enough
    assert not fb.passed and "missed 1 of 4" in _text(fb) and "lines 7 and 12" in _text(fb)


def test_review_false_alarm_explained():
    fb = check_review(sol.review | {"cu_seqlens_no_zero"})
    assert not fb.passed and "false alarm" in _text(fb) and "starts begins as [0]" in _text(fb)


def test_review_too_large_max_seqlen_is_not_the_bug():
    # the snippet's max_seqlen is too small; a too-large one is performance-only, and the feedback says so
    fb = check_review(sol.review | {"max_seqlen_total"})
    assert not fb.passed and "never wrong" in _text(fb)


def test_review_snippet_max_seqlen_is_below_the_longest_example():
    # ground truth computed here: the snippet's rule (the mean) against the longest of unequal lengths
    lengths = [5, 9, 30]
    assert sum(lengths) // len(lengths) < max(lengths)


def test_review_unknown_id_lists_choices():
    fb = check_review({"eos", "int64"})
    assert not fb.passed and "not bug ids" in _text(fb) and "cu_seqlens_int64" in _text(fb)


def test_review_stub_not_attempted():
    assert check_review(...).attempted is False
    assert check_review(set()).attempted is True  # an empty review is an answer: all missed


# ----------------------------------------------------------------------------- q1


def test_q1_reference_passes():
    fb = check_q1_answer(sol.q1_answer)
    assert fb.passed, fb
    assert check_q1_answer({"a", "b", "c", "d"}).passed  # I is optional; case does not matter


def test_q1_dense_mask_red_flag():
    fb = check_q1_answer({"A", "B", "C", "D", "E"})
    assert not fb.passed and "red flag" in _text(fb) and "e is false" in _text(fb)


def test_q1_zeroing_scores_red_flag():
    fb = check_q1_answer({"A", "B", "C", "D", "F"})
    assert not fb.passed and "never computed" in _text(fb)


def test_q1_missing_cost_model():
    fb = check_q1_answer({"A", "B", "C"})
    assert not fb.passed and "missing" in _text(fb) and "d (" in _text(fb)


def test_q1_unknown_letter_and_stub():
    assert "not among" in _text(check_q1_answer({"Z"}))
    assert check_q1_answer(...).attempted is False
    assert set(Q1_STATEMENTS) >= sol.q1_answer


# ----------------------------------------------------------------------------- diagnosis


def test_diagnosis_reference_passes():
    fb = check_diagnosis(sol.diagnosis)
    assert fb.passed, fb
    assert set(sol.diagnosis) == set(SYMPTOMS) and set(sol.diagnosis.values()) <= set(CAUSES)


def test_diagnosis_loss_curve_mistake_named():
    wrong = {**sol.diagnosis, "s2": "attention"}
    fb = check_diagnosis(wrong)
    assert not fb.passed and "s2" in fb.message and "mask-fix-only" in _text(fb)


def test_diagnosis_throughput_is_not_a_bug():
    fb = check_diagnosis({**sol.diagnosis, "s6": "attention"})
    assert not fb.passed and "what packing is for" in _text(fb)


def test_diagnosis_incomplete_and_bad_values():
    fb = check_diagnosis({"s1": "attention"})
    assert not fb.passed and "no cause given" in _text(fb)
    fb = check_diagnosis({**sol.diagnosis, "s1": "mask"})
    assert not fb.passed and "not a cause" in _text(fb)
    assert check_diagnosis(...).attempted is False
    assert not check_diagnosis(["s1"]).passed


# ----------------------------------------------------------------------------- follow-ups


def test_followups_reference_passes():
    fb = check_followups(sol.followups)
    assert fb.passed and fb.attempted, fb


def test_followups_wrong_answer_says_why():
    fb = check_followups({**sol.followups, "f6": "too large"})
    assert not fb.passed and "never launched" in _text(fb) and "1 of 8" in _text(fb)


def test_followups_bad_input():
    assert "dict" in _text(check_followups(["dQ"]))
    assert "no answer" in _text(check_followups({"f1": "dQ"}))
    assert "not one of its options" in _text(check_followups({**sol.followups, "f2": "maybe"}))


def test_followups_each_right_option_is_an_option():
    assert len(FOLLOWUPS) >= 5
    assert all(right in options for _, options, right, _ in FOLLOWUPS.values())


def test_attention_flops_share_matches_the_formula():
    d, length = 4096, 512
    assert 0.005 < length / (12 * d + length) < 0.015


# ----------------------------------------------------------------------------- other right answers


def test_review_other_forms_pass():
    assert check_review(sorted(sol.review)).passed  # a list
    assert check_review(tuple(b.upper() for b in sol.review)).passed  # a tuple, upper case
    assert check_review({f" {b} " for b in sol.review}).passed  # stray spaces


def test_q1_other_forms_pass():
    for answer in ({"A", "B", "C", "D"}, ["d", "c", "b", "a", "i"], "ABCD", "A, B, C, D, I"):
        fb = check_q1_answer(answer)
        assert fb.passed, (answer, fb)
    assert "red flag" in _text(check_q1_answer("ABCDE"))  # a string is read letter by letter, E included


def test_diagnosis_other_forms_pass():
    assert check_diagnosis({k.upper(): v.upper() for k, v in sol.diagnosis.items()}).passed
    assert check_diagnosis({f"{k} ": f" {v}" for k, v in reversed(sol.diagnosis.items())}).passed


def test_followups_other_forms_pass():
    shorter = {**sol.followups, "f1": "dq", "f5": "no", "f6": "Too  Small", "f9": "About 1%", "f10": "NO"}
    fb = check_followups(shorter)
    assert fb.passed, fb
    spaced = {k: f"  {v.upper()} " for k, v in sol.followups.items()}
    assert check_followups(spaced).passed


def test_followups_ambiguous_or_wrong_start_is_not_an_option():
    fb = check_followups({**sol.followups, "f9": "about 1"})  # the start of "about 1%" and of "about 10%"
    assert not fb.passed and "not one of its options" in _text(fb)
    fb = check_followups({**sol.followups, "f5": "yes"})  # a whole option, the wrong one
    assert not fb.passed and f"1 of {len(FOLLOWUPS)} wrong" in _text(fb) and "relative positions" in _text(fb)
