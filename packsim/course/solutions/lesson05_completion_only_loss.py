"""Reference solutions to the exercises of notebook 05_completion_only_loss (checks: packsim.course.exercises.lesson05_completion_only_loss)."""

from __future__ import annotations

import torch

from packsim.core.loss import IGNORE_INDEX


def completion_labels(input_ids: torch.Tensor, lengths: list[int], prompt_lengths: list[int]) -> torch.Tensor:
    """One packed row (T,) -> labels (T,): each example's response and EOS keep their ids, else -100.

    Example i occupies [start, start + lengths[i]); its first prompt_lengths[i] tokens (its <bos>
    included) are the prompt; whatever follows the last example is padding.
    """
    labels = torch.full_like(input_ids, IGNORE_INDEX)  # (T,)
    start = 0
    for n, p in zip(lengths, prompt_lengths, strict=True):
        labels[start + p : start + n] = input_ids[start + p : start + n]  # response + EOS
        start += n
    return labels


def per_token_loss(micro_batches: list[torch.Tensor]) -> torch.Tensor:
    """Token losses of each micro-batch (1-D tensors) -> sum over all tokens / number of tokens."""
    total = sum(t.sum() for t in micro_batches)
    n_tokens = sum(t.numel() for t in micro_batches)
    return total / n_tokens


correct_row = "C"  # the correct row of label_candidates(): A drops EOS, B counts the boundary, D is shifted


def response_start(full_ids: list[int], prompt_ids: list[int]) -> int:
    """Index of the first token of ``full_ids`` (prompt + response tokenized together) that holds a
    response character: where ``full_ids`` stops agreeing with ``prompt_ids`` (the prompt alone).

    Never searches for the template's ids: a merge across the boundary changes them.

    A heuristic: it assumes every token before the boundary is tokenized the same way alone and
    joined. A BPE merge that reaches back from the boundary (prompt "ab=" alone ``a | b=``, joined
    "ab=8" ``a | b | =8``) makes the ids differ one token early, on a prompt token. The robust rule
    needs character offsets: the first token whose span ends past ``len(prompt_text)`` (lesson 05
    shows the case; the lesson's ``bpe`` has no such merge, so the check passes this reference).
    """
    n = 0
    while n < min(len(full_ids), len(prompt_ids)) and full_ids[n] == prompt_ids[n]:
        n += 1
    return n
