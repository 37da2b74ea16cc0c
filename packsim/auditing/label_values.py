"""Labels checked by value: every counted label must be the token it trains the model to predict.

transformers' causal LMs (``ForCausalLMLoss``) and packsim's loss shift inside the loss: the
logits at t-1 predict ``labels[t]``, so a counted ``labels[t]`` must equal ``input_ids[t]``.
:func:`label_values` classifies each counted label (a row's first token is never a target) by
value against the tokens and the examples ``seq`` (B, T):

- ``aligned``: ``labels[t] == input_ids[t]`` (right);
- ``shifted``: ``labels[t] == input_ids[t+1]`` of the same example (the collator shifted the labels
  and the model shifts again: it learns to predict two tokens ahead);
- ``across``: ``labels[t] == input_ids[t+1]`` where t+1 starts the next example (an example's last
  token labelled with the next example's first token);
- ``wrong``: neither.

Repeated tokens (``input_ids[t] == input_ids[t+1]``) count as aligned. Counts come per role.
:func:`completion_form` reads what the labels alone can say of the prompt/completion split: whether
each example is -100 on a leading run and counted on every token after it (not which run is the
prompt: that needs a split independent of the labels).

Lessons: none directly (the loss probe of packsim.audit calls it).
"""

from __future__ import annotations

import torch

from packsim.core.loss import IGNORE_INDEX, Role

__all__ = ["CONVENTION", "completion_form", "form_text", "label_values", "realign"]

CONVENTION = ("the loss shifts (transformers ForCausalLMLoss, packsim.core.loss): a counted "
              "labels[t] must equal input_ids[t]")
KINDS = ("aligned", "shifted", "across", "wrong")


def label_values(labels: torch.Tensor, ids: torch.Tensor, seq: torch.Tensor, roles: torch.Tensor) -> dict:
    """-> {"counts": {kind: n}, "by_role": {role label: {kind: n}}, "first": {kind: (row, t)}}."""
    counted = (labels != IGNORE_INDEX) & (roles != -1)  # (B, T): row starts are never targets
    aligned = labels == ids
    nxt = torch.zeros_like(aligned)
    nxt[:, :-1] = labels[:, :-1] == ids[:, 1:]
    same_next = torch.zeros_like(aligned)
    same_next[:, :-1] = (seq[:, :-1] == seq[:, 1:]) & (seq[:, 1:] >= 0)
    kinds = {
        "aligned": counted & aligned,
        "shifted": counted & ~aligned & nxt & same_next,
        "across": counted & ~aligned & nxt & ~same_next,
    }
    kinds["wrong"] = counted & ~aligned & ~nxt
    by_role = {}
    for role in Role:
        here = roles == int(role)
        if bool((counted & here).any()):
            by_role[role.label] = {k: int((m & here).sum()) for k, m in kinds.items()}
    first = {k: tuple(int(v) for v in m.nonzero()[0]) for k, m in kinds.items() if bool(m.any())}
    return {"counts": {k: int(m.sum()) for k, m in kinds.items()}, "by_role": by_role, "first": first}


def realign(labels: torch.Tensor) -> torch.Tensor:
    """Undo a collator's shift: labels[t] <- labels[t-1] (row starts become -100)."""
    out = torch.full_like(labels, IGNORE_INDEX)
    out[:, 1:] = labels[:, :-1]
    return out


def completion_form(labels: torch.Tensor, seq: torch.Tensor) -> dict:
    """Which examples of ``seq`` (B, T) have labels (B, T) of the prompt/completion form.

    The form: -100 on the example's first ``j`` tokens (its first is never a target), counted on
    every token after them to its end (the completion and its EOS), at least one counted. ->
    {"examples": examples of 2+ tokens, "form": how many have it, "lead": (shortest, longest) ``j``
    among them, or None, "text": :func:`form_text` of it}.
    """
    counted = (labels != IGNORE_INDEX).tolist()
    runs: dict[int, list[bool]] = {}
    for r, row in enumerate(seq.tolist()):
        for t, k in enumerate(row):
            if k >= 0 and t > 0 and row[t - 1] == k:  # inside example k (not its first token)
                runs.setdefault(k, []).append(counted[r][t])
    leads = []
    for flags in runs.values():
        j = flags.index(True) if True in flags else None
        if j is not None and all(flags[j:]):
            leads.append(j + 1)
    form = {"examples": len(runs), "form": len(leads), "lead": (min(leads), max(leads)) if leads else None}
    return {**form, "text": form_text(form)}


def form_text(form: dict) -> str:
    """What :func:`completion_form` found, in words."""
    S, k = form["examples"], form["form"]
    if not k:
        return f"none of the {S} examples is -100 on a leading run and counted after it"
    lo, hi = form["lead"]
    lead = f"{lo}" if lo == hi else f"{lo}..{hi}"
    return (f"{k} of {S} examples are -100 on their first {lead} tokens and counted on every token after "
            "them to their end (a prompt, then the completion and EOS, as the labels mark them)")
