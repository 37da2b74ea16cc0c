"""Checks of notebook 09_interview_drills: the reference passes, typical mistakes are named."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from packsim.course.exercises.lesson09_interview_drills import (
    BUGS,
    CAUSES,
    FOLLOWUPS,
    REVIEW_SNIPPET,
    SYMPTOMS,
    check_diagnosis,
    check_followups,
    check_q1_answer,
    check_review,
)
from packsim.course.solutions import lesson09_interview_drills as sol

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "09_interview_drills.ipynb"


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


def _model_answer_of_lesson_09() -> str:
    """The folded model answer to question 1 in the notebook itself: a right answer not written for the check."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    return next(c.source for c in nb.cells if c.source.startswith("<details><summary><b>Model answer to question 1"))


RIGHT_ANSWERS = {
    "reference": sol.q1_answer,
    "terse": "Tiling plus an online softmax, so no N x N matrix. Input: cu_seqlens offsets. Tiles "
    "across examples are skipped. Cost: sum of L_i^2 instead of N^2.",
    "paraphrase": "FlashAttention splits Q and K into blocks and keeps a running max and sum per row, so "
    "the scores are never written to HBM. You hand it the cumulative sequence lengths. A block never "
    "computes scores between two documents, and the work is quadratic in each sequence rather than "
    "in the pack.",
    "denies the red flags": "Tiles with an online softmax and cu_seqlens; cross-example tiles are "
    "skipped, so the work is the sum of squared lengths. It does not build a dense mask in SRAM and "
    "does not multiply scores by zero; position ids alone never isolate anything.",
    "per CTA": "Instead of a mask, FlashAttention-2's varlen API takes cu_seqlens. Each CTA handles a "
    "query block of one sequence and iterates over key blocks of the same sequence only, using online "
    "softmax. So cost is proportional to sum of L_i^2.",
    "in words": "It tiles Q, K, V into SRAM with an online softmax and gets boundaries from cu_seqlens; "
    "a query tile only loops over key tiles within its own document, so attention is quadratic only "
    "within each document: the sum over documents of L squared.",
    "as a list": ["Tiles and an online softmax.", "cu_seqlens gives the offsets.",
                  "Cross-example tiles are never computed.", "Work: Σ L_i²."],
}


@pytest.mark.parametrize("name", [*RIGHT_ANSWERS, "the notebook's model answer"])
def test_q1_right_answers_pass(name):
    answer = RIGHT_ANSWERS.get(name) or _model_answer_of_lesson_09()
    fb = check_q1_answer(answer)
    assert fb.passed and fb.attempted, fb
    assert "all four ingredients" in _text(fb)


BASE = "Tiles with an online softmax; it takes cu_seqlens; cross-example tiles are skipped; work is the sum of squared lengths."
RED_FLAGS = {  # a junior answer's false claim, and a word of the check's reason it is false
    "It builds the block-diagonal boolean mask once in fast on-chip memory.": "not even on chip",
    "It builds the mask in shared memory and reuses it for every head.": "not even on chip",
    "Cross-example scores are multiplied by zero before the softmax.": "exp(0) = 1",
    "Resetting position_ids to 0 at each example is what isolates the examples.": "do not restrict",
    "Each example is padded to max_seqlen inside the kernel.": "there is no padding",
    # a negation in the sentence that denies something else (issue 32 review)
    "It builds the block-diagonal mask in SRAM, not in HBM.": "not even on chip",
    "Cross-example scores are multiplied by zero, so no extra memory is needed.": "exp(0) = 1",
    "It multiplies the cross-example scores by zero instead of computing a mask.": "exp(0) = 1",
    "Position ids are what isolate the examples, no mask needed.": "do not restrict",
}


@pytest.mark.parametrize("claim", RED_FLAGS)
def test_q1_red_flag_fails_and_says_why(claim):
    fb = check_q1_answer(BASE + " " + claim)
    assert not fb.passed and "red flag" in _text(fb), fb
    assert RED_FLAGS[claim] in _text(fb) and claim.lower().rstrip(".") in _text(fb)  # the sentence quoted


def test_q1_right_answers_with_a_red_flag_added_fail():
    for answer in (sol.q1_answer, _model_answer_of_lesson_09()):
        assert not check_q1_answer(answer + " It multiplies the cross-example scores by zero.").passed


@pytest.mark.parametrize(("cut", "missing"), [
    ("work is the sum of squared lengths", "what it costs"),
    ("it takes cu_seqlens", "with what"),
    ("cross-example tiles are skipped", "what is skipped"),
    ("Tiles with an online softmax", "how"),
])
def test_q1_missing_ingredient_named(cut, missing):
    fb = check_q1_answer(BASE.replace(cut, "it is fast"))
    assert not fb.passed and f"missing: {missing}" in _text(fb).replace("*", ""), fb


def test_q1_depth_named_when_present_and_asked_next_when_absent():
    assert "depth you added" in _text(check_q1_answer(sol.q1_answer))
    fb = check_q1_answer(BASE)
    assert fb.passed and "may ask next" in _text(fb) and "backward" in _text(fb)


def test_q1_not_text_and_stub():
    fb = check_q1_answer({"A", "B", "C", "D"})  # the old multiple-choice form
    assert not fb.passed and "as text" in _text(fb)
    assert check_q1_answer(...).attempted is False
    assert not check_q1_answer("").passed


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
