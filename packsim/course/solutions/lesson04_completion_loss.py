"""Reference solutions to the exercises of notebook 04_completion_only_loss (checks: packsim.course.exercises.lesson04_completion_loss)."""

from __future__ import annotations

import torch

from packsim.core.loss import IGNORE_INDEX, Role


def completion_labels(input_ids: torch.Tensor, roles: torch.Tensor) -> torch.Tensor:
    """input_ids, roles (B, T) -> labels (B, T): the token id on response and EOS tokens, else -100."""
    keep = (roles == Role.RESPONSE) | (roles == Role.EOS)  # (B, T)
    return torch.where(keep, input_ids, torch.full_like(input_ids, IGNORE_INDEX))


def per_token_loss(micro_batches: list[torch.Tensor]) -> torch.Tensor:
    """Token losses of each micro-batch (1-D tensors) -> sum over all tokens / number of tokens."""
    total = sum(t.sum() for t in micro_batches)
    n_tokens = sum(t.numel() for t in micro_batches)
    return total / n_tokens


correct_row = "C"  # the correct row of label_candidates(): A drops EOS, B counts the boundary, D is shifted
