"""Checks of notebook 09_interview_drills: the reference passes, typical mistakes are named; question 1's
written answer gets a self-check that never gives a verdict and points at what each wrong answer gets wrong."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from packsim.course.cases.lesson09_rubric import Q1_RUBRIC, SelfCheck, read, sentences
from packsim.course.exercises import Feedback
from packsim.course.exercises.lesson09_interview_drills import (
    BUGS,
    CAUSES,
    FOLLOWUPS,
    REVIEW_SNIPPET,
    SYMPTOMS,
    assess_q1_answer,
    check_diagnosis,
    check_followups,
    check_review,
)
from packsim.course.solutions import lesson09_interview_drills as sol

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "09_interview_drills.ipynb"


def _text(fb) -> str:
    if isinstance(fb, SelfCheck):  # a self-check has no message and hint: its text, as a script prints it
        return str(fb).lower()
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


# ----------------------------------------------------------------------------- q1: a self-check, no verdict


def _model_answer_of_lesson_09() -> str:
    """The folded model answer to question 1 in the notebook itself: a right answer not written for the check."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    return next(c.source for c in nb.cells if c.source.startswith("<details><summary><b>Model answer to question 1"))


def _reading(answer):
    return read("\n\n".join(answer) if isinstance(answer, list) else answer, Q1_RUBRIC)


# Issue 40: the earlier check called seven of ten wrong answers "correct". Each wrong answer here, the
# issue's (quoted, completed into an answer where it quotes a sentence) and more in other styles, with
# what the self-check must point at, written by hand: ("flag", its claim), ("missing", a part),
# ("negated", a phrase a negation governs) or ("list",) for a sentence that only names terms.
WRONG_ANSWERS = {
    "issue: none of that matters": (
        "Tiles, online softmax, cu_seqlens, skip, sum of squares: none of that matters, the kernel just "
        "computes the full N x N attention.", [("flag", "N^2 work or memory"), ("list",)]),
    "issue: a dense mask loaded from HBM": (
        "The kernel works in tiles with an online softmax and takes cu_seqlens; it loads a dense mask from "
        "HBM tile by tile and skips cross-example tiles, so the work is the sum of squared lengths.",
        [("flag", "a mask loaded from HBM")]),
    "issue: still N^2 work": (
        "It uses tiles and an online softmax with cu_seqlens offsets, and cross-example tiles are skipped, but "
        "it is still N^2 work because every block is launched, so the sum of squared lengths is only the "
        "useful part.", [("flag", "N^2 work or memory")]),
    "issue: RoPE positions keep the examples apart": (
        "Tiles with an online softmax, cu_seqlens offsets, cross-example tiles skipped, work the sum of squared "
        "lengths: the restarted RoPE positions are what keep the examples apart.", [("flag", "position ids isolate")]),
    "issue: the bare keyword list": ("tiles, online softmax, cu_seqlens, skip, sum of squared lengths", [("list",)]),
    "a materialised backward": (
        "Forward: tiles with an online softmax and cu_seqlens; cross-example tiles are skipped; work is the sum "
        "of squared lengths. In the backward it stores the attention probabilities of every tile to compute "
        "the gradients.", [("flag", "a materialised backward")]),
    "padded to max_seqlen": (
        "Each example is padded to max_seqlen and run in tiles with an online softmax; cu_seqlens gives the "
        "offsets, tiles across examples are skipped, and the cost is the sum of squared lengths.",
        [("flag", "examples padded to max_seqlen")]),
    "terse: scores zeroed": (
        "Tiles + online softmax. cu_seqlens. Cross-example scores multiplied by zero. Cost Σ L_i².",
        [("flag", "cross-example scores zeroed"), ("missing", "what is skipped")]),
    "non-native: every tile computed": (
        "The flash kernel is make the tiles with online softmax and it take the cu_seqlens, but it compute all "
        "the tiles of the pack and put -inf for other example, so only the sum of squared lengths is useful.",
        [("flag", "N^2 work or memory"), ("missing", "what is skipped")]),
    "formulas: O(N^2) FLOPs": (
        "O(N²) FLOPs with tiling + online softmax; mask M[i,j] = (seg[i]==seg[j]) applied per tile; cu_seqlens "
        "only for the output offsets; Σ L_i² is the useful work.",
        [("flag", "N^2 work or memory"), ("missing", "what is skipped")]),
    "long paragraph: the mask built in shared memory": (
        "FlashAttention never writes the attention matrix to HBM. Instead each thread block loads a tile of "
        "queries into SRAM and streams the key tiles past it with an online softmax, keeping a running max and "
        "sum. For a packed batch you pass cu_seqlens, the cumulative lengths, and the kernel builds the "
        "block-diagonal mask in shared memory for each tile, then skips the tiles that the mask leaves empty, "
        "so the work is the sum of squared lengths rather than the square of the pack length.",
        [("flag", "a mask built on chip")]),
    "a list: position ids isolate": (
        ["Tiles and an online softmax.", "Position ids restart at 0 for each example, which isolates them.",
         "cu_seqlens gives the offsets.", "Cross-example tiles are skipped.", "Work: Σ L_i²."],
        [("flag", "position ids isolate")]),
    "tiles not skipped": (
        "Tiles are not skipped: the kernel computes every tile with an online softmax and cu_seqlens, and the "
        "sum of squared lengths is the part that is kept.", [("flag", "N^2 work or memory"), ("negated", "skip")]),
    "shallow": (
        "FlashAttention is fast because it is IO-aware and fuses the kernel, so it handles masks efficiently "
        "without any extra memory.",
        [("missing", "how"), ("missing", "with what"), ("missing", "what is skipped"), ("missing", "what it costs")]),
}

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
    # the three right answers the earlier check rejected (issue 40)
    "issue: formulas": "S = QKᵀ computed tile by tile with an online softmax: m ← max(m, rowmax(S_ij)), "
    "ℓ ← e^(m_old − m)·ℓ + rowsum(P_ij). cu = [0, L0, L0+L1, …]; block (b, i) only visits key tiles j with "
    "cu[b] ≤ j·B < cu[b+1]. FLOPs ∝ Σ_b L_b², not N².",
    "issue: a prefix-sum array of the lengths": "It processes Q and K in tiles, with a running softmax so no "
    "N x N matrix is stored. The boundaries come from a prefix-sum array of the lengths, so each query tile "
    "only loops over key tiles of its own example: tiles that straddle two examples are skipped. Cost is "
    "the sum of squared lengths.",
    "issue: L1 squared plus L2 squared": "Two examples of lengths L1 and L2: the kernel tiles Q, K and V and "
    "keeps an online softmax, and it takes cu_seqlens = [0, L1, L1+L2]. It never forms a tile that mixes "
    "the two, so the work is L1 squared plus L2 squared (halved for causal), not (L1+L2) squared.",
    "non-native": "Flash attention make tiles of Q and K and use online softmax, so it never need the big "
    "N x N matrix. It get cu_seqlens, the offsets of every example, and one block work only inside its own "
    "example, the tiles between two examples are skip. So cost is like sum of each length square, not N square.",
    "long paragraph": "The trick is that FlashAttention never has the score matrix at all. Each thread block "
    "owns one tile of queries, keeps it on chip, and walks over the key tiles with an online softmax (a "
    "running maximum and a running sum, rescaled as it goes), writing only the output and a log-sum-exp per "
    "row. For a pack you call the varlen entry point with cu_seqlens, the int32 offsets where each example "
    "starts, and max_seqlen, which sizes the grid. A block reads its example's start and end from the "
    "offsets and loops only over the key tiles of that example, stopping at the diagonal, so a tile "
    "spanning two examples is never computed and there is nothing to mask except inside the diagonal "
    "tiles. The cost is therefore the sum of the squared example lengths instead of the square of the pack "
    "length, memory stays linear, and the backward recomputes the same tiles from the log-sum-exp.",
    "bullets": "- tiling + online softmax (no N x N scores)\n- cu_seqlens offsets\n- cross-example tiles "
    "skipped\n- work ∑ L_i²",
}

# Right sentences that use a red flag's words to deny it: the first two are the (the second is the
# rubric's own explanation), the others are written here. Each is appended to a right answer.
CONTRASTIVE = [
    "Position ids separate nothing: the offsets do.",
    "Restarting position ids are used to separate the examples into cu_seqlens before the kernel runs.",
    "Unlike a dense mask loaded from HBM, the kernel reads only cu_seqlens.",
    "Nothing is padded to max_seqlen: max_seqlen only sizes the grid.",
    "Instead of N^2 work it does the sum of L_i^2.",
    "The backward does not store the N x N probabilities either: it recomputes each tile from the log-sum-exp.",
    "A naive kernel would compute the full N x N attention; this one does not.",
    "No mask is read from memory.",
    "It avoids N² memory and work.",
    "That is far less than N^2 work.",
    "Position ids alone never isolate anything; the mask or the offsets do.",
    # right sentences with a flag's words that deny nothing: about one tile, or about another path
    "Each block computes all the scores of its tile with an online softmax.",
    "The causal kernel over the whole pack computes all N^2/2 pairs, which is the bug's cost.",
    "With one example per row and padding to the longest, you would pay for the padding too.",
    "The dense path (sdpa with a 4D mask) costs N^2 memory; varlen costs O(N).",
    "It never loads a mask: the boundaries come from cu_seqlens.",
]

# a verdict word anywhere outside the box's fixed intro would read as a grade
VERDICT = re.compile(r"\b(correct|wrong|right|pass(ed|es)?|fail(ed|s)?|well done|good answer|all four)\b", re.I)


def _outside_intro(result, answer) -> str:
    """The box's text without its fixed intro and without what it quotes of the answer."""
    text = str(result).replace(SelfCheck.INTRO, "")
    r = _reading(answer)
    quoted = [f'"{s}"' for s in sentences("\n\n".join(answer) if isinstance(answer, list) else answer)]
    quoted += [f"'{f.phrase}'" for hits in [*r.found.values(), *r.extras.values()] for f in hits]
    for q in sorted(quoted, key=len, reverse=True):
        text = text.replace(q, "")
    return text


@pytest.mark.parametrize("name", [*WRONG_ANSWERS, *RIGHT_ANSWERS, "the notebook's model answer"])
def test_q1_never_gives_a_verdict(name):
    answer = (WRONG_ANSWERS.get(name, (None,))[0] or RIGHT_ANSWERS.get(name) or _model_answer_of_lesson_09())
    result = assess_q1_answer(answer)
    assert isinstance(result, SelfCheck) and not hasattr(result, "passed"), result
    assert result.status == "self-check" and not VERDICT.search(_outside_intro(result, answer)), result
    html = result._repr_html_()
    assert "self-check" in html and "&#10004;" not in html and "&#10008;" not in html  # no verdict mark


@pytest.mark.parametrize("name", WRONG_ANSWERS)
def test_q1_each_wrong_answer_is_pointed_at_what_is_wrong(name):
    answer, expected = WRONG_ANSWERS[name]
    r = _reading(answer)
    got = {("flag", f.claim) for f, _ in r.flags} | {("missing", i.name) for i in r.missing}
    got |= {("negated", f.phrase) for hits in r.found.values() for f in hits if f.denied}
    got |= {("list",)} if r.term_lists else set()
    assert got == set(expected), got
    text = _text(assess_q1_answer(answer))
    for kind, *what in expected:  # the box says each of them
        if kind == "flag":
            flag = next(f for f in Q1_RUBRIC.flags if f.claim == what[0])
            sentence = next(s for f, s in r.flags if f is flag)
            assert f'reread "{sentence.lower()}"' in text and flag.why.lower() in text
        elif kind == "missing":
            assert f"{what[0]}: the model answer:" in text and "no words of it found" in text
        elif kind == "negated":
            assert f"a negation governs '{what[0].lower()}'" in text
        else:
            assert "a list, not an explanation" in text


@pytest.mark.parametrize("name", [*RIGHT_ANSWERS, "the notebook's model answer"])
def test_q1_right_answers_have_every_part_and_no_flag(name):
    r = _reading(RIGHT_ANSWERS.get(name) or _model_answer_of_lesson_09())
    assert not r.missing and not r.flags and not r.term_lists, (r.missing, r.flags, r.term_lists)
    assert not [f for hits in r.found.values() for f in hits if f.denied]


@pytest.mark.parametrize("sentence", CONTRASTIVE)
def test_q1_right_contrastive_sentences_raise_no_flag(sentence):
    for base in (sol.q1_answer, RIGHT_ANSWERS["terse"]):
        r = _reading(base + " " + sentence)
        assert not r.flags and not r.missing, r.flags


BASE = "Tiles with an online softmax; it takes cu_seqlens; cross-example tiles are skipped; work is the sum of squared lengths."
RED_FLAGS = {  # a junior answer's false claim, and a word of the reason the box gives
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
    # issue 40's red flags
    "It reads the block-diagonal mask from HBM one tile at a time.": "in hbm or on chip",
    "The kernel still computes all the scores and discards the cross-example ones.": "sum of squared",
    "The memory is O(N^2) because of the scores.": "memory o(n)",
    "The backward keeps the N x N attention matrix from the forward.": "recomputes each score tile",
    "The kernel computes all the scores in the pack and masks the cross-example ones.": "never computed",
}


@pytest.mark.parametrize("claim", RED_FLAGS)
def test_q1_red_flag_is_quoted_with_why(claim):
    text = _text(assess_q1_answer(BASE + " " + claim))
    assert f'reread "{claim.lower()}"' in text and RED_FLAGS[claim] in text, text


def test_q1_right_answers_with_a_red_flag_added_get_it():
    for answer in (sol.q1_answer, _model_answer_of_lesson_09()):
        assert [f.claim for f, _ in _reading(answer + " It multiplies the cross-example scores by zero.").flags] == [
            "cross-example scores zeroed"]


@pytest.mark.parametrize(("cut", "missing"), [
    ("work is the sum of squared lengths", "what it costs"),
    ("it takes cu_seqlens", "with what"),
    ("cross-example tiles are skipped", "what is skipped"),
    ("Tiles with an online softmax", "how"),
])
def test_q1_missing_part_shown_beside_the_model_answer(cut, missing):
    r = _reading(BASE.replace(cut, "it is fast"))
    assert [i.name for i in r.missing] == [missing]
    what = next(i.what for i in Q1_RUBRIC.required if i.name == missing)
    assert f"{missing}: the model answer: {what}. yours: no words of it found.".lower() in _text(assess_q1_answer(BASE.replace(cut, "it is fast")))


def test_q1_shows_where_each_part_was_read():
    text = _text(assess_q1_answer(BASE))
    assert "how: the model answer:" in text and "yours: 'tiles' + 'online softmax' in \"tiles with an online softmax;\"" in text


def test_q1_depth_named_when_present_and_asked_next_when_absent():
    assert "depth you touched" in _text(assess_q1_answer(sol.q1_answer))
    text = _text(assess_q1_answer(BASE))
    assert "may ask next" in text and "backward" in text


def test_q1_not_text_and_stub():
    fb = assess_q1_answer({"A", "B", "C", "D"})  # the old multiple-choice form
    assert isinstance(fb, Feedback) and not fb.passed and "as text" in _text(fb)
    assert assess_q1_answer(...).attempted is False and assess_q1_answer(...).status == "not done yet"
    assert not assess_q1_answer("").passed and "empty" in _text(assess_q1_answer("  "))


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
