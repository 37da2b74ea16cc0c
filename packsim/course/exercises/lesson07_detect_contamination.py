"""Checks for the exercises of notebook 07_detect_contamination (solutions: packsim.course.solutions.lesson07_detect_contamination).

- :func:`check_gradient_leak`: ``gradient_leak(model, batch) -> float``, a gradient-isolation
  probe: the largest |d loss_j / d embedding| on tokens of examples other than j;
- :func:`check_name_the_fix`: ``name_the_fix = {"A": fix, ...}``, one fix from :data:`FIXES`
  for each report of :func:`mystery_reports`;
- :func:`check_isolating_call`: ``isolating_call(batch) -> (batch, forward_kwargs)``, what to
  pass so a collator's padding-free batch stays isolated in a transformers model;
- :func:`check_perturbation_leak`: ``perturbation_leak(call, input_ids, seq_ids) -> {j: float}``,
  the perturbation probe written by the learner: ``call(input_ids) -> logits (B, T, V)`` is the
  forward under test, ``input_ids`` and ``seq_ids`` are (B, T) (``seq_ids`` -1 on padding); for
  every example j, the largest |logit change| on the other examples' tokens when j's tokens change.

Oracles: a direct computation of the gradient probe on packsim's buggy / correct / single-fix
batches (block-diagonal batches must give exactly 0; |grad| per token read as the max over the
hidden dimension or as its L2 norm, both pass), the known fault behind each mystery
report, :func:`packsim.audit` itself for the forward call, and for the perturbation probe the
structure of packsim's buggy / correct batches and of one tiny Llama called two ways (all-ones
``attention_mask`` as in training, and the corrected call): isolated, nothing moves; causal, the
examples packed after j do. Each number is checked against the change the learner's OWN
perturbations caused (the check records the probe's calls): any change to valid ids passes.
The batches, models and reports the checks run on are built in ``lesson07_cases``.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping

import torch

from packsim.auditing import audit
from packsim.core.batch import PackedBatch
from packsim.core.loss import token_losses
from packsim.core.model import build_model, forward
from packsim.course.cases.lesson07_cases import collator_case as _collator_case
from packsim.course.cases.lesson07_cases import mystery_reports, probe_batch
from packsim.course.cases.lesson07_cases import packsim_case as _packsim_case
from packsim.course.cases.lesson07_cases import pipeline_call_case as _pipeline_call_case
from packsim.course.cases.lesson07_cases import read_by as _read_by
from packsim.course.exercises import Feedback, check, fail, ok

__all__ = ["FIXES", "check_gradient_leak", "check_isolating_call", "check_name_the_fix",
           "check_perturbation_leak", "mystery_reports", "probe_batch"]

FIXES = {
    "block_diagonal_mask": "attention crosses examples inside a packed batch: use a block-diagonal "
                           "mask (cu_seqlens / reset position ids)",
    "use_cache_false": "call the model with use_cache=False",
    "drop_attention_mask": "drop attention_mask from the padding-free batch",
    "mask_prompt_labels": "set the labels of prompt, padding and boundary tokens to -100",
    "nothing": "the pipeline is isolated and counts the right labels",
}
_ANSWER = {"A": "use_cache_false", "B": "mask_prompt_labels", "C": "drop_attention_mask",
           "D": "block_diagonal_mask", "E": "nothing"}


def _is_number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


# --- exercise 1: a gradient-isolation probe ---------------------------------------------------


def _oracle(model, batch: PackedBatch, reduce: str = "sum", owner_shift: int = 0) -> dict[str, float]:
    """max over j and other examples' tokens of |d loss_j / d emb| (loss_j: positions j predicts from),
    the gradient at a token read two ways: ``"max"`` over the hidden dimension, or its ``"l2"`` norm."""
    emb = model.get_input_embeddings()(batch.input_ids).detach().requires_grad_(True)  # (B, T, d)
    logits = forward(model, batch, inputs_embeds=emb)  # (B, T, V)
    losses = token_losses(logits, batch.labels)  # (B, T-1)
    owner = batch.seq_ids[:, owner_shift:owner_shift + losses.shape[1]]  # (B, T-1)
    counted = batch.labels[:, 1:] != -100
    worst = {"max": 0.0, "l2": 0.0}
    for j in range(len(batch.lengths)):
        mine = (owner == j) & counted
        if not bool(mine.any()):
            continue
        loss_j = losses[mine].sum() if reduce == "sum" else losses[mine].mean()
        (grad,) = torch.autograd.grad(loss_j, emb, retain_graph=True)  # (B, T, d)
        other = (batch.seq_ids >= 0) & (batch.seq_ids != j)  # (B, T)
        for norm, per_token in (("max", grad.abs().amax(-1)), ("l2", grad.norm(dim=-1))):  # (B, T)
            worst[norm] = max(worst[norm], float(per_token[other].max()))
    return worst


def _matches(got: float, values: dict[str, float]) -> bool:
    return any(abs(got - v) <= 1e-6 + 1e-4 * v for v in values.values())


@check("gradient-isolation probe")
def check_gradient_leak(gradient_leak) -> Feedback:
    """``gradient_leak(model, batch)`` on buggy, loss_fix, mask_fix and correct batches of one model."""
    model = build_model("tiny", seed=0)
    cases = [("correct", 0), ("buggy", 0), ("mask_fix", 1), ("loss_fix", 1)]
    for setup, seed in cases:
        batch = probe_batch(setup, seed=4 + seed)
        got = gradient_leak(model, batch)
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if not _is_number(got):
            return fail(f"gradient_leak returned {got!r} ({type(got).__name__}) on the {setup!r} batch, "
                        "not a number.", "return one float: the largest gradient found.")
        got = float(got)
        wants = _oracle(model, batch)
        want = wants["max"]
        isolated = batch.setup.mask == "block_diagonal"
        if _matches(got, wants):
            continue
        if got > 1e-6 and _matches(got, _oracle(model, batch, owner_shift=1)):
            return fail(f"on the {setup!r} batch you report {got:.4g}, expected {want:.4g}: you gave each "
                        "prediction to the example of its label, so the boundary prediction (made from "
                        "the previous example's last token) counts as the next example's loss.",
                        "the loss at position t belongs to the example of token t: owner = seq_ids[:, :-1].")
        if isolated and got > 1e-6:
            return fail(f"on the {setup!r} batch (block-diagonal mask) you report {got:.3g}, but there no "
                        "example can reach another, so the answer is exactly 0.",
                        "differentiate ONE example's loss at a time, and look only at the embeddings of the "
                        "OTHER examples (seq_ids != j, padding excluded), not the whole batch's loss.")
        if not isolated and got <= 1e-9:
            return fail(f"on the {setup!r} batch (causal mask over the pack) you report {got:.3g}: no leak "
                        "found where there is one.",
                        "run the forward with inputs_embeds=emb where emb requires grad (not under "
                        "torch.no_grad()), and take the gradient of loss_j with respect to emb.")
        if _matches(got, _oracle(model, batch, reduce="mean")):
            return fail(f"on the {setup!r} batch you report {got:.4g}, expected {want:.4g}: you averaged "
                        "example j's token losses.", "use the sum of example j's token losses.")
        return fail(f"on the {setup!r} batch you report {got:.4g}, expected {want:.4g} (or {wants['l2']:.4g} "
                    "with the L2 norm of the gradient at a token).",
                    "loss_j = sum of token_losses at positions t with seq_ids[:, t] == j; return the max over "
                    "j of |grad| (max over the hidden dimension too) on tokens of other examples.")
    return ok("exactly 0 under block-diagonal masks, and the leak found under causal ones: a probe you can "
              "run on any model that accepts inputs_embeds.")


# --- exercise 2: read a report, name the fix ---------------------------------------------------


_WHY = {
    "A": "report A fails perturbation, gradient and attention_mass with per-example position_ids in the "
         "batch; the likely cause says a cache was created",
    "B": "report B's attention probes all pass; only loss_coverage fails (prompt tokens counted)",
    "C": "report C was run with use_cache=False and still leaks; the likely cause says an "
         "attention_mask was passed",
    "D": "report D counts the right labels but attention crosses examples under setup mask='causal'",
    "E": "report E passes every probe",
}


@check("read the report, name the fix")
def check_name_the_fix(name_the_fix) -> Feedback:
    """``name_the_fix``: {letter: fix} for the five mystery reports (fixes from FIXES)."""
    if not isinstance(name_the_fix, Mapping):
        return fail(f"name_the_fix is a {type(name_the_fix).__name__}, not a dict.",
                    'write {"A": "...", "B": "...", ...} with one fix name per report.')
    name_the_fix = {str(k).strip().upper(): v.strip() if isinstance(v, str) else v
                    for k, v in name_the_fix.items()}  # " a " and "nothing " read as typed
    missing = sorted(set(_ANSWER) - set(name_the_fix))
    if missing:
        return fail(f"no answer for report(s) {missing}.", "give one fix per letter A to E.")
    unknown = {k: v for k, v in name_the_fix.items() if k in _ANSWER and v not in FIXES}
    if unknown:
        k, v = next(iter(unknown.items()))
        return fail(f"report {k}: {v!r} is not one of the fixes.", f"pick from {sorted(FIXES)}.")
    wrong = [k for k in sorted(_ANSWER) if name_the_fix[k] != _ANSWER[k]]
    if not wrong:
        return ok("every report read right: the failed probes say WHAT is wrong, the likely cause says WHY.")
    hints = {
        ("A", "block_diagonal_mask"): "the batch already carries the boundaries (position_ids restart); "
                                      "the forward threw them away.",
        ("C", "use_cache_false"): "C already passes use_cache=False: something else turned detection off.",
        ("C", "block_diagonal_mask"): "the batch carries the boundaries; something in it stops transformers "
                                      "from using them.",
        ("A", "drop_attention_mask"): "A's batch has no attention_mask at all.",
        ("B", "block_diagonal_mask"): "B's perturbation and gradient probes pass: attention is isolated.",
        ("D", "mask_prompt_labels"): "D's loss_coverage passes: the labels are fine.",
    }
    # Every wrong report explained, each with its own hint where there is one.
    why = " ".join(
        f"Report {k}: {name_the_fix[k]!r} is not the fix ({_WHY[k]})."
        + (f" {hints[k, name_the_fix[k]]}" if (k, name_the_fix[k]) in hints else "")
        for k in wrong
    )
    return fail(f"{len(wrong)} of 5 wrong. {why}",
                "read the FAIL rows and the 'likely cause' lines of each report named.")


# --- exercise 3: the forward call that isolates ------------------------------------------------


@check("a forward call that keeps examples apart")
def check_isolating_call(isolating_call) -> Feedback:
    """``isolating_call(batch) -> (batch, kwargs)`` must make ``packsim.audit`` pass on eager and sdpa."""
    for impl in ("eager", "sdpa"):
        model, batch, mask = _collator_case(impl)
        original = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
        answer = isolating_call(dict(batch))
        if not (isinstance(answer, (tuple, list)) and len(answer) == 2 and isinstance(answer[0], Mapping)
                and isinstance(answer[1], Mapping)):
            return fail(f"isolating_call returned {type(answer).__name__}, not (batch dict, kwargs dict).",
                        "return two dicts: the fields to pass and the extra forward kwargs.")
        new, kwargs = dict(answer[0]), dict(answer[1])
        for key in ("input_ids", "labels"):
            if key not in new or not torch.equal(torch.as_tensor(new[key]), original[key]):
                return fail(f"the returned batch changed or dropped {key!r}.",
                            "keep the tokens and the labels as the collator made them.")
        if new.get("attention_mask") is not None:
            return fail("the batch you pass still has an attention_mask: transformers finds packed examples "
                        "from position_ids only when attention_mask is None (even all ones turns it off).",
                        "drop the 'attention_mask' key.")
        if new.get("position_ids") is None:
            return fail("you dropped position_ids: without them eager / sdpa see one long sequence.",
                        "keep position_ids; they carry the example boundaries.")
        if "attention_mask" in kwargs and kwargs["attention_mask"] is not None:
            return fail("your kwargs pass an attention_mask.", "pass none at all.")
        if kwargs.get("use_cache", True) is not False:
            return fail(f"with {impl} and model.config.use_cache=True, your call still makes a cache "
                        f"(kwargs {kwargs}), and transformers skips packed-sequence detection when a "
                        "cache is in play.", "add use_cache=False to the kwargs.")
        report = audit(model, {k: v for k, v in new.items() if v is not None}, mask, **kwargs)
        if not report.ok:
            return fail(f"with {impl}, packsim.audit still fails: {report.verdict}",
                        "read the likely cause in the verdict.")
    return ok("no attention_mask, position_ids kept, use_cache=False: the audit passes on eager and sdpa.")


# --- exercise 4: the perturbation probe, written by the learner --------------------------------
# Any change of j's tokens to valid ids is right (+1, +7, a permutation...): the check judges the
# verdict per example and each number against the learner's OWN perturbations (_Recorder).

_ROUND_OFF = 1e-5  # every isolated case here reads exactly 0 (any perturbation): round-off is the margin


class _BadCall(Exception):
    """The probe called the forward with ids it must not use; the message says which."""


class _Recorder:
    """``call`` as the probe sees it: rejects bad ids, keeps the logits of each perturbed call."""

    def __init__(self, call, input_ids: torch.Tensor, seq_ids: torch.Tensor, vocab: int):
        self.call, self.input_ids, self.seq_ids, self.vocab = call, input_ids, seq_ids, vocab
        self.perturbed: dict[int, list[torch.Tensor]] = {}  # j -> logits (B, T, V) of each call changing j

    def __call__(self, ids):
        if not isinstance(ids, torch.Tensor) or ids.shape != self.input_ids.shape:
            raise _BadCall(f"your probe called the forward with {type(ids).__name__} "
                           f"{tuple(getattr(ids, 'shape', ()))}, not the (B, T) = "
                           f"{tuple(self.input_ids.shape)} ids.")
        if ids.dtype.is_floating_point or bool(((ids < 0) | (ids >= self.vocab)).any()):
            raise _BadCall(f"your probe called the forward with ids out of range ({ids.dtype}, "
                           f"{ids.min().item()} .. {ids.max().item()}): valid ids are the integers "
                           f"0 .. {self.vocab - 1}.")
        owners = set(self.seq_ids[ids != self.input_ids].tolist())  # whose tokens this call changed
        if -1 in owners or len(owners) > 1:
            whose = ", ".join(["padding"] * (-1 in owners) + [f"example {k}" for k in sorted(owners - {-1})])
            raise _BadCall(f"one call of your probe changed the tokens of {whose}: a probe of example j "
                           "changes j's tokens only (if you changed input_ids in place, the changes add up).")
        logits = self.call(ids)  # (B, T, V)
        if owners:
            self.perturbed.setdefault(owners.pop(), []).append(logits.detach().clone())
        return logits


def _measured(rec: _Recorder, before: torch.Tensor, j: int, where: str = "others") -> float:
    """max |logit change| over the learner's own perturbations of j, on the tokens ``where``."""
    mine, real = rec.seq_ids == j, rec.seq_ids >= 0  # (B, T)
    look = {"others": real & ~mine, "own": mine, "all": real, "padding_too": ~mine}[where]
    diffs = [(after - before).abs().amax(-1)[look] for after in rec.perturbed[j]]  # each (n,)
    return max((float(d.max()) for d in diffs if d.numel()), default=0.0)


def _near(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-5 + 1e-3 * abs(b)


def _judge(name: str, got: dict, rec: _Recorder, before: torch.Tensor, isolated: bool) -> Feedback | None:
    """None if every example's verdict and number are right on this case, else what is wrong."""
    if not rec.perturbed:
        return fail(f"on the {name} your probe never called the forward with changed tokens: it changed "
                    "nothing, so it cannot see a leak.",
                    "for each j, ids = input_ids.clone(); replace ids[seq_ids == j] by OTHER valid ids, e.g. "
                    "(ids + 7) % vocab_size (vocab_size is logits.shape[-1]); then call(ids).")
    read_by = {j: [] for j in got} if isolated else _read_by(rec.seq_ids)
    for j in sorted(got):
        if j not in rec.perturbed:
            return fail(f"on the {name} you report {got[j]:.3g} for example {j}, but no call of your probe "
                        f"changed example {j}'s tokens.", "perturb every example j in turn: seq_ids == j.")
        want = _measured(rec, before, j)
        if got[j] < 0:
            return fail(f"on the {name}, example {j}: you report {got[j]:.3g}, a negative change.",
                        "take the absolute value: (after - before).abs(), then the max.")
        if read_by[j] and got[j] <= _ROUND_OFF:
            every = "every value is 0" if max(got.values()) <= _ROUND_OFF else f"example {j} is {got[j]:.3g}"
            return fail(f"on the {name} (which leaks) {every}: examples {read_by[j]} come after example {j} "
                        "in its row and read its tokens; your own perturbation moved their logits by "
                        f"{want:.3g}.",
                        "measure |after - before| on the tokens of the OTHER examples (seq_ids >= 0, != j), "
                        "before = call(input_ids) with nothing changed.")
        if _near(got[j], want):
            continue
        if any(_near(got[j], _measured(rec, before, j, where)) for where in ("own", "all")):
            return fail(f"on the {name}, example {j}: you report {got[j]:.3g}, how much example {j}'s OWN "
                        "logits moved (they always do when its tokens change); a leak is a change in the "
                        "others'.", "measure only tokens of OTHER examples: seq_ids != j (and seq_ids >= 0).")
        if _near(got[j], _measured(rec, before, j, "padding_too")):
            return fail(f"on the {name} you measured padding positions too (seq_ids == -1).",
                        "padding belongs to no example: look only where seq_ids >= 0.")
        if not read_by[j] and got[j] > _ROUND_OFF:
            return fail(f"on the {name} nothing reads example {j} (your own perturbation moved the other "
                        f"examples' logits by exactly {want:.3g} at the same positions), yet you report "
                        f"{got[j]:.3g}: you compared logits of different positions or of different calls.",
                        "change = (call(ids) - before).abs() with before = call(input_ids): the same [b, t] "
                        "entries, the unchanged ids as the baseline.")
        return fail(f"on the {name}, example {j}: you report {got[j]:.4g}, but your own perturbation moved "
                    f"the other examples' logits by at most {want:.4g}.",
                    "for each j: logits before, change j's tokens only, logits after; the max over the other "
                    "examples' tokens (seq_ids >= 0, != j) of max over the vocabulary of |after - before|.")
    return None


@check("the perturbation probe")
def check_perturbation_leak(perturbation_leak) -> Feedback:
    """``perturbation_leak(call, input_ids, seq_ids)`` on packsim batches, then on one model called two ways."""
    cases = [("packsim 'correct' batch", _packsim_case("correct"), True),
             ("packsim 'buggy' batch", _packsim_case("buggy"), False),
             ("tiny Llama, corrected call (no attention_mask)", _pipeline_call_case(False), True),
             ("tiny Llama, training-time call (all-ones attention_mask)", _pipeline_call_case(True), False)]
    found = {}
    for name, (call, input_ids, seq_ids), isolated in cases:
        with torch.no_grad():
            before = call(input_ids)  # (B, T, V)
        rec = _Recorder(call, input_ids, seq_ids, vocab=before.shape[-1])
        try:
            got = perturbation_leak(rec, input_ids.clone(), seq_ids.clone())
        except _BadCall as err:
            return fail(f"on the {name}: {err}", "ids = input_ids.clone() for each j, then ids[seq_ids == j] = "
                        "other valid ids, e.g. (ids[seq_ids == j] + 7) % vocab_size.")
        if not isinstance(got, Mapping):
            return fail(f"on the {name} your probe returned {type(got).__name__}, not a dict.",
                        "return {example index j: largest |logit change| on the other examples' tokens}.")
        try:
            got = {int(j): float(v) for j, v in got.items()}
        except (TypeError, ValueError):
            return fail(f"on the {name} some keys or values are not numbers: {got!r:.120}.",
                        "keys: example indices (ints); values: floats.")
        want = sorted(set(seq_ids[seq_ids >= 0].tolist()))
        if sorted(got) != want:
            return fail(f"on the {name} your dict has examples {sorted(got)}, expected {want} "
                        f"(missing {sorted(set(want) - set(got))}).",
                        "perturb EVERY example in turn: the last example of a row moves nobody even "
                        "under a causal mask, so one perturbation can miss a leak.")
        wrong = _judge(name, got, rec, before, isolated)
        if wrong is not None:
            return wrong
        found[name] = max(got.values())
    names = list(found)
    return ok(f"{found[names[0]]:.2g} where examples are isolated, {found[names[1]]:.3g} on the buggy batch. "
              f"One tiny Llama, same weights: {found[names[3]]:.3g} under the call a generic pipeline made "
              f"(all-ones attention_mask), {found[names[2]]:.2g} under the corrected call. A probe answers only "
              "for the call it runs: to judge a finished run, rebuild the call that ran in training first.")
