"""Checks of notebook 07_detect_contamination: the reference solutions pass, typical mistakes fail by name."""

from __future__ import annotations

import pytest
import torch

from packsim.core.loss import token_losses
from packsim.core.model import build_model, forward
from packsim.course.exercises import show_solution, solution_source
from packsim.course.exercises.lesson07_detect_contamination import (
    FIXES,
    check_gradient_leak,
    check_isolating_call,
    check_name_the_fix,
    check_perturbation_leak,
    mystery_reports,
    probe_batch,
)
from packsim.course.solutions import lesson07_detect_contamination as sol


def test_gradient_leak_is_zero_when_isolated_and_positive_when_not():
    model = build_model("tiny", seed=0)
    assert sol.gradient_leak(model, probe_batch("correct")) == 0.0
    assert sol.gradient_leak(model, probe_batch("buggy")) > 1e-4


def _leak(model, batch, whole_batch=False, mean=False, label_owner=False, no_grad=False):
    """Variants of the probe with one typical mistake each."""
    emb = model.get_input_embeddings()(batch.input_ids).detach().requires_grad_(not no_grad)
    if no_grad:
        return 0.0
    losses = token_losses(forward(model, batch, inputs_embeds=emb), batch.labels)
    owner = batch.seq_ids[:, 1:] if label_owner else batch.seq_ids[:, :-1]
    counted = batch.labels[:, 1:] != -100
    worst = 0.0
    for j in range(len(batch.lengths)):
        mine = (owner == j) & counted
        if not mine.any():
            continue
        loss = losses[counted].sum() if whole_batch else (losses[mine].mean() if mean else losses[mine].sum())
        (g,) = torch.autograd.grad(loss, emb, retain_graph=True)
        other = (batch.seq_ids >= 0) & (batch.seq_ids != j)
        worst = max(worst, g.abs().amax(-1)[other].max().item())
    return worst


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"whole_batch": True}, "ONE example's loss"),
    ({"mean": True}, "averaged"),
    ({"no_grad": True}, "no leak found"),
    ({"label_owner": True}, "example of its label"),
])
def test_gradient_leak_mistakes_are_named(kwargs, words):
    fb = check_gradient_leak(lambda m, b: _leak(m, b, **kwargs))
    assert not fb.passed and fb.attempted
    assert words in str(fb), fb


def test_gradient_leak_non_number():
    fb = check_gradient_leak(lambda m, b: [0.0])
    assert not fb.passed and "not a number" in str(fb)


def test_mystery_reports_have_one_fault_each():
    reports = mystery_reports()
    assert set(reports["A"].failed) == {"perturbation", "gradient", "attention_mass"}
    assert "a cache was created" in reports["A"].causes[0]
    assert reports["B"].failed == ["loss_coverage"]
    assert "attention_mask was passed" in reports["C"].causes[0]
    assert set(reports["D"].failed) == {"perturbation", "gradient", "attention_mass"}
    assert reports["E"].ok


@pytest.mark.parametrize(("change", "words"), [
    ({"A": "block_diagonal_mask"}, "threw them away"),
    ({"C": "use_cache_false"}, "already passes use_cache=False"),
    ({"B": "block_diagonal_mask"}, "attention is isolated"),
    ({"E": "use_cache_false"}, "passes every probe"),
    ({"D": "fix the mask"}, "not one of the fixes"),
])
def test_name_the_fix_mistakes_are_named(change, words):
    fb = check_name_the_fix({**sol.name_the_fix, **change})
    assert not fb.passed and fb.attempted
    assert words in str(fb), fb


def test_name_the_fix_needs_every_letter():
    fb = check_name_the_fix({"A": "use_cache_false"})
    assert not fb.passed and "no answer" in str(fb)
    assert set(sol.name_the_fix.values()) <= set(FIXES)


@pytest.mark.parametrize(("answer", "words"), [
    (lambda b: (b, {"use_cache": False}), "still has an attention_mask"),
    (lambda b: ({k: v for k, v in b.items() if k != "attention_mask"}, {}), "use_cache=False"),
    (lambda b: ({k: v for k, v in b.items() if k not in ("attention_mask", "position_ids")}, {"use_cache": False}),
     "dropped position_ids"),
    (lambda b: ({k: v for k, v in b.items() if k not in ("attention_mask", "labels")}, {"use_cache": False}),
     "'labels'"),
    (lambda b: {"use_cache": False}, "not (batch dict, kwargs dict)"),
])
def test_isolating_call_mistakes_are_named(answer, words):
    fb = check_isolating_call(answer)
    assert not fb.passed and fb.attempted
    assert words in str(fb), fb


def test_solutions_can_be_shown(capsys):
    show_solution(7, "isolating_call")
    assert "use_cache" in capsys.readouterr().out
    assert "name_the_fix = {" in solution_source(7, "name_the_fix")


def _probe(call, input_ids, seq_ids, mine_too=False, padding_too=False, same_tokens=False, first_only=False):
    """Variants of the perturbation probe with one typical mistake each."""
    with torch.no_grad():
        before = call(input_ids)
        out = {}
        examples = sorted(set(seq_ids[seq_ids >= 0].tolist()))
        for j in examples[:1] if first_only else examples:
            mine = seq_ids == j
            ids = input_ids.clone()
            if not same_tokens:
                ids[mine] = (ids[mine] + 1) % before.shape[-1]
            change = (call(ids) - before).abs().amax(-1)
            look = torch.ones_like(mine) if padding_too else seq_ids >= 0
            if not mine_too:
                look = look & ~mine
            out[j] = change[look].max().item()
    return out


def test_perturbation_leak_reference_measures_the_call_it_runs():
    fb = check_perturbation_leak(sol.perturbation_leak)
    assert fb.passed, fb
    assert "A probe answers only for the call it runs" in str(fb)


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"mine_too": True}, "perturbed example's own logits"),
    ({"padding_too": True}, "padding positions"),
    ({"same_tokens": True}, "changed nothing"),
    ({"first_only": True}, "perturb EVERY example"),
])
def test_perturbation_leak_mistakes_are_named(kwargs, words):
    fb = check_perturbation_leak(lambda c, i, s: _probe(c, i, s, **kwargs))
    assert not fb.passed and fb.attempted
    assert words in str(fb), fb


def test_perturbation_leak_non_dict():
    fb = check_perturbation_leak(lambda c, i, s: 0.0)
    assert not fb.passed and "not a dict" in str(fb)
