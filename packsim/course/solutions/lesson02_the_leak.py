"""Reference solutions to the exercises of notebook 02_the_leak (checks: packsim.course.exercises.lesson02_the_leak)."""

from __future__ import annotations

import torch


def which_examples_move(k: int, n_examples: int, mask: str) -> set[int]:
    """The *other* examples of a row (packed in order 0..n_examples-1) whose outputs can change
    when example ``k``'s tokens change, under ``mask`` (``"causal"`` or ``"block_diagonal"``)."""
    if mask == "causal":
        return set(range(k + 1, n_examples))  # later tokens look back at k; earlier ones cannot
    return set()  # block-diagonal: nobody outside k ever reads k's tokens


def outside_attention_share(attn: torch.Tensor, seq_ids: torch.Tensor) -> torch.Tensor:
    """Share of each query's attention on keys of another example.

    attn (T, T): row q = attention of query q over the keys (rows sum to 1);
    seq_ids (T,): example id per token (-1 on padding, a group of its own) -> (T,).
    """
    other = seq_ids[:, None] != seq_ids[None, :]  # (T, T): key k belongs to another example than q
    return (attn * other).sum(-1)  # (T,): sum over keys
