"""Checks for the exercise of notebook 04_transformers_traps.

- :func:`check_position_ids_from_lengths`: example lengths -> position ids (sum(lengths),) long
  that restart at 0 in every example, the form transformers needs to detect a pack.

The check runs the learner's function on small hand-made packs and compares it with answers
computed here by a plain Python loop.
"""

from __future__ import annotations

import torch

from packsim.course.exercises import Feedback, check, fail, ok

__all__ = ["check_position_ids_from_lengths", "LENGTH_CASES"]

# Packs the check tries, as example lengths: several examples, one example, many length-1
# examples (the same packs as lesson 03's checks).
LENGTH_CASES: tuple[tuple[int, ...], ...] = ((3, 2, 4), (5,), (1, 1, 1), (2, 6, 1, 3))


def _as_list(x) -> list | None:
    """A tensor, list or tuple as a flat Python list (None if it is none of those)."""
    if isinstance(x, torch.Tensor):
        return x.reshape(-1).tolist()
    if isinstance(x, (list, tuple)):
        return list(x)
    return None


@check("position ids from lengths")
def check_position_ids_from_lengths(fn) -> Feedback:
    """``fn(lengths: list[int]) -> torch.Tensor`` (sum(lengths),) long: 0..L-1 for each example."""
    for lengths in LENGTH_CASES:
        got = fn(list(lengths))
        want = [p for n in lengths for p in range(n)]
        where = f"for lengths {list(lengths)}"
        values = _as_list(got)
        if values is None:
            return fail(f"{where} you returned a {type(got).__name__}, not a tensor.",
                        "return torch.cat([torch.arange(n) for n in lengths]) or similar.")
        if values == want:
            if not isinstance(got, torch.Tensor) or got.dtype != torch.long:
                dtype = got.dtype if isinstance(got, torch.Tensor) else type(got).__name__
                return fail(f"{where} the values are right but you returned {dtype}; position "
                            "ids are a torch.long tensor.",
                            "the model indexes its rotary tables with them: use torch.arange, "
                            "which gives int64.")
            continue
        total = sum(lengths)
        if values == list(range(total)):
            return fail(
                f"{where} you returned 0..{total - 1} across the whole pack: positions continue "
                "instead of restarting, so transformers sees one long sequence and builds no "
                "block-diagonal mask.",
                "restart at 0 at the start of every example.",
            )
        if values == [p + 1 for p in want]:
            return fail(f"{where} your positions start at 1; they start at 0 in every example.",
                        "use torch.arange(n), which counts 0..n-1.")
        if len(values) != total:
            return fail(f"{where} you returned {len(values)} positions for {total} tokens.",
                        "one position per token: the total length is sum(lengths).")
        return fail(f"{where} you returned {values}, expected {want}.",
                    "concatenate 0..L-1 for each example length L.")
    return ok(f"right on {len(LENGTH_CASES)} packs: positions restart at 0 in every example.")
