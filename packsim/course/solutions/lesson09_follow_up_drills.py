"""Reference answers for appendix A8_follow_up_drills (checks: packsim.course.exercises.lesson09_follow_up_drills).

``show_solution(9, name)`` looks in every ``lesson09_`` module, this one and lesson 09's own."""

from __future__ import annotations

import itertools

import torch


def packed_token_logps(logits, input_ids, cu_seqlens, completion_mask):
    """Per example s, log p(token t | the tokens of s before t) for its completion tokens after its first.

    logits (T, V) from one packed row; logits[t] predicts token t + 1, so token t reads logits[t - 1],
    which lies inside the example only for t after the example's first token.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)  # (T, V): over the vocabulary
    bounds = cu_seqlens.tolist()
    out = []
    for a, b in itertools.pairwise(bounds):  # example s is tokens a .. b-1
        mine = logp[a:b - 1].gather(-1, input_ids[a + 1:b, None])[:, 0]  # (L-1,): tokens a+1 .. b-1
        out.append(mine[completion_mask[a + 1:b]])  # the completion tokens among them
    return out


# Lesson 09's model answer, cheapest first; any order that respects Q2_BEFORE passes.
q2_order = ["which", "by_place", "call", "packs", "probe", "weights", "paired_ci", "decide", "labels"]
