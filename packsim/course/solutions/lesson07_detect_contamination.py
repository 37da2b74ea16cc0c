"""Reference solutions for notebook 07_detect_contamination (checks: packsim.course.exercises.lesson07_detect_contamination)."""

from __future__ import annotations

import torch

from packsim.core.loss import token_losses
from packsim.core.model import forward


def gradient_leak(model, batch) -> float:
    """Largest |d loss_j / d emb_i| over examples j and tokens i of OTHER examples (0 when isolated).

    loss_j sums the token losses at positions whose logits belong to example j.
    """
    emb = model.get_input_embeddings()(batch.input_ids).detach().requires_grad_(True)  # (B, T, d)
    logits = forward(model, batch, inputs_embeds=emb)  # (B, T, V)
    losses = token_losses(logits, batch.labels)  # (B, T-1): position t predicts token t+1
    owner = batch.seq_ids[:, :-1]  # (B, T-1): the example whose logits make the prediction
    counted = batch.labels[:, 1:] != -100
    worst = 0.0
    for j in range(len(batch.lengths)):
        mine = (owner == j) & counted
        if not mine.any():
            continue
        (grad,) = torch.autograd.grad(losses[mine].sum(), emb, retain_graph=True)  # (B, T, d)
        others = (batch.seq_ids >= 0) & (batch.seq_ids != j)  # (B, T)
        worst = max(worst, grad.abs().amax(-1)[others].max().item())
    return worst


name_the_fix = {
    "A": "use_cache_false",
    "B": "mask_prompt_labels",
    "C": "drop_attention_mask",
    "D": "block_diagonal_mask",
    "E": "nothing",
}


def isolating_call(batch):
    """Drop attention_mask (keep position_ids) and call with use_cache=False."""
    fields = {k: v for k, v in batch.items() if k != "attention_mask"}
    return fields, {"use_cache": False}


def perturbation_leak(call, input_ids, seq_ids):
    """{j: largest |logit change| on tokens of other examples when example j's tokens change}.

    Any change to other valid ids works (+1 here, +7 in probe 1, a random permutation): the
    verdict (0 or not) does not depend on it, only the size of a leak does.
    """
    with torch.no_grad():
        before = call(input_ids)  # (B, T, V)
        leak = {}
        for j in sorted(set(seq_ids[seq_ids >= 0].tolist())):
            mine = seq_ids == j  # (B, T)
            ids = input_ids.clone()
            ids[mine] = (ids[mine] + 1) % before.shape[-1]  # other tokens, same places
            change = (call(ids) - before).abs().amax(-1)  # (B, T)
            others = (seq_ids >= 0) & ~mine
            leak[j] = change[others].max().item() if others.any() else 0.0
    return leak
