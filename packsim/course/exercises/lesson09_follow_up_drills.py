"""Checks for the exercises of appendix A8_follow_up_drills (lesson 09's follow-ups; solutions:
packsim.course.solutions.lesson09_follow_up_drills).

- :func:`check_packed_token_logps`: ``packed_token_logps(logits, input_ids, cu_seqlens,
  completion_mask) -> list`` from ONE packed row: logits (T, V) fp32 (block-diagonal attention),
  input_ids (T,), cu_seqlens (S+1,) int32, completion_mask (T,) bool; returns S 1-D tensors, example
  s's ``log p(token t | its example's tokens before t)`` for each completion token t after its first
  token, in order: what DPO sums and GRPO uses per token. The oracle runs each example alone
  (:func:`~packsim.course.cases.lesson09_logp_cases.packed_logp_cases`, the rows and their ground
  truth, apart from the check); the named slips are each compared with their own computation or
  found from the answer's structure (lengths, one number per example) or by adding a constant to
  every logit of a position (a softmax over the vocabulary ignores it).
- :func:`check_q2_order`: ``q2_order``, the ids of :data:`Q2_CARDS` in the order a practitioner
  gathers them for :func:`q2_scenario` (interview question 2, lesson 09's model answer). Every order
  consistent with :data:`Q2_BEFORE` (a partial order, each edge with its reason) passes; the
  distractors of :data:`Q2_DISTRACTORS` are rejected with why they prove nothing.
- :func:`loss_by_place`: the cheapest evidence, live: a committed model's per-example response loss
  by place in the row, scored under a setup's forward and alone (``by_position``'s numbers), in
  data order or as the run packed them (``strategy="run"``).

Lessons: A8.
"""

from __future__ import annotations

import functools
import itertools

import torch

from packsim.auditing.logprobs import LOGPROB_TOL
from packsim.course.cases.lesson09_logp_cases import LogpCase, packed_logp_cases, row_logp
from packsim.course.exercises import Feedback, check, fail, ok

# appendix A8 repeats lesson 09's diagnosis drills on new symptoms: their cards and checks, from one import
from packsim.course.exercises.lesson09_interview_drills import (
    CAUSES,
    FOLLOWUPS,
    SYMPTOMS,
    check_diagnosis,
    check_followups,
)

__all__ = ["LogpCase", "packed_logp_cases", "check_packed_token_logps", "Q2_CARDS", "Q2_BEFORE",
           "Q2_DISTRACTORS", "q2_scenario", "q2_orders_count", "check_q2_order", "loss_by_place",
           "CAUSES", "FOLLOWUPS", "SYMPTOMS", "check_diagnosis", "check_followups"]

# ----------------------------------------------------------------------------- packed log-probs

TOL = LOGPROB_TOL[torch.float32]  # per token, fp32: the audit's own tolerance for packed vs alone


def _spans(case: LogpCase):
    return list(itertools.pairwise(case.cu_seqlens.tolist()))


def _slips(case: LogpCase) -> list[tuple[str, list]]:
    """The specific wrong computations, each as a full answer, with the mistake's name."""
    m, spans = case.completion_mask, _spans(case)
    own = row_logp(case.logits, case.input_ids, shift=False)
    truth = list(case.alone)
    return [
        ("no shift: you scored token t with the logit at t, which predicts token t + 1; token t's "
         "log-prob is log_softmax(logits[t - 1])[input_ids[t]]", [own[a:b][m[a:b]] for a, b in spans]),
        ("these are losses, -log p (cross_entropy's sign): DPO and GRPO take log p itself", [-x for x in truth]),
        ("these are probabilities: take log_softmax, not softmax", [x.exp() for x in truth]),
    ]


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return got.shape == want.shape and bool(((got.double() - want).abs() <= TOL).all())


def _structure(got, case: LogpCase) -> str | None:
    S = len(case.alone)
    if isinstance(got, torch.Tensor):
        return (f"on {case.name}: you returned one tensor of shape {tuple(got.shape)}; return a list of "
                f"S = {S} tensors, one per example (examples differ in length).")
    if not isinstance(got, (list, tuple)):
        return f"on {case.name}: you returned a {type(got).__name__}; return a list of {S} tensors."
    if len(got) != S:
        return (f"on {case.name}: {len(got)} tensors for S = {S} examples (cu_seqlens has S + 1 = "
                f"{S + 1} entries: a 0, then where each example ends).")
    bad = [s for s, t in enumerate(got) if not isinstance(t, torch.Tensor)]
    if bad:
        return f"on {case.name}: entry {bad[0]} is a {type(got[bad[0]]).__name__}, not a tensor."
    if all(t.numel() == 1 for t in got):
        sums = [float(x.sum()) for x in case.alone]
        same = all(abs(float(t.reshape(-1)[0]) - s) <= TOL * len(x) for t, s, x in zip(got, sums, case.alone, strict=True))
        return (f"on {case.name}: one number per example"
                + (", the per-sequence sums: DPO's quantity, but GRPO's ratio and KL are per token, and "
                   "changes of opposite sign cancel in a sum. Return the per-token values (DPO sums them)."
                   if same else f"; expected {[len(x) for x in case.alone]} values, one per completion token."))
    flat = [s for s, t in enumerate(got) if t.dim() != 1]
    if flat:
        return f"on {case.name}: example {flat[0]}'s tensor has shape {tuple(got[flat[0]].shape)}; make it 1-D."
    return None


def _lengths(got: list, case: LogpCase) -> str | None:
    """Names a count that is off: prompt tokens kept, or an example's first token scored."""
    m, spans, shifted = case.completion_mask, _spans(case), row_logp(case.logits, case.input_ids)
    for s, ((a, _), t, want) in enumerate(zip(spans, got, case.alone, strict=True)):  # a first token scored across a boundary
        if a > 0 and bool(m[a]) and len(t) == len(want) + 1 and abs(float(t[0]) - float(shifted[a])) <= TOL:
            return (f"on {case.name}: example {s}'s first token (row position {a}), which the mask marks, got "
                    f"{float(t[0]):.4f}: log_softmax(logits[{a - 1}])[input_ids[{a}]], the last logit of example "
                    f"{s - 1}, across the boundary. Nothing inside example {s} predicts its first token: drop "
                    "each example's first token, marked or not.")
    for s, ((a, b), t, want) in enumerate(zip(spans, got, case.alone, strict=True)):
        n = len(t)
        if n == len(want):
            continue
        if n in (b - a - 1, b - a) and n > len(want) and not bool(m[a:b].all()):
            tail = shifted[a + 1:b]
            exact = " (your values are those of every token)" if _close(t[-len(tail):], tail) else ""
            return (f"on {case.name}: example {s} has {n} values for its {b - a} tokens, but completion_mask "
                    f"marks {int(m[a + 1:b].sum())} after its first token: the prompt tokens are in{exact}. "
                    "Keep only the tokens the mask marks.")
        if n == len(want) + 1 and bool(m[a]):
            return (f"on {case.name}: example {s} has {n} values, one too many: its first token (row position {a}), "
                    f"which the mask marks, has no log-prob: nothing inside example {s} predicts it. "
                    "Drop each example's first token, marked or not.")
        if n == len(want) - 1 and _close(t, want[1:]):
            return (f"on {case.name}: example {s} lacks its first completion token, the one the last prompt token's "
                    "logit predicts: the mask is one place off (logp[t] scores token t + 1, so select it with "
                    "mask[1:], not mask[:-1]).")
        return f"on {case.name}: example {s} has {n} values; expected {len(want)} (its marked tokens after the first)."
    return None


def _values(fn, got: list, case: LogpCase) -> str | None:
    if all(_close(t, w) for t, w in zip(got, case.alone, strict=True)):
        return None
    offsets = torch.linspace(-3, 3, len(case.input_ids))[:, None]  # (T, 1): one constant per position
    moved = fn(case.logits + offsets, case.input_ids.clone(), case.cu_seqlens.clone(), case.completion_mask.clone())
    if isinstance(moved, (list, tuple)) and len(moved) == len(got) and not all(
            isinstance(x, torch.Tensor) and x.shape == t.shape and bool(((x.double() - t.double()).abs() <= TOL).all())
            for x, t in zip(moved, got, strict=True)):
        return (f"on {case.name}: your values change when a constant is added to all {case.logits.shape[1]} logits "
                "of a position, which a softmax over the vocabulary ignores: you normalised over the wrong dim "
                "(the tokens, dim 0) or not at all. Use log_softmax(logits, dim=-1).")
    for name, slip in _slips(case):
        if all(_close(t, w) for t, w in zip(got, slip, strict=True)):
            return f"on {case.name}: {name}."
    s = next(i for i, (t, w) in enumerate(zip(got, case.alone, strict=True)) if not _close(t, w))
    err = (got[s].double() - case.alone[s]).abs()
    k = int(err.argmax())
    return (f"on {case.name}: example {s}, its completion value {k}: you gave {float(got[s][k]):.5f}, the example "
            f"run alone gives {float(case.alone[s][k]):.5f} (error {float(err[k]):.1e}, tolerance {TOL:.0e}).")


@check("packed log-probs per token")
def check_packed_token_logps(packed_token_logps) -> Feedback:
    """``packed_token_logps(logits, input_ids, cu_seqlens, completion_mask) -> list of S (n_s,) tensors``."""
    cases = packed_logp_cases()
    for case in cases:
        with torch.no_grad():
            got = packed_token_logps(case.logits.clone(), case.input_ids.clone(), case.cu_seqlens.clone(),
                                     case.completion_mask.clone())
        problem = _structure(got, case) or _lengths(got, case) or _values(packed_token_logps, got, case)
        if problem:
            return fail(problem, "per example s in [a, b) of cu_seqlens: logit t predicts token t + 1; keep the "
                                 "tokens t in (a, b) the mask marks; log_softmax over the vocabulary; no sums.")
    n = sum(len(x) for case in cases for x in case.alone)
    firsts = sum(bool(case.completion_mask[a]) for case in cases for a, _ in _spans(case))
    return ok(f"all {n} completion tokens of both rows match each example run alone within {TOL:.0e}; "
              f"the {firsts} marked first tokens got no log-prob. Sum each tensor for DPO, use it as it is for GRPO.")


# ----------------------------------------------------------------------------- question 2, in order

Q2_CARDS = {
    "labels": "Audit the labels of a reproduced batch: prompt, padding and boundary tokens -100, EOS counted.",
    "loss_curve": "Compare the training loss curves of the suspect run and the correctly packed runs.",
    "probe": "Reproduce one training batch and probe that forward under the reconstructed call: packed logits "
             "against each example alone.",
    "which": "Ask which contamination is meant: examples reading each other inside packs, or eval examples in "
             "the training data.",
    "paired_ci": "Take paired per-example differences (suspect minus control, in pack minus alone) with a "
                 "bootstrap confidence interval.",
    "corrected_probe": "Probe the trained model under a corrected block-diagonal call.",
    "packs": "Rebuild the packs (same data order, seed and packer) and list related neighbours: duplicates, "
             "split conversations, shared prompts.",
    "by_place": "Read the per-example losses the run logged, by place in the row: the first example of a row "
                "never had a neighbour.",
    "throughput": "Compare the real tokens per second with the padded run's.",
    "weights": "Score training examples in a causal pack and alone, on the suspect and on a correctly packed "
               "control from the same base.",
    "call": "Reconstruct the training-time call from the config and logs: library versions, attn_implementation, "
            "the collator and its batch keys, use_cache, rows per batch, warnings.",
    "packed_eval": "Score the held-out set in packs, the way the model was trained.",
    "decide": "Set the isolated exact-match gap against the seed spread, and check how the eval itself packs, "
              "before deciding to retrain.",
}

# (u, v, why u comes first): the partial order; every linear extension of it passes
Q2_BEFORE = (
    ("which", "by_place", "the question decides the investigation: eval data in the training set is an overlap check of its own"),
    ("which", "call", "the question decides the investigation: eval data in the training set is an overlap check of its own"),
    ("by_place", "probe", "the run's log is free, a probe costs a reproduced batch and a forward"),
    ("by_place", "weights", "the run's log is free, the weights cost a control model and hundreds of scored examples"),
    ("call", "packs", "the packer, collator and data order you rebuild come from the reconstructed config"),
    ("call", "labels", "the labels to audit are the ones the reconstructed collator builds"),
    ("call", "probe", "the probe must run the training-time call, so reconstruct it first"),
    ("packs", "probe", "the batch you probe is one of the rebuilt packs"),
    ("probe", "weights", "one forward settles whether the call isolated; the weights cost a control and many forwards"),
    ("weights", "paired_ci", "the paired differences are the weights evidence's per-example numbers"),
    ("paired_ci", "decide", "decide on the paired gap and its interval, set against the seed spread"),
)

_WHY_NEEDED = {
    "which": "without it you may answer the wrong question",
    "by_place": "it is free: the run's own log holds a clean control, the first example of each row (set beside "
                "the same examples alone: under BFD the first places hold the longest examples)",
    "call": "a leak lived in the training-time call; only it says which mask the run had",
    "packs": "the batch to probe comes from them, and related neighbours are where a leak helps and harms most",
    "probe": "it answers exactly (0 or not) whether the reconstructed call isolated",
    "weights": "the call says whether examples could see each other, only the weights whether the model learned to read them",
    "paired_ci": "two means side by side hide the pairing; an interval says whether the gap is noise",
    "decide": "a gap within the seed spread is no reason to retrain",
    "labels": "the other silent bug: a wrong label set changes the loss whatever the mask",
}


def _runs():
    from packsim.core.paths import repo_path
    from packsim.experiment.results import Results

    return Results.load(repo_path("results/tasks-full")), Results.load(repo_path("results/facts-full"))


def _means(results, key):
    return {s: v["mean"] for s, v in results.summary(key).items()}


@functools.lru_cache(maxsize=1)
def _distractors() -> dict[str, str]:
    tasks, facts = _runs()
    rep, frep, fem = _means(tasks, "reported_loss"), _means(facts, "reported_loss"), _means(facts, "isolated_exact_match")
    iso, packed, tp = _means(tasks, "isolated_exact_match"), _means(tasks, "packed_exact_match"), tasks.throughput
    return {
        "corrected_probe": "every model passes a block-diagonal forward, trained leaky or not (the cell below shows it "
                           "on the suspect): the leak lived in the run's call. Probe the reconstructed call instead (probe).",
        "loss_curve": f"both bugs are silent there. In results/tasks-full the buggy runs report {rep['buggy']:.3f} against "
                      f"{rep['correct']:.3f} because they count prompt tokens; in results/facts-full the buggy runs report "
                      f"{frep['buggy']:.3f} against the correct runs' {frep['correct']:.3f} "
                      f"({'the lower' if frep['buggy'] < frep['correct'] else 'not the lower'} loss) and score "
                      f"{fem['buggy']:.1%} against {fem['correct']:.1%} alone.",
        "packed_eval": f"deployment sees one example at a time: in packs the buggy runs score {packed['buggy']:.1%} "
                       f"against {iso['buggy']:.1%} alone (results/tasks-full, mean over seeds), a number nobody deploys.",
        "throughput": f"it says packing removed padding ({tp['buggy']['real_tokens_per_s'] / tp['padded']['real_tokens_per_s']:.1f}x "
                      "the padded run's real tokens per second here), nothing about whether examples saw each other.",
    }


Q2_DISTRACTORS = ("corrected_probe", "loss_curve", "packed_eval", "throughput")


def q2_scenario() -> str:
    """The case of exercise 4, from the committed runs (results/tasks-full and its committed models)."""
    from packsim.experiment.committed_models import COMMITTED_DIR, committed_metadata

    tasks, _ = _runs()
    cfg, padded = tasks.config, tasks.summary("isolated_exact_match")["padded"]
    train, seeds = cfg["train"], cfg["seeds"]
    return (f"A packed SFT run has finished: the {cfg['model_size']} Llama of results/tasks-full, {train['steps']} steps "
            f"of {train['examples_per_step']} examples in rows of {train['capacity']} tokens ({train['strategy']} packing). "
            f"Held out and run alone, its checkpoint (in {COMMITTED_DIR}) scores "
            f"{committed_metadata('buggy')['isolated_exact_match']:.1%} exact match; the padded runs of the same "
            f"comparison score {padded['mean']:.1%} (mean over {len(seeds)} seeds). You have the checkpoint, its config "
            "and logs (per-example losses with their place in the row), the data, a correctly packed run from the same "
            f"base and data, and {len(seeds)} seeds of every setup. Did packed examples contaminate each other?")


def q2_orders_count() -> int:
    """How many orders of the needed cards respect :data:`Q2_BEFORE` (linear extensions, by subsets)."""
    cards = list(_WHY_NEEDED)
    need = {c: {u for u, v, _ in Q2_BEFORE if v == c} for c in cards}
    ways = {frozenset(): 1}
    for _ in cards:
        nxt: dict = {}
        for done, k in ways.items():
            for c in cards:
                if c not in done and need[c] <= done:
                    nxt[done | {c}] = nxt.get(done | {c}, 0) + k
        ways = nxt
    return sum(ways.values())


@check("question 2, in order")
def check_q2_order(q2_order) -> Feedback:
    """``q2_order``: a list of ids of :data:`Q2_CARDS`, cheapest first, distractors left out."""
    if isinstance(q2_order, (set, frozenset, dict, str)) or not hasattr(q2_order, "__iter__"):
        return fail(f"q2_order should be a list of card ids, got a {type(q2_order).__name__}"
                    + (" (a set has no order)" if isinstance(q2_order, (set, frozenset)) else "") + ".",
                    'write it like ["which", "call", ...].')
    order = [str(c).strip().lower() for c in q2_order]
    unknown = [c for c in order if c not in Q2_CARDS]
    if unknown:
        return fail(f"{unknown} not among the cards.", f"choose from: {', '.join(sorted(Q2_CARDS))}.")
    twice = sorted({c for c in order if order.count(c) > 1})
    if twice:
        return fail(f"{twice} appear more than once.", "each card once.")
    parts = []
    bad = [c for c in order if c in Q2_DISTRACTORS]
    if bad:
        parts.append("Proves nothing: " + " ".join(f"{c}: {_distractors()[c]}" for c in bad))
    missed = [c for c in _WHY_NEEDED if c not in order]
    if missed:
        parts.append("You skipped " + "; ".join(f"{c} ({_WHY_NEEDED[c]})" for c in missed) + ".")
    at = {c: i for i, c in enumerate(order)}
    wrong = [(u, v, why) for u, v, why in Q2_BEFORE if u in at and v in at and at[u] > at[v]]
    if wrong:
        parts.append("Out of order: " + "; ".join(f"{u} must come before {v}: {why}" for u, v, why in wrong) + ".")
    if parts:
        return fail(" ".join(parts), "cheapest first, and nothing before what it needs: the question, the run's own "
                                     "log, the call, the packs and a probe of that call, then the weights, statistics, a decision.")
    return ok(f"a valid order ({q2_orders_count()} orders of these {len(_WHY_NEEDED)} cards respect every dependency): "
              + " -> ".join(order) + ". The cell below runs its cheapest evidence, by_place.")


# ----------------------------------------------------------------------------- the cheapest evidence, live


@torch.no_grad()
def loss_by_place(model_setup: str, scored_under: str, n_examples: int | None = None,
                  strategy: str = "sequential") -> dict[int, dict]:
    """The committed ``model_setup`` model's response loss by place in the row, under ``scored_under``'s forward.

    The run's first ``n_examples`` training examples (``make_dataset(n, 0, seed)``; default 256, 128
    in fast mode, as lesson 09's row E), scored in packs of the run's capacity and alone:
    ``{place: {"n", "alone", "packed", "gap"}}`` (place 1 = first in its row; mean nats; gap = packed -
    alone), through :func:`packsim.experiment.forensics.by_position`. ``strategy``: ``"sequential"``
    packs them in data order, in one go; ``"run"``, as the run packed them (its packer, ``bfd``, on
    each step's examples): under the run's own setup the ``packed`` column is then what a
    per-example log would hold at its last step (read alone it tests nothing: BFD puts the longest
    examples first in each row, so places hold different examples; the ``gap`` to each example
    alone does).
    """
    from packsim.core.data import make_dataset
    from packsim.experiment.committed_models import committed_metadata, load_committed_model
    from packsim.experiment.forensics import by_position
    from packsim.experiment.run_mode import fast_mode

    n_examples = n_examples or (128 if fast_mode() else 256)
    model, meta = load_committed_model(model_setup), committed_metadata(model_setup)
    sample = make_dataset(n_examples, 0, seed=meta["seed"])[0]
    if strategy == "run":
        packer = _runs()[0].config["train"]["strategy"]  # results/tasks-full, which the committed models rerun
        return by_position(model, sample, meta["capacity"], setup=scored_under, strategy=packer,
                           examples_per_step=meta["examples_per_step"])
    return by_position(model, sample, meta["capacity"], setup=scored_under, strategy=strategy)
