"""The five probes: perturbation, gradient, attention mass, loss coverage, positions.

Each takes a :class:`~packsim.auditing.pipeline.Pipeline` and returns a ProbeResult (and the
per-pair evidence: (S, S) logit change, (S, S) gradient ratio, (L, H) outside-attention share).

Lessons: none directly (they call packsim.audit, which runs the probes).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from packsim.auditing.evidence import position_restarts
from packsim.auditing.label_values import CONVENTION, completion_form, label_values, realign
from packsim.auditing.pipeline import Pipeline, logits_of, same_randomness
from packsim.auditing.report import ProbeResult
from packsim.core.attention_share import outside_share
from packsim.core.errors import PacksimError
from packsim.core.loss import IGNORE_INDEX, Role

# The roles the loss probe counts, in report order (a row's first token is never a target).
_COUNTED_ROLES = (Role.PROMPT, Role.RESPONSE, Role.EOS, Role.BOUNDARY, Role.PAD, Role.UNKNOWN)
_POS_EMB_NAMES = ("wpe", "embed_positions", "position_embeddings", "pos_emb")
_MAX_DENSE = 2**24  # attention_maps builds (L, B, H, T, T) densely: cap B*T*T (16M floats per head)


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


def _vocab_size(model) -> int:
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


def _per_example_max(values: torch.Tensor, seq: torch.Tensor, S: int) -> torch.Tensor:
    """values (B, T) -> (S,) max over each example's tokens (padding ignored)."""
    real = seq >= 0
    out = torch.zeros(S, dtype=values.dtype, device=values.device)
    return out.scatter_reduce(0, seq[real], values[real], reduce="amax", include_self=True)


def perturbation(p: Pipeline, base: torch.Tensor, chosen, tol, seed,
                 alone=None) -> tuple[ProbeResult, torch.Tensor]:
    """Every example packed vs alone (``alone``: (S,) change, (S,) first offset over tol), and the
    logit change matrix (S, S): perturb each chosen example i, max |change| of each example j."""
    S = len(p.example_ids)
    V = _vocab_size(p.model)
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
        change[i] = _per_example_max(diff, p.seq, S).cpu()
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
    summary = (f"max |change| of another example's logits when one example's tokens change "
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


def _example_loss(logits: torch.Tensor, ids: torch.Tensor, seq: torch.Tensor, j: int) -> torch.Tensor:
    """Example j's next-token loss inside itself: logits (B, T, V) of j's tokens, targets = its next tokens.

    A function of j's logits only (labels are not used: they may be the bug under audit).
    """
    inside = (seq[:, :-1] == j) & (seq[:, 1:] == j)  # (B, T-1): a next token of the same example
    if bool(inside.any()):
        return F.cross_entropy(logits[:, :-1][inside].float(), ids[:, 1:][inside], reduction="sum")
    return logits[seq == j].float().logsumexp(-1).sum()  # one-token example


def gradient(p: Pipeline, chosen, tol, seed) -> tuple[ProbeResult, torch.Tensor | None]:
    """Gradient ratio matrix (S, S): [i, j] = max |d loss_j/d emb_i| / max |d loss_j/d emb_j|."""
    S = len(p.example_ids)
    try:
        emb = p.model.get_input_embeddings()(p.input_ids).detach().requires_grad_(True)  # (B, T, d)
        with torch.enable_grad(), same_randomness(seed, emb.device):
            logits = p.run(inputs_embeds=emb).logits
            ratio = torch.full((S, S), float("nan"))
            for j in chosen:
                (g,) = torch.autograd.grad(_example_loss(logits, p.input_ids, p.seq, j), emb,
                                           retain_graph=True)
                per = _per_example_max(g.detach().abs().amax(-1).float(), p.seq, S).cpu()  # (S,)
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


# What transformers logs (``logger.warning_once``, not ``warnings.warn``, so warnings filters do
# not catch it) when asked for attention weights it cannot return: the sdpa and flash paths
# (transformers/integrations/sdpa_attention.py and flash_attention.py). This probe asks on
# purpose and reports "skipped: ... use eager" itself, so the message is dropped for its call.
_NO_WEIGHTS = {
    "transformers.integrations.sdpa_attention": "`sdpa` attention does not support `output_attentions=True`",
    "transformers.integrations.flash_attention": "Flash Attention does not support `output_attentions=True`",
}


class _DropNoWeights(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(str(record.msg).startswith(m) for m in _NO_WEIGHTS.values())


@contextmanager
def quiet_no_attention_weights():
    """Drop transformers' "does not support `output_attentions=True`" messages inside the block
    (that one message only, on its own loggers; everything else they log still shows)."""
    drop, loggers = _DropNoWeights(), [logging.getLogger(name) for name in _NO_WEIGHTS]
    for lg in loggers:
        lg.addFilter(drop)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(drop)


def _attention_probs(p: Pipeline, base: torch.Tensor, tol) -> tuple[torch.Tensor | None, str, str]:
    """Attention probabilities (L, B, H, T, T) of the pipeline's forward, or (None, why, source)."""
    if p.context["kind"] == "packed":
        from packsim.core.model import attention_maps

        B, T = p.input_ids.shape
        if B * T * T > _MAX_DENSE:
            return None, (f"rows of {T} tokens are too long for dense attention maps (B*T*T = "
                          f"{B * T * T:.1e} per head); audit a shorter batch for this probe"), ""
        try:
            return attention_maps(p.model, p.context["batch"]), "", "packsim.core.model.attention_maps"
        except Exception as err:  # noqa: BLE001 - any model that cannot run packsim's attention
            return None, f"packsim.core.model.attention_maps failed: {type(err).__name__}: {err}", ""
    impl = p.context["impl"]
    try:
        with torch.no_grad(), quiet_no_attention_weights():
            out = p.run(output_attentions=True)
    except Exception as err:  # noqa: BLE001 - report, don't crash: this probe is optional
        return None, f"output_attentions=True failed: {type(err).__name__}: {err}", ""
    att = out.attentions
    if not att or any(a is None for a in att):
        return None, (f"attn_implementation={impl!r} returns no attention probabilities "
                      "(run the model with attn_implementation='eager' to get this probe)"), ""
    if (out.logits.float() - base).abs().max() > tol:
        return None, "output_attentions=True changed the logits, so it is not the same forward", ""
    return torch.stack([a.detach().float() for a in att]), "", "output_attentions=True"


def attention_mass(p: Pipeline, base, tol) -> tuple[ProbeResult, torch.Tensor | None]:
    """Per (layer, head): the largest share of one query's attention on keys outside its example."""
    probs, why, source = _attention_probs(p, base, tol)
    if probs is None:
        return ProbeResult("attention_mass", "skipped", None, tol, why), None
    seq = p.seq.to(probs.device)  # (B, T)
    outside = outside_share(probs, seq, real_only=True)  # (L, B, H, T): padding queries 0
    per_lh = outside.amax(dim=(1, 3)).cpu()  # (L, H)
    worst = float(per_lh.max())
    L, H = per_lh.shape
    leaky = [int(layer) for layer in range(L) if per_lh[layer].max() > tol]
    flat = int(per_lh.argmax())
    where = f"worst: layer {flat // H} head {flat % H}" if worst > tol else "no layer leaks"
    summary = (f"largest share of a query's attention outside its example ({source}, {L} layers x "
               f"{H} heads; {where})")
    return ProbeResult("attention_mass", "fail" if worst > tol else "pass", worst, tol, summary,
                       {"leaking_layers": leaky, "n_layers": L}), per_lh


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


def _shift_effect(p: Pipeline) -> tuple[float | None, str]:
    """Max logit change of one example alone when its positions are shifted (a model property)."""
    model = p.model
    lengths = torch.bincount(p.seq[p.seq >= 0], minlength=len(p.example_ids))
    j = int(lengths.argmax())
    x = p.input_ids[p.seq == j][None]  # (1, L)
    L = x.shape[1]
    config = getattr(model, "config", None)
    max_pos = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    shift = p.input_ids.shape[1] if max_pos is None else min(p.input_ids.shape[1], int(max_pos) - L)
    if shift <= 0:
        return None, "no room to shift positions"
    pos = torch.arange(L, device=x.device)[None]
    try:
        with torch.no_grad():
            a = logits_of(model(input_ids=x, position_ids=pos, use_cache=False)).logits.float()
            b = logits_of(model(input_ids=x, position_ids=pos + shift, use_cache=False)).logits.float()
    except Exception as err:  # noqa: BLE001 - a model without position_ids: report why
        return None, f"{type(err).__name__}: {str(err)[:120]}"
    return float((a - b).abs().max()), f"example {p.example_ids[j]} alone, positions +{shift}"


def positions_probe(p: Pipeline, tol) -> ProbeResult:
    """Do positions restart per example, and does it matter for this model?"""
    real = p.seq >= 0
    if p.positions is None:
        reset, restart, how = False, "absent", "absent: the model counts 0..T-1 across each row"
    else:
        pos = p.positions.to(p.expected_positions.device)
        reset = bool((pos[real] == p.expected_positions[real]).all())
        restart, how = position_restarts(pos, p.seq.to(pos.device))
        how = "restart at each example" if reset else how
    kind = _position_kind(p.model)
    effect, where = _shift_effect(p)
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


