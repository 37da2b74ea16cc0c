"""Checks of appendix A8's exercises 3 and 4: the reference and other correct answers pass, the
common wrong ones fail with feedback naming the mistake; ground truth computed here."""

from __future__ import annotations

import itertools
import random
import re
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn.functional as F

from packsim.core.model import build_model
from packsim.course.exercises import solution_source
from packsim.course.exercises.lesson09_follow_up_drills import (
    Q2_BEFORE,
    Q2_CARDS,
    Q2_DISTRACTORS,
    check_packed_token_logps,
    check_q2_order,
    loss_by_place,
    packed_logp_cases,
    q2_orders_count,
    q2_scenario,
)
from packsim.course.solutions import lesson09_follow_up_drills as sol
from packsim.course.solutions import lesson09_interview_drills as sol09

ROOT = Path(__file__).resolve().parent.parent


def _text(fb) -> str:
    return (fb.message + " " + fb.hint).lower()


def _spans(cu):
    b = cu.tolist()
    return list(itertools.pairwise(b))


# ----------------------------------------------------------------------------- ground truth, here


def _truth_by_loop(case) -> list[torch.Tensor]:
    """Each example alone through an *eager*-attention copy of the weights, one token at a time."""
    eager = build_model("tiny", vocab_size=96, seed=0, attn_implementation="eager")
    out = []
    for a, b in _spans(case.cu_seqlens):
        ids = case.input_ids[a:b]
        with torch.no_grad():
            logits = eager(input_ids=ids[None]).logits[0].double()  # (L, V)
        vals = [torch.log_softmax(logits[j - 1], -1)[ids[j]] for j in range(1, b - a) if case.completion_mask[a + j]]
        out.append(torch.stack(vals) if vals else torch.zeros(0, dtype=torch.float64))
    return out


# ----------------------------------------------------------------------------- correct answers pass


def vectorised(logits, input_ids, cu_seqlens, completion_mask):
    """One gather over the row, a mask that drops every example's first token, then a split."""
    tok = torch.log_softmax(logits, -1)[:-1].gather(-1, input_ids[1:, None])[:, 0]  # (T-1,): token t+1
    keep = completion_mask.clone()
    keep[cu_seqlens[:-1].long()] = False  # first tokens: their predictor is another example's
    owner = torch.repeat_interleave(torch.arange(len(cu_seqlens) - 1), cu_seqlens.diff().long())[1:]
    kept, who = tok[keep[1:]], owner[keep[1:]]
    return [kept[who == s] for s in range(len(cu_seqlens) - 1)]


def by_cross_entropy(logits, input_ids, cu_seqlens, completion_mask):
    """Per example, minus cross_entropy with prompt targets ignored (-100), float64."""
    out = []
    for a, b in _spans(cu_seqlens):
        targets = input_ids[a + 1:b].masked_fill(~completion_mask[a + 1:b], -100)
        nll = F.cross_entropy(logits[a:b - 1].double(), targets, ignore_index=-100, reduction="none")
        out.append(-nll[targets != -100])
    return out


@pytest.mark.parametrize("answer", [sol.packed_token_logps, vectorised, by_cross_entropy],
                         ids=["reference_loop", "vectorised", "cross_entropy"])
def test_correct_answers_pass(answer):
    fb = check_packed_token_logps(answer)
    assert fb.passed and fb.attempted, fb


def test_stub_is_not_done_yet():
    def stub(*args):
        raise NotImplementedError

    assert check_packed_token_logps(stub).attempted is False


# ----------------------------------------------------------------------------- the common mistakes


def no_shift(logits, input_ids, cu_seqlens, completion_mask):
    tok = torch.log_softmax(logits, -1).gather(-1, input_ids[:, None])[:, 0]
    return [tok[a:b][completion_mask[a:b]] for a, b in _spans(cu_seqlens)]


def crosses_boundary(logits, input_ids, cu_seqlens, completion_mask):
    """Shifts over the whole row: an example's first token is read from the previous example's last logit."""
    tok = torch.log_softmax(logits, -1)[:-1].gather(-1, input_ids[1:, None])[:, 0]
    tok = torch.cat([tok.new_zeros(1), tok])  # (T,): token t from logit t-1
    return [tok[a:b][completion_mask[a:b]] for a, b in _spans(cu_seqlens)]


def prompt_included(logits, input_ids, cu_seqlens, completion_mask):
    tok = torch.log_softmax(logits, -1)[:-1].gather(-1, input_ids[1:, None])[:, 0]
    return [tok[a:b - 1] for a, b in _spans(cu_seqlens)]


def sums(*args):
    return [x.sum() for x in sol.packed_token_logps(*args)]


def wrong_dim(logits, input_ids, cu_seqlens, completion_mask):
    lp = torch.log_softmax(logits, dim=0)
    return [lp[a:b - 1].gather(-1, input_ids[a + 1:b, None])[:, 0][completion_mask[a + 1:b]] for a, b in _spans(cu_seqlens)]


def raw_logits(logits, input_ids, cu_seqlens, completion_mask):
    return [logits[a:b - 1].gather(-1, input_ids[a + 1:b, None])[:, 0][completion_mask[a + 1:b]] for a, b in _spans(cu_seqlens)]


def mask_off_by_one(logits, input_ids, cu_seqlens, completion_mask):
    lp = torch.log_softmax(logits, -1)
    return [lp[a:b - 1].gather(-1, input_ids[a + 1:b, None])[:, 0][completion_mask[a:b - 1]] for a, b in _spans(cu_seqlens)]


def losses(*args):
    return [-x for x in sol.packed_token_logps(*args)]


def probabilities(*args):
    return [x.exp() for x in sol.packed_token_logps(*args)]


def one_tensor(*args):
    return torch.cat(sol.packed_token_logps(*args))


def drops_last_example(*args):
    return sol.packed_token_logps(*args)[:-1]


MISTAKES = {  # answer -> words the feedback must contain
    no_shift: ("no shift", "predicts token t + 1"),
    crosses_boundary: ("across the boundary", "three documents", "last logit of example"),
    prompt_included: ("prompt tokens are in", "your values are those of every token"),
    sums: ("per-sequence sums", "per token"),
    wrong_dim: ("wrong dim", "log_softmax(logits, dim=-1)"),
    raw_logits: ("wrong dim", "or not at all"),
    mask_off_by_one: ("first completion token", "mask[1:]"),
    losses: ("losses", "-log p"),
    probabilities: ("probabilities",),
    one_tensor: ("one tensor", "list of s = 4 tensors"),
    drops_last_example: ("3 tensors for s = 4 examples",),
}


@pytest.mark.parametrize("answer", list(MISTAKES), ids=[f.__name__ for f in MISTAKES])
def test_each_common_mistake_fails_with_its_name(answer):
    fb = check_packed_token_logps(answer)
    assert not fb.passed and fb.attempted, fb
    for words in MISTAKES[answer]:
        assert words in _text(fb), (words, fb)


def test_the_boundary_slip_is_invisible_when_prompts_come_first():
    # ground truth: on the GRPO row every example starts with prompt tokens, so the row-wide shift is right there
    group, docs = packed_logp_cases()
    for case, same in ((group, True), (docs, False)):
        got = crosses_boundary(case.logits, case.input_ids, case.cu_seqlens, case.completion_mask)
        want = _truth_by_loop(case)
        assert all(x.shape == y.shape and float((x.double() - y).abs().max()) < 1e-5 for x, y in zip(got, want, strict=True)) == same


# ----------------------------------------------------------------------------- question 2, in order

NEEDED = ["which", "by_place", "call", "packs", "probe", "weights", "paired_ci", "decide", "labels"]


def _extensions_brute_force() -> list[tuple[str, ...]]:
    """Every permutation of the needed cards that keeps each (u, v) of Q2_BEFORE in order."""
    return [p for p in itertools.permutations(NEEDED)
            if all(p.index(u) < p.index(v) for u, v, _ in Q2_BEFORE)]


def test_the_partial_order_is_over_the_needed_cards_and_counted_right():
    cards = {u for u, _, _ in Q2_BEFORE} | {v for _, v, _ in Q2_BEFORE}
    assert cards == set(NEEDED) and set(NEEDED) | set(Q2_DISTRACTORS) == set(Q2_CARDS)
    assert q2_orders_count() == len(_extensions_brute_force()) > 1


def test_every_order_consistent_with_the_dependencies_passes_and_no_other():
    good = _extensions_brute_force()
    assert all(check_q2_order(list(p)).passed for p in good)
    rng = random.Random(0)
    bad = [p for p in (tuple(rng.sample(NEEDED, len(NEEDED))) for _ in range(300)) if p not in set(good)]
    assert len(bad) > 200
    for p in bad:
        fb = check_q2_order(list(p))
        assert not fb.passed and "must come before" in _text(fb), (p, fb)


def test_reference_and_lesson_09s_model_answer_order_pass():
    assert check_q2_order(sol.q2_order).passed
    cells = nbformat.read(ROOT / "notebooks" / "09_interview_drills.ipynb", as_version=4).cells
    answer = next(c.source for c in cells if "Model answer to question 2" in c.source)
    heads = re.findall(r"^- \*\*(.+?)\*\*", answer, re.M)  # its bullets, in order
    ids = {"Which contamination": "which", "Not the loss curve": "loss_curve", "Cheapest first": "by_place",
           "Reconstruct the training-time": "call", "Rebuild the packs": "packs", "Reproduce a batch": "probe",
           "Evidence from the weights": "weights", "Statistics": "paired_ci", "Decide": "decide",
           "Audit the labels": "labels"}
    order = [next(v for k, v in ids.items() if h.startswith(k)) for h in heads]
    assert "loss_curve" in Q2_DISTRACTORS and set(order) - {"loss_curve"} == set(NEEDED)
    assert check_q2_order([c for c in order if c != "loss_curve"]).passed


@pytest.mark.parametrize(("card", "words"), [
    ("corrected_probe", "every model passes a block-diagonal forward"),
    ("loss_curve", "both bugs are silent there"),
    ("packed_eval", "deployment sees one example at a time"),
    ("throughput", "nothing about whether examples saw each other"),
])
def test_each_distractor_is_rejected_with_why_it_proves_nothing(card, words):
    fb = check_q2_order([*sol.q2_order[:4], card, *sol.q2_order[4:]])
    assert not fb.passed and "proves nothing" in _text(fb) and words in _text(fb), fb
    assert "skipped" not in _text(fb) and "out of order" not in _text(fb)


def test_skipped_and_misordered_cards_are_named_with_reasons():
    fb = check_q2_order([c for c in sol.q2_order if c not in ("by_place", "paired_ci")])
    assert not fb.passed and "skipped by_place" in _text(fb) and "paired_ci (" in _text(fb)
    swapped = ["which", "by_place", "call", "probe", "packs", "weights", "paired_ci", "decide", "labels"]
    fb = check_q2_order(swapped)
    assert not fb.passed and "packs must come before probe" in _text(fb) and "rebuilt packs" in _text(fb)
    fb = check_q2_order(["weights", *[c for c in sol.q2_order if c != "weights"]])  # weights first: 3 edges broken
    assert all(f"{u} must come before weights" in _text(fb) for u in ("by_place", "probe"))


def test_bad_inputs():
    assert "a set has no order" in _text(check_q2_order(set(sol.q2_order)))
    assert "not among the cards" in _text(check_q2_order([*sol.q2_order, "vibes"]))
    assert "more than once" in _text(check_q2_order([*sol.q2_order, "which"]))
    assert check_q2_order(...).attempted is False
    assert check_q2_order([c.upper() for c in sol.q2_order]).passed  # case does not matter


def test_scenario_numbers_come_from_the_committed_runs():
    from packsim.core.paths import repo_path
    from packsim.experiment.committed_models import committed_metadata
    from packsim.experiment.results import Results

    tasks = Results.load(repo_path("results/tasks-full"))
    text = q2_scenario()
    assert f"scores {committed_metadata('buggy')['isolated_exact_match']:.1%} exact match" in text
    assert f"score {tasks.summary('isolated_exact_match')['padded']['mean']:.1%} (mean over 3 seeds)" in text
    assert f"{tasks.config['train']['steps']} steps" in text


# ----------------------------------------------------------------------------- the cheapest evidence


def test_loss_by_place_is_by_position_under_the_causal_pack_and_flat_when_isolated():
    from packsim.core.data import make_dataset
    from packsim.experiment.committed_models import load_committed_model
    from packsim.experiment.forensics import by_position

    suspect_log = loss_by_place("buggy", "buggy", n_examples=64)
    assert suspect_log == by_position(load_committed_model("buggy"), make_dataset(64, 0, seed=0)[0], capacity=256)
    # place 1: nothing came before it, equal up to fp32 round-off (the row's longer matmuls block differently:
    # 0.0 on transformers 5.24, 3.0e-09 on 5.25)
    assert abs(suspect_log[1]["gap"]) <= 1e-6 and max(abs(v["gap"]) for k, v in suspect_log.items() if k > 1) > 1e-2
    run_log = loss_by_place("buggy", "buggy", n_examples=64, strategy="run")  # as the run packed them: bfd per step
    assert run_log == by_position(load_committed_model("buggy"), make_dataset(64, 0, seed=0)[0], capacity=256,
                                  strategy="bfd", examples_per_step=224)
    assert abs(run_log[1]["gap"]) <= 1e-6 and run_log != suspect_log  # another layout, the same clean first place
    for model_setup in ("buggy", "correct"):  # block-diagonal: in pack == alone for any weights
        log = loss_by_place(model_setup, "correct", n_examples=64)
        assert max(abs(v["gap"]) for v in log.values()) < 1e-4 and sum(v["n"] for v in log.values()) == 64


def test_show_solution_9_finds_answers_in_both_lesson_09_modules():
    """solution_source(9, name) looks in every lesson09_ module: lesson 09's answers and this appendix's."""
    for name in ("review", "q1_answer", "diagnosis", "followups"):
        assert solution_source(9, name) == f"{name} = {getattr(sol09, name)!r}\n"
        assert not hasattr(sol, name)  # one home: lesson 09's module
    assert "def packed_token_logps" in solution_source(9, "packed_token_logps")
