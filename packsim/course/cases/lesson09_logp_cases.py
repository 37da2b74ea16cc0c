"""The packed rows appendix A8's log-prob check runs on, each with its ground truth (the check:
``lesson09_follow_up_drills.check_packed_token_logps``).

:func:`packed_logp_cases` gives two :class:`LogpCase`: ONE packed row of a tiny random Llama,
logits (T, V) fp32 from one forward with block-diagonal attention (``cu_seq_lens_q/k``, restarting
position_ids), input_ids (T,), cu_seqlens (S+1,) int32, completion_mask (T,) bool, and ``alone``:
S tensors (n_s,) float64, each example's completion log-probs from a forward of that example by
itself. :func:`row_logp` is the per-token log-prob of a row, (T,) float64.

No check lives here, so no solution mirrors this module.

Lessons: A8.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from packsim.core.model import build_model
from packsim.core.segments import cu_seqlens_from_lengths

__all__ = ["LogpCase", "packed_logp_cases", "row_logp"]

_VOCAB = 96


@dataclass(frozen=True)
class LogpCase:
    """One packed row and its ground truth: ``alone[s]`` (n_s,) from example s run by itself."""

    name: str
    logits: torch.Tensor  # (T, V) fp32, one forward over the packed row, block-diagonal attention
    input_ids: torch.Tensor  # (T,) int64
    cu_seqlens: torch.Tensor  # (S+1,) int32
    completion_mask: torch.Tensor  # (T,) bool
    alone: tuple  # S tensors (n_s,) float64


@torch.no_grad()
def _case(model, name: str, examples: list, masks: list) -> LogpCase:
    ids, mask = torch.cat(examples), torch.cat(masks)  # (T,) each
    lengths = [len(x) for x in examples]
    cu, longest = cu_seqlens_from_lengths(lengths), max(lengths)  # (S+1,) int32
    positions = torch.cat([torch.arange(n) for n in lengths])  # restart at 0 for each example
    logits = model(input_ids=ids[None], position_ids=positions[None], cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                   max_length_q=longest, max_length_k=longest, use_cache=False).logits[0]  # (T, V)
    alone = []
    for x, m in zip(examples, masks, strict=True):
        own = model(input_ids=x[None], use_cache=False).logits[0]  # (L, V): the example alone
        alone.append(row_logp(own, x)[1:][m[1:]])  # tokens 1..L-1: the first has no prediction inside it
    return LogpCase(name, logits.float(), ids, cu, mask, tuple(alone))


@functools.lru_cache(maxsize=1)
def packed_logp_cases() -> tuple[LogpCase, LogpCase]:
    """Two packed rows of a tiny random Llama (``build_model("tiny", vocab_size=96, seed=0)``):

    0. a GRPO group: one prompt of 6 tokens, four completions of 5, 3, 7 and 4 tokens (mask: the
       completions);
    1. three documents of 7, 5 and 9 tokens with every token counted (mask all True), as an
       all-token score would: each document's first token is marked but has no log-prob.
    """
    model = build_model("tiny", vocab_size=_VOCAB, seed=0)
    g = torch.Generator().manual_seed(0)

    def draw(n):
        return torch.randint(3, _VOCAB, (n,), generator=g)

    prompt = draw(6)
    group = [torch.cat([prompt, draw(n)]) for n in (5, 3, 7, 4)]
    docs = [draw(n) for n in (7, 5, 9)]
    return (_case(model, "a GRPO group (one prompt, four completions)", group,
                  [torch.arange(len(x)) >= len(prompt) for x in group]),
            _case(model, "three documents, every token counted", docs, [torch.ones(len(x), dtype=torch.bool) for x in docs]))


def row_logp(logits, ids, shift=True):
    """(T,) log_softmax over the vocabulary at each token: from the logit before it (shift) or its own."""
    lp = torch.log_softmax(logits.double(), -1)  # (T, V)
    if not shift:
        return lp.gather(-1, ids[:, None])[:, 0]
    return torch.cat([lp.new_full((1,), float("nan")), lp[:-1].gather(-1, ids[1:, None])[:, 0]])
