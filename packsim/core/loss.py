"""Labels and the loss: which tokens count, and how to normalise so every response token weighs the same.

Labels follow the transformers convention: ``labels`` (B, T) is aligned with ``input_ids`` and
the model predicts ``labels[:, t + 1]`` from position ``t``; ``-100`` means "not counted". Every
token of a packed row has a :class:`Role` that says why it is (or is not) counted: ``PAD``,
``FIRST`` (a row's first token, never a target), ``BOUNDARY`` (a later example's BOS: predicting
it from the previous EOS is the boundary-token bug), ``PROMPT``, ``RESPONSE``, ``EOS`` (counted,
so the model learns to stop) and ``UNKNOWN`` (the audit's role where a collator batch does not say
prompt or response). Lesson 05 teaches this module step by step; lesson 07 audits it.

Lessons: 05, 07, 10, A4, A6.
"""

from __future__ import annotations

from enum import IntEnum

import torch
import torch.nn.functional as F

from packsim.core.errors import PacksimError

__all__ = [
    "Role",
    "IGNORE_INDEX",
    "response_mask",
    "make_labels",
    "count_targets",
    "packed_cross_entropy",
    "token_losses",
    "MICRO_BATCH_REDUCTIONS",
    "micro_batch_weights",
    "accumulated_loss",
]

IGNORE_INDEX = -100


class Role(IntEnum):
    """Why a token of a packed row is (or is not) a target; see the table in the module doc."""

    PAD = 0
    FIRST = 1
    BOUNDARY = 2
    PROMPT = 3
    RESPONSE = 4
    EOS = 5
    UNKNOWN = 6

    @property
    def label(self) -> str:
        """The role's name in reports and tooltips: ``padding``, ``EOS``, ``prompt``, ..."""
        return _ROLE_LABELS.get(self, self.name.lower())


_ROLE_LABELS = {Role.PAD: "padding", Role.EOS: "EOS"}


def response_mask(roles: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: True on the tokens a completion-only loss counts (RESPONSE and EOS)."""
    return (roles == Role.RESPONSE) | (roles == Role.EOS)


def make_labels(input_ids: torch.Tensor, roles: torch.Tensor, loss: str) -> torch.Tensor:
    """Labels (B, T) for a loss mode: ``"all"`` counts every token, ``"completion"`` only RESPONSE and EOS.

    ``"all"`` is what ``labels = input_ids.clone()`` gives: prompt, padding and boundary tokens
    are all targets. ``"completion"`` masks everything but the response and its EOS.
    """
    if loss == "all":
        return input_ids.clone()  # (B, T)
    if loss == "completion":
        return torch.where(response_mask(roles), input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    raise PacksimError(f"unknown loss mode {loss!r}: use 'all' or 'completion'.")


def count_targets(labels: torch.Tensor) -> int:
    """Number of counted targets in (B, T) labels after the one-token shift."""
    return int((labels[..., 1:] != IGNORE_INDEX).sum())


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token cross-entropy (B, T-1) of the shifted prediction; 0 where the label is ignored."""
    B, T, V = logits.shape
    flat = F.cross_entropy(
        logits[:, :-1].reshape(-1, V).float(),  # (B*(T-1), V)
        labels[:, 1:].reshape(-1),  # (B*(T-1),)
        ignore_index=IGNORE_INDEX,
        reduction="none",
    )
    return flat.view(B, T - 1)


def packed_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, num_items: int | None = None
) -> torch.Tensor:
    """Sum of per-token losses divided by ``num_items`` (default: the counted targets in this batch).

    logits (B, T, V), labels (B, T) -> scalar. For gradient accumulation pass the number of
    counted targets over *all* micro-batches of the optimizer step, so each response token has
    the same weight whatever pack it landed in (a per-pack or per-micro-batch mean would
    over-weight tokens in sparse packs).
    """
    if logits.shape[:2] != labels.shape:
        raise PacksimError(
            f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} disagree on (B, T): "
            "pass the logits of the same batch the labels came from."
        )
    n = count_targets(labels) if num_items is None else int(num_items)
    if n <= 0:
        raise PacksimError(
            "no label is counted in this batch (all are -100): check the loss mode and that "
            "examples have response tokens, or skip this batch."
        )
    return token_losses(logits, labels).sum() / n


# ------------------------------------------------------------------ over micro-batches: token mean or mean of means

# how the summed token losses of a step's micro-batches become its loss (packsim.scaling.normalisation
# applies them across data-parallel ranks as its --normalise kinds)
MICRO_BATCH_REDUCTIONS = ("token_mean", "mean_of_means")


def micro_batch_weights(counts, reduction: str = "token_mean") -> torch.Tensor:
    """Weight of each micro-batch's *summed* token loss: counts (..., M) -> (..., M) float64.

    ``counts[..., m]`` is micro-batch m's number of counted targets. ``token_mean`` gives
    ``1 / counts.sum(-1)``: every counted token weighs the same wherever it landed (what one big
    batch, or ``num_items_in_batch``, computes). ``mean_of_means`` gives ``1 / (M * counts[..., m])``:
    each micro-batch's own mean, averaged, which over-weights the tokens of sparse micro-batches.
    A micro-batch with no counted target weighs exactly 0 (never 0/0).
    """
    if reduction not in MICRO_BATCH_REDUCTIONS:
        raise PacksimError(f"unknown reduction {reduction!r}: use one of {list(MICRO_BATCH_REDUCTIONS)}.")
    n = torch.as_tensor(counts).to(torch.float64)  # (..., M)
    if reduction == "token_mean":
        w = _safe_inverse(n.sum(dim=-1, keepdim=True)).expand_as(n)  # (..., 1) -> (..., M)
    else:
        w = _safe_inverse(n) / n.shape[-1]
    return torch.where(n > 0, w, torch.zeros_like(n))


def accumulated_loss(sums, counts, reduction: str = "token_mean") -> torch.Tensor:
    """The loss over micro-batches: summed token losses (..., M) and their counts (..., M) -> (...).

    ``(micro_batch_weights(counts, reduction) * sums).sum(-1)``, in ``sums``' dtype when it is a
    float tensor (gradients flow through ``sums``); 0 when nothing is counted.
    """
    sums = torch.as_tensor(sums)
    sums = sums if sums.is_floating_point() else sums.to(torch.float64)
    w = micro_batch_weights(counts, reduction)
    if w.shape != sums.shape:
        raise PacksimError(f"sums {tuple(sums.shape)} and counts {tuple(w.shape)} must have the same shape: "
                           "one summed loss and one count per micro-batch.")
    return (w.to(sums.dtype) * sums).sum(dim=-1)


def _safe_inverse(x: torch.Tensor) -> torch.Tensor:
    """1 / x where x > 0, else 0."""
    return torch.where(x > 0, 1.0 / x.clamp(min=1), torch.zeros_like(x))
