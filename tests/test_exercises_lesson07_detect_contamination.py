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


def _probe(call, input_ids, seq_ids, change="+1", look="others", mine_too=False, padding_too=False,
           same_tokens=False, first_only=False, shifted=False, zeros=False, in_place=False, repeats=1):
    """The perturbation probe, right by default, with one typical mistake each when asked.

    ``change``: how j's tokens are replaced ("+1", "+7", "perm": a seeded permutation of the valid
    ids, "+7 no modulo": out of range); ``look``: whose logits are measured ("others", or "own":
    the perturbed example's own change reported as the leak); ``repeats``: perturbations per
    example, the largest change kept (also a right answer).
    """
    with torch.no_grad():
        before = call(input_ids)  # (B, T, V)
        vocab = before.shape[-1]
        perm = torch.randperm(vocab, generator=torch.Generator().manual_seed(3))
        out = {}
        examples = sorted(set(seq_ids[seq_ids >= 0].tolist()))
        for j in examples[:1] if first_only else examples:
            mine = seq_ids == j  # (B, T)
            out[j] = 0.0
            for r in range(repeats):
                ids = input_ids if in_place else input_ids.clone()
                if not same_tokens:
                    new = {"+1": (ids[mine] + 1) % vocab, "+7": (ids[mine] + 7 + r) % vocab,
                           "perm": perm[ids[mine]], "+7 no modulo": ids[mine] + 7}[change]
                    ids[mine] = new
                after = call(ids)  # (B, T, V)
                change_ = (after - (before.roll(1, dims=1) if shifted else before)).abs().amax(-1)  # (B, T)
                where = torch.ones_like(mine) if padding_too else seq_ids >= 0
                where = mine if look == "own" else (where if mine_too else where & ~mine)
                out[j] = max(out[j], change_[where].max().item())
            out[j] = 0.0 if zeros else out[j]
    return out


def test_perturbation_leak_reference_measures_the_call_it_runs():
    fb = check_perturbation_leak(sol.perturbation_leak)
    assert fb.passed, fb
    assert "A probe answers only for the call it runs" in str(fb)


@pytest.mark.parametrize("kwargs", [{"change": "+7"}, {"change": "perm"}, {"change": "+7", "repeats": 2}],
                         ids=["plus7", "permutation", "two_perturbations_each"])
def test_perturbation_leak_accepts_any_valid_perturbation(kwargs):
    """Probe 1 itself perturbs by +7; the reference by +1; a permutation of the ids is as right."""
    fb = check_perturbation_leak(lambda c, i, s: _probe(c, i, s, **kwargs))
    assert fb.passed, fb


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"look": "own"}, "OWN logits moved"),  # the perturbed example's own change reported as a leak
    ({"mine_too": True}, "OWN logits moved"),  # forgot to exclude the perturbed example
    ({"padding_too": True}, "padding positions"),
    ({"shifted": True}, "different positions"),
    ({"zeros": True}, "every value is 0"),  # all zeros on a leaking model
    ({"change": "+7 no modulo"}, "ids out of range"),
    ({"in_place": True}, "changed input_ids in place"),
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


def test_the_structure_the_check_expects_is_what_a_perturbation_measures():
    """Ground truth for the check's verdicts, computed by perturbing (+3) without the check's code:
    under a causal pack exactly the examples packed after j in its row move; isolated, none do."""
    from packsim.course.exercises.lesson07_detect_contamination import (
        _packsim_case,
        _pipeline_call_case,
        _read_by,
    )

    for (call, input_ids, seq_ids), causal in [(_packsim_case("buggy"), True), (_packsim_case("correct"), False),
                                               (_pipeline_call_case(True), True)]:
        with torch.no_grad():
            before = call(input_ids)  # (B, T, V)
            moved = {}
            for j in sorted(set(seq_ids[seq_ids >= 0].tolist())):
                ids = input_ids.clone()
                ids[seq_ids == j] = (ids[seq_ids == j] + 3) % before.shape[-1]
                change = (call(ids) - before).abs().amax(-1)  # (B, T)
                moved[j] = sorted({int(k) for k in seq_ids[change > 1e-5].tolist()} - {j, -1})
        expected = _read_by(seq_ids) if causal else {j: [] for j in moved}
        assert moved == expected
    assert _read_by(torch.tensor([[1, 1, 3, 3, -1], [2, 0, 0, 4, -1]])) == {0: [4], 1: [3], 2: [0, 4], 3: [], 4: []}


# --- other right answers pass: the verdict and the value the prompt defines, not one formula ----


def _leak_written_differently(model, batch, l2=False):
    """A right probe that shares no code with the reference: a fresh forward per example, the loss by
    F.cross_entropy(reduction="sum"), .backward(), the gradient at a token read as its L2 norm when
    ``l2`` (a vector's |.|), a 0-d tensor returned."""
    import torch.nn.functional as F

    worst = torch.tensor(0.0)
    for j in range(len(batch.lengths)):
        emb = model.get_input_embeddings()(batch.input_ids).detach().requires_grad_(True)  # (B, T, d)
        logits = forward(model, batch, inputs_embeds=emb)  # (B, T, V)
        targets = batch.labels[:, 1:]  # (B, T-1)
        mine = (batch.seq_ids[:, :-1] == j) & (targets != -100)
        if not mine.any():
            continue
        F.cross_entropy(logits[:, :-1][mine], targets[mine], reduction="sum").backward()
        per_token = emb.grad.norm(dim=-1) if l2 else emb.grad.abs().amax(-1)  # (B, T)
        other = (batch.seq_ids >= 0) & (batch.seq_ids != j)
        worst = torch.maximum(worst, per_token[other].max())
    return worst


@pytest.mark.parametrize("l2", [False, True], ids=["max_over_hidden", "l2_norm"])
def test_gradient_leak_accepts_other_right_answers(l2):
    fb = check_gradient_leak(lambda m, b: _leak_written_differently(m, b, l2=l2))
    assert fb.passed, fb


def test_name_the_fix_accepts_other_forms():
    from types import MappingProxyType

    assert check_name_the_fix(MappingProxyType(dict(sol.name_the_fix))).passed
    assert check_name_the_fix({f" {k.lower()}": f"{v} " for k, v in reversed(sol.name_the_fix.items())}).passed


@pytest.mark.parametrize("answer", [
    lambda b: ({**b, "attention_mask": None}, {"use_cache": False}),  # the key kept, set to None
    lambda b: ({k: b[k] for k in ("input_ids", "labels", "position_ids")}, {"use_cache": False}),  # minimal
    lambda b: [{k: v for k, v in b.items() if k != "attention_mask"}, {"use_cache": False, "attention_mask": None}],
], ids=["mask_none", "minimal_fields", "a_list_of_two_dicts"])
def test_isolating_call_accepts_other_right_answers(answer):
    fb = check_isolating_call(answer)
    assert fb.passed, fb
