"""The probes: perturbation, gradient, loss coverage, positions (attention mass: attention_probe.py).

Each takes a :class:`~packsim.auditing.pipeline.Pipeline` and returns a ProbeResult (and the
per-pair evidence: (S, S) logit change, (S, S) gradient ratio). These are the pair probes, one
forward per perturbed example and one backward per differentiated one; the audit runs them where
the shared pass (:mod:`packsim.auditing.shared_pass`) cannot show the batch clean at once.

Lessons: none directly (they call packsim.audit, which runs the probes).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from packsim.auditing.evidence import position_restarts
from packsim.auditing.label_values import CONVENTION, completion_form, label_values, realign
from packsim.auditing.pipeline import Pipeline, logits_of, same_randomness
from packsim.auditing.report import ProbeResult
from packsim.core.errors import PacksimError
from packsim.core.loss import IGNORE_INDEX, Role

# The roles the loss probe counts, in report order (a row's first token is never a target).
_COUNTED_ROLES = (Role.PROMPT, Role.RESPONSE, Role.EOS, Role.BOUNDARY, Role.PAD, Role.UNKNOWN)
_POS_EMB_NAMES = ("wpe", "embed_positions", "position_embeddings", "pos_emb")


def probe_examples(S: int, max_examples: int, alone=None) -> list[int]:
    """Which examples the pair probes take: all, or ``max_examples`` of them.

    With the alone comparison's result ``alone`` ((S,) change, (S,) offset), the most contaminated
    examples and the ones just before them (the likely sources) come first; else spread evenly.
    """
    if S <= max_examples:
        return list(range(S))
    chosen: list[int] = []
    if alone is not None:
        change, offset = alone
        for j in torch.argsort(change, descending=True).tolist():
            if offset[j] < 0 or len(chosen) >= max_examples:
                break
            chosen += [k for k in (j - 1, j) if 0 <= k and k not in chosen][:max_examples - len(chosen)]
    if not chosen:
        chosen = [int(round(x)) for x in torch.linspace(0, S - 1, max_examples).tolist()]
    return sorted(set(chosen))


def vocab_size(model) -> int:
    try:
        return int(model.get_input_embeddings().num_embeddings)
    except AttributeError:
        size = getattr(getattr(model, "config", None), "vocab_size", None)
        if size is None:
            raise PacksimError(
                "cannot tell the model's vocabulary size (no get_input_embeddings() and no "
                "config.vocab_size): the perturbation probe needs it to draw replacement tokens."
            ) from None
        return int(size)


def per_example_max(values: torch.Tensor, seq: torch.Tensor, S: int) -> torch.Tensor:
    """values (B, T) -> (S,) max over each example's tokens (padding ignored)."""
    real = seq >= 0
    out = torch.zeros(S, dtype=values.dtype, device=values.device)
    return out.scatter_reduce(0, seq[real], values[real], reduce="amax", include_self=True)


def perturbation(p: Pipeline, base: torch.Tensor, chosen, tol, seed,
                 alone=None) -> tuple[ProbeResult, torch.Tensor]:
    """Every example packed vs alone (``alone``: (S,) change, (S,) first offset over tol), and the
    logit change matrix (S, S): perturb each chosen example i, max |change| of each example j."""
    S = len(p.example_ids)
    V = vocab_size(p.model)
    gen = torch.Generator().manual_seed(seed)
    change = torch.full((S, S), float("nan"))
    for i in chosen:
        ids = p.input_ids.clone()
        where = p.seq == i
        offset = int(torch.randint(1, V, (1,), generator=gen))
        ids[where] = (ids[where] + offset) % V
        with torch.no_grad(), same_randomness(seed, base.device):
            logits = p.run(input_ids=ids).logits.float()
        diff = (logits - base).abs().amax(-1)  # (B, T)
        change[i] = per_example_max(diff, p.seq, S).cpu()
    cross = change.clone()
    cross.fill_diagonal_(float("nan"))
    worst = float(torch.nan_to_num(cross, nan=0.0).max()) if S > 1 else 0.0
    own = torch.diagonal(change)[chosen]
    if bool((own <= tol).all()):
        return ProbeResult("perturbation", "skipped", worst, tol,
                           "the forward ran, but changing an example's tokens does not change even its own "
                           "logits: the model output does not depend on input_ids as passed",
                           {"how_to_get": "pass the batch exactly as the model's forward receives it (its logits "
                                          "did not change with input_ids: e.g. a wrapper that binds its own "
                                          "tokens or reads inputs_embeds)"}), change
    n_leaky = int((torch.nan_to_num(cross, nan=0.0) > tol).sum())
    summary = (f"max |change| of another example's logits when one example's tokens change: {worst:.3g} "
               f"({len(chosen)} of {S} perturbed; {n_leaky} leaking pairs)")
    details = {"leaking_pairs": n_leaky}
    value = worst
    if alone is not None:
        a_change, a_offset = alone
        bad = (a_offset >= 0).nonzero().flatten().tolist()
        details.update(alone=a_change.tolist(), alone_offset=a_offset.tolist(), contaminated=bad)
        value = max(worst, float(a_change.max()))
        where = ""
        if bad:
            j = max(bad, key=lambda k: float(a_change[k]))
            where = (f"; {len(bad)} contaminated, worst example {p.example_ids[j]} ({float(a_change[j]):.3g}, "
                     f"first at its token {int(a_offset[j])})")
        summary = (f"every example packed vs alone: max |logit change| {float(a_change.max()):.3g} over "
                   f"all {S} examples{where}; " + summary)
    status = "fail" if value > tol else "pass"
    return ProbeResult("perturbation", status, value, tol, summary, details), change


def example_loss(logits: torch.Tensor, ids: torch.Tensor, seq: torch.Tensor, j: int) -> torch.Tensor:
    """Example j's next-token loss inside itself: logits (B, T, V) of j's tokens, targets = its next tokens.

    A function of j's logits only (labels are not used: they may be the bug under audit).
    """
    inside = (seq[:, :-1] == j) & (seq[:, 1:] == j)  # (B, T-1): a next token of the same example
    if bool(inside.any()):
        return F.cross_entropy(logits[:, :-1][inside].float(), ids[:, 1:][inside], reduction="sum")
    return logits[seq == j].float().logsumexp(-1).sum()  # one-token example


def gradient(p: Pipeline, chosen, tol, seed, graph=None) -> tuple[ProbeResult, torch.Tensor | None]:
    """Gradient ratio matrix (S, S): [i, j] = max |d loss_j/d emb_i| / max |d loss_j/d emb_j|.

    ``graph``: the baseline's :class:`~packsim.auditing.shared_pass.Graph` (its logits with the
    autograd graph back to the input embeddings), so no forward runs here; else one forward with
    ``inputs_embeds``.
    """
    S = len(p.example_ids)
    try:
        if graph is None:
            emb = p.model.get_input_embeddings()(p.input_ids).detach().requires_grad_(True)  # (B, T, d)
        else:
            emb = graph.emb
        with torch.enable_grad(), same_randomness(seed, emb.device):
            logits = p.run(inputs_embeds=emb).logits if graph is None else graph.logits  # (B, T, V)
            ratio = torch.full((S, S), float("nan"))
            for j in chosen:
                (g,) = torch.autograd.grad(example_loss(logits, p.input_ids, p.seq, j), emb,
                                           retain_graph=True)
                per = per_example_max(g.detach().abs().amax(-1).float(), p.seq, S).cpu()  # (S,)
                ratio[:, j] = per / per[j] if per[j] > 0 else float("nan")
    except (NotImplementedError, RuntimeError, TypeError, AttributeError) as err:
        msg = str(err).splitlines()[0][:160]
        return ProbeResult("gradient", "skipped", None, tol,
                           f"no gradient through this forward here: {type(err).__name__}: {msg}"), None
    cross = ratio.clone()
    cross.fill_diagonal_(float("nan"))
    worst = float(torch.nan_to_num(cross, nan=0.0).max())
    status = "fail" if worst > tol else "pass"
    return ProbeResult("gradient", status, worst, tol,
                       "max |d loss_j / d emb_i| over i != j, relative to j's own embeddings "
                       f"({len(chosen)} examples' losses)"), ratio



def loss_coverage(p: Pipeline) -> ProbeResult:
    """Which labels are counted, by role, and whether each counted label is the right token.

    A label at token t is counted when it is not -100 (t > 0 in its row: the shift drops t = 0).
    Values (:mod:`packsim.auditing.label_values`): a collator shift, a label across a boundary or
    a wrong token is its own problem; after a shift, roles are judged on the labels shifted back.
    Without a prompt/response split (tokens of unknown role, e.g. a Trainer whose
    ``remove_unused_columns=True`` dropped the features' ``completion_mask``) and nothing wrong
    where it can judge, the probe is ``skipped`` ("not measured"), never a pass; counting every
    token inside the examples still fails (any prompt is in the loss).
    """
    if p.labels is None:
        return ProbeResult("loss_coverage", "skipped", None, 0, "the batch carries no labels")
    labels = torch.as_tensor(p.labels).reshape(p.input_ids.shape).to(p.roles.device)
    values = label_values(labels, p.input_ids.to(labels.device), p.seq.to(labels.device), p.roles)
    kinds = values["counts"]
    n_counted = sum(kinds.values())
    shifted = kinds["shifted"] + kinds["across"] > max(kinds["aligned"], 0) and kinds["shifted"] > 0
    judged = realign(labels) if shifted else labels
    counted = judged != IGNORE_INDEX  # (B, T)
    counts = {role.label: (int((counted & (p.roles == role)).sum()), int((p.roles == role).sum()))
              for role in _COUNTED_ROLES}
    problems = _value_problems(kinds, values, shifted) + _coverage_problems(counts)
    summary = "counted/total: " + ", ".join(f"{name} {c}/{n}" for name, (c, n) in counts.items() if n)
    if shifted:
        summary += " (after undoing the collator's shift)"
    summary += (f"; label values: {kinds['aligned']} of {n_counted} counted labels are their own token"
                f" ({CONVENTION})")
    if problems:
        summary += "; WRONG: " + "; ".join(text for _, _, text in problems)
    summary += " (" + "; ".join(p.role_notes) + ")"
    details = {"counts": counts, "problems": [key for key, _, _ in problems],
               "label_values": values, "convention": CONVENTION, "objective": p.objective}
    c, n = counts["unknown"]
    if n and not problems:  # labels look right where they can be judged, the split cannot be
        form = completion_form(judged, p.seq.to(judged.device))
        measured = form["text"]
        details.update(not_measured=NO_SPLIT, how_to_get=HOW_TO_SPLIT, measured=measured, form=form)
        return ProbeResult("loss_coverage", "skipped", None, 0,
                           f"not measured: {NO_SPLIT}; measured by value: {measured}, {c} of the {n} tokens "
                           "inside the examples counted; checked: " + summary, details)
    return ProbeResult("loss_coverage", "fail" if problems else "pass",
                       float(sum(n for _, n, _ in problems)), 0, summary, details)


NO_SPLIT = ("which tokens are the prompt and which the response: no prompt/response split independent of the "
            "labels reached the audit, so whether the -100 labels are exactly the prompts cannot be told")
HOW_TO_SPLIT = ("give the audit the split: packsim.audit(model, batch, response_mask=...) with a (B, T) bool, True "
                "on the response and EOS (packsim.response_mask_from_features(features) builds it from features "
                "with completion_mask or prompt_ids + response_ids); a transformers Trainer keeps those feature "
                "columns for audit_trainer with TrainingArguments(remove_unused_columns=False); TRL's SFTTrainer "
                "folds completion_mask into the labels while it prepares the dataset, so none of its batches carry "
                "the split: audit one of them with packsim.audit(..., response_mask=); for language modelling "
                "(every token a target) use objective='lm'")


def _value_problems(kinds: dict, values: dict, shifted: bool) -> list[tuple[str, int, str]]:
    """(key, number of wrong labels, text) for labels with the wrong value."""
    def at(kind):
        r, t = values["first"][kind]
        return f"row {r} token {t}"

    problems = []
    if shifted:
        problems.append(("shifted", kinds["shifted"] + kinds["across"],
                         f"{kinds['shifted'] + kinds['across']} counted labels are the NEXT token "
                         f"(labels[t] = input_ids[t+1], first at {at('shifted')}): the collator shifted "
                         "them and the loss shifts again"))
    elif kinds["across"]:
        problems.append(("across", kinds["across"],
                         f"{kinds['across']} example(s) end on a label that is the next example's first "
                         f"token (first at {at('across')})"))
    if kinds["wrong"]:
        problems.append(("wrong_token", kinds["wrong"],
                         f"{kinds['wrong']} counted labels are neither their own token nor the next "
                         f"(first at {at('wrong')})"))
    return problems


def _coverage_problems(counts: dict) -> list[tuple[str, int, str]]:
    """(role, number of wrong tokens, text) for each kind of wrong label."""
    problems = []
    for name in ("prompt", "padding", "boundary"):
        c, _ = counts[name]
        if c:
            problems.append((name, c, f"{c} {name} token(s) counted"))
    for name in ("response", "EOS"):
        c, n = counts[name]
        if n - c:
            problems.append((name, n - c, f"{n - c} {name} token(s) not counted"))
    c, n = counts["unknown"]
    if n and c == n:
        problems.append(("every", n, f"all {n} tokens inside the examples are counted (only "
                                     "boundaries are ignored), so any prompt is in the loss"))
    total = sum(n for _, n in counts.values())
    if total and not any(c for c, _ in counts.values()):
        problems.append(("no_label", total, "no label is counted: the loss is 0/0 (NaN, or a silent 0.0 "
                                            "where a trainer guards it) and the batch trains nothing"))
    return problems


def _position_kind(model) -> str:
    names = [n for n, _ in model.named_modules()]
    if any(n.endswith("rotary_emb") for n in names):
        return "RoPE"
    for n, m in model.named_modules():
        if isinstance(m, torch.nn.Embedding) and n.split(".")[-1] in _POS_EMB_NAMES:
            return "absolute"
    return "unknown"


def shift_plan(p: Pipeline, start: int = 0) -> tuple[int, int] | str:
    """(example j, shift): the longest example, and how far its positions from ``start`` can move
    inside the model's position table; else why no shift test runs."""
    lengths = torch.bincount(p.seq[p.seq >= 0], minlength=len(p.example_ids))
    j = int(lengths.argmax())
    L, T = int(lengths[j]), p.input_ids.shape[1]
    config = getattr(p.model, "config", None)
    max_pos = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    shift = T if max_pos is None else min(T, int(max_pos) - L - start)
    return (j, shift) if shift > 0 else "no room to shift positions"


def shift_where(p: Pipeline, j: int, shift: int) -> str:
    return f"example {p.example_ids[j]} alone, positions +{shift}"


def _shift_effect(p: Pipeline) -> tuple[float | None, str]:
    """Max logit change of one example alone when its positions are shifted (a model property)."""
    plan = shift_plan(p)
    if isinstance(plan, str):
        return None, plan
    j, shift = plan
    x = p.input_ids[p.seq == j][None]  # (1, L)
    L = x.shape[1]
    pos = torch.arange(L, device=x.device)[None]
    try:  # one forward, two rows of the same tokens (no padding: the rows never meet)
        with torch.no_grad():
            ab = logits_of(p.model(input_ids=x.expand(2, L), position_ids=torch.cat([pos, pos + shift]),
                                   use_cache=False)).logits.float()  # (2, L, V)
    except Exception as err:  # noqa: BLE001 - a model without position_ids: report why
        return None, f"{type(err).__name__}: {str(err)[:120]}"
    return float((ab[0] - ab[1]).abs().max()), shift_where(p, j, shift)


def positions_probe(p: Pipeline, tol, shift: tuple[float | None, str] | None = None) -> ProbeResult:
    """Do positions restart per example, and does it matter for this model?

    ``shift``: (effect, where) of the shift test when the shared pass measured it in its alone
    forward (:mod:`packsim.auditing.shared_pass`); else it runs here.
    """
    real = p.seq >= 0
    if p.positions is None:
        reset, restart, how = False, "absent", "absent: the model counts 0..T-1 across each row"
    else:
        pos = p.positions.to(p.expected_positions.device)
        reset = bool((pos[real] == p.expected_positions[real]).all())
        restart, how = position_restarts(pos, p.seq.to(pos.device))
        how = "restart at each example" if reset else how
    kind = _position_kind(p.model)
    effect, where = _shift_effect(p) if shift is None else shift
    shift_tol = max(1e-4, 10 * tol)  # RoPE is shift-invariant only up to round-off of the angles
    matters = None if effect is None else effect > shift_tol
    detail = {"reset": reset, "restart": "right" if reset else restart, "how": how, "kind": kind,
              "shift_effect": effect}
    if effect is None:
        effect_txt = f"shift test not run ({where})"
    else:
        effect_txt = (f"shifting positions changes logits by {effect:.2g} ({where}): position "
                      f"{'matters' if matters else 'does not matter'} for this {kind} model")
    summary = f"position_ids {how}; {effect_txt}"
    if reset:
        return ProbeResult("positions", "pass", effect, shift_tol, summary, detail)
    if matters is None:
        status = "fail" if kind == "absolute" else "pass" if kind == "RoPE" else "skipped"
    else:
        status = "fail" if matters else "pass"
    return ProbeResult("positions", status, effect, shift_tol, summary, detail)


