"""Loss checks one batch's probes cannot make: a batch that counts no label, and the weight of each
token when losses are accumulated over micro-batches (gradient accumulation).

- :func:`check_counted_labels`: labels (B, T) with no label counted -> the loss is 0/0;
- :func:`token_weights`: logits (1, N_k, V) per micro-batch through the pipeline's
  ``accumulate(logits_list, labels_list)``; the weight of each counted token, read exactly from the
  gradient; :func:`check_loss_normalisation` (finding ``equal_token_weights``) wants each to be
  1/N (N = the step's count): equal, and divided by that count;
- :func:`mean_of_means` (the reduction before transformers' fix) and :func:`global_token_mean`
  (``num_items_in_batch``): transformers' own ``ForCausalLMLoss`` sums, weighed by
  :func:`packsim.core.loss.accumulated_loss`.

Each check returns a :class:`~packsim.auditing.report.Finding`, so it can join an
:class:`~packsim.auditing.report.AuditReport` (``report.findings``). The museum
(:mod:`packsim.exhibits.museum`) uses them for the bugs the audit's probes cannot see; lesson 07
can call them on a user's own pipeline.

Lessons: none directly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from packsim.auditing.report import Finding
from packsim.core.loss import IGNORE_INDEX, accumulated_loss, count_targets

__all__ = ["check_counted_labels", "check_loss_normalisation", "global_token_mean", "mean_of_means",
           "token_weights"]


def check_counted_labels(batch: dict) -> Finding:
    """Fail when no label of the batch is counted (t >= 1 in a row, != -100): the loss is 0/0."""
    counted = count_targets(torch.as_tensor(batch["labels"]))
    if counted:
        return Finding("counted_labels", "pass", f"{counted} labels counted")
    return Finding("counted_labels", "fail",
                   "no label is counted: the loss is 0/0, NaN in plain cross-entropy or a silent 0.0 "
                   "where a trainer guards it",
                   "keep at least one response token per example (raise max_length, drop "
                   "prompt-only examples), and warn when a batch counts no label.")


def token_weights(model, micro_batches: list[dict], accumulate: Callable) -> list[torch.Tensor]:
    """Weight of each counted token (one (n_k,) tensor per micro-batch) in the accumulated loss.

    ``accumulate(logits_list, labels_list)`` is the pipeline's loss over the step's micro-batches.
    For cross-entropy d loss / d logits_t = w_t (softmax_t - onehot_t), so w_t = g_t . (p_t - e_t) /
    |p_t - e_t|^2 exactly.
    """
    with torch.no_grad():
        logits = [model(**{k: v for k, v in b.items() if k != "labels"}, use_cache=False).logits
                  for b in micro_batches]
    leaves = [x.detach().float().requires_grad_(True) for x in logits]  # (1, N_k, V) each
    labels = [b["labels"] for b in micro_batches]
    accumulate(leaves, labels).backward()
    weights = []
    for x, y in zip(leaves, labels, strict=True):
        target = y[0, 1:]  # logits at t predict the label at t + 1
        keep = target != IGNORE_INDEX
        diff = x.detach()[0, :-1][keep].softmax(-1) - F.one_hot(target[keep], x.shape[-1]).float()
        weights.append((x.grad[0, :-1][keep] * diff).sum(-1) / (diff * diff).sum(-1))
    return weights


def check_loss_normalisation(model, micro_batches: list[dict], accumulate: Callable) -> Finding:
    """Fail unless every counted token weighs 1/N in the loss accumulated over ``micro_batches``
    (N: the step's counted tokens): unequal weights (a mean of per-micro-batch means), or equal ones
    divided by another count (a ``num_items_in_batch`` that is not the step's count)."""
    per_batch = token_weights(model, micro_batches, accumulate)
    w = torch.cat(per_batch)
    spread, n = float(w.max() / w.min()), len(w)
    evidence = (f"weight of each counted token in the accumulated loss: {float(w.min()):.4f}.."
                f"{float(w.max()):.4f} (max/min {spread:.3f}; 1/N = {1 / n:.4f}) over "
                f"micro-batches with {[len(x) for x in per_batch]} counted tokens")
    if spread > 1 + 1e-4:
        return Finding("equal_token_weights", "fail", evidence,
                       "sum the token losses of every micro-batch and divide by the step's counted "
                       "tokens (num_items_in_batch), not by each micro-batch's own count.")
    scale = float(w.mean()) * n  # 1 when the loss divides by N
    if abs(scale - 1) > 1e-4:
        return Finding("equal_token_weights", "fail",
                       f"{evidence}: every token weighs the same, but the loss divides by {1 / float(w.mean()):.2f}, "
                       f"not by the {n} counted tokens",
                       "divide the step's summed token loss by its counted tokens (labels[..., 1:] != -100 "
                       "over every micro-batch: num_items_in_batch), and count them once.")
    return Finding("equal_token_weights", "pass", evidence)


def mean_of_means(logits: list, labels: list) -> torch.Tensor:
    """The pre-fix reduction: each micro-batch's mean token loss, averaged over the K micro-batches."""
    return _accumulate(logits, labels, "mean_of_means")


def global_token_mean(logits: list, labels: list) -> torch.Tensor:
    """The fix: every micro-batch's summed loss divided by the step's counted tokens (num_items_in_batch)."""
    return _accumulate(logits, labels, "token_mean")


def _accumulate(logits: list, labels: list, reduction: str) -> torch.Tensor:
    """Each micro-batch's summed loss by transformers' own ``ForCausalLMLoss`` (``num_items_in_batch=1``
    makes it a sum), weighed by :func:`packsim.core.loss.accumulated_loss`."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    sums = torch.stack([ForCausalLMLoss(x, y, x.shape[-1], num_items_in_batch=1)
                        for x, y in zip(logits, labels, strict=True)])  # (K,)
    return accumulated_loss(sums, [count_targets(y) for y in labels], reduction)
