"""Checks for the exercises of notebook 03_block_diagonal.

- :func:`check_cu_seqlens_from_lengths`: example lengths -> int32 offsets ``cu_seqlens``;
- :func:`check_block_causal_mask`: sequence ids (T,) -> the block-diagonal causal mask (T, T).

(Position ids that restart at 0 are lesson 04's exercise: ``lesson04_transformers_traps``.)

Each check runs the learner's function on small hand-made packs and compares it with answers
computed here independently (plain Python loops, or :func:`packsim.core.masks.block_diagonal_mask`).
The ``cu_seqlens`` check names every fault of an answer (its type, values, shape and dtype judged
apart: no leading 0 *and* int64 hears both).
"""

from __future__ import annotations

import torch

from packsim.core.masks import block_diagonal_mask
from packsim.course.exercises import Feedback, check, fail, ok

__all__ = [
    "check_cu_seqlens_from_lengths",
    "check_block_causal_mask",
    "LENGTH_CASES",
    "SEQ_ID_CASES",
]

# Packs the checks try, as example lengths: several examples, one example, many length-1 examples.
LENGTH_CASES: tuple[tuple[int, ...], ...] = ((3, 2, 4), (5,), (1, 1, 1), (2, 6, 1, 3))

# Packs as sequence ids per token (T,); the last one ends in two padding tokens (-1).
SEQ_ID_CASES: tuple[tuple[int, ...], ...] = (
    (0, 0, 0, 1, 1, 2, 2, 2),
    (0, 0, 0, 0),
    (0, 1, 1, 2, 2, 2, -1, -1),
)


def _offsets(lengths) -> list[int]:
    """[0, l0, l0+l1, ...]: the answer, by a plain loop."""
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out



def _cu_faults(got, lengths) -> list[tuple[str, str]]:
    """Every fault of one answer ``got`` for ``lengths``, each (what is wrong, how to fix it): its
    type, its values, its shape and its dtype are judged apart, so an answer with two faults hears both."""
    want = _offsets(lengths)
    faults = []
    if isinstance(got, torch.Tensor):
        values = got.reshape(-1).tolist()
    else:
        faults.append((f"you returned a {type(got).__name__}, not a torch.Tensor",
                       "kernels take a tensor: torch.tensor(offsets, dtype=torch.int32)"))
        try:
            values = [int(v) for v in got]
        except (TypeError, ValueError):
            return faults
    if values == want:
        pass
    elif values == want[1:]:
        faults.append((f"the values {values} are the running totals without the leading 0",
                       "cu_seqlens has one entry more than there are examples: it starts at 0, so example i "
                       "spans cu_seqlens[i]:cu_seqlens[i+1]; prepend a 0"))
    elif values in (list(lengths), [0, *lengths]):
        faults.append((f"the values {values} are the lengths, not the offsets",
                       "cu_seqlens is cumulative: each entry is where an example starts (a running sum of the "
                       "lengths), e.g. torch.cumsum"))
    else:
        faults.append((f"the values are {values}, expected {want}",
                       "start at 0 and add each example's length: [0, l0, l0+l1, ..., total]"))
    if isinstance(got, torch.Tensor):
        if got.dim() != 1:
            faults.append((f"the shape is {tuple(got.shape)}; cu_seqlens is 1-D (S+1,)",
                           "return a flat tensor, e.g. with .reshape(-1)"))
        if got.dtype != torch.int32:
            faults.append((f"the dtype is {got.dtype}, not torch.int32",
                           "flash_attn_varlen_func rejects anything but int32 offsets (torch.cumsum of int lengths "
                           "gives int64): add dtype=torch.int32 or call .to(torch.int32)"))
    return faults


@check("cu_seqlens from lengths")
def check_cu_seqlens_from_lengths(fn) -> Feedback:
    """``fn(lengths: list[int]) -> torch.Tensor`` (S+1,) int32: ``[0, l0, l0+l1, ..., sum]``; every
    fault of the first wrong answer is named (values, shape and dtype apart)."""
    for lengths in LENGTH_CASES:
        faults = _cu_faults(fn(list(lengths)), lengths)
        if not faults:
            continue
        count = {1: "", 2: "two faults: ", 3: "three faults: ", 4: "four faults: "}[len(faults)]
        return fail(
            f"for lengths {list(lengths)} {count}" + "; ".join(what for what, _ in faults) + ".",
            "; ".join(fix for _, fix in faults) + ".",
        )
    return ok(
        f"right on {len(LENGTH_CASES)} packs: int32 offsets that start at 0 and end at the "
        "number of tokens, as flash_attn_varlen_func takes them."
    )


@check("block-diagonal causal mask")
def check_block_causal_mask(fn) -> Feedback:
    """``fn(seq_ids: (T,) long) -> (T, T) bool``, True where query i may attend to key j."""
    for ids in SEQ_ID_CASES:
        seq = torch.tensor(ids)
        T = len(ids)
        got = fn(seq.clone())
        where = f"for seq_ids {list(ids)}"
        if not isinstance(got, torch.Tensor):
            return fail(f"{where} you returned a {type(got).__name__}, not a torch.Tensor.",
                        "build the mask with tensor operations and return it.")
        if tuple(got.shape) != (T, T):
            return fail(f"{where} your mask has shape {tuple(got.shape)}, expected ({T}, {T}).",
                        "one row per query token and one column per key token.")
        if got.dtype != torch.bool:
            return fail(
                f"{where} your mask has dtype {got.dtype}; it should be torch.bool.",
                "compare with == and combine with &; True means 'may attend'.",
            )
        want = block_diagonal_mask(seq)  # (T, T) the library's mask
        if torch.equal(got, want):
            continue
        real = seq >= 0
        same_doc = (seq[:, None] == seq[None, :]) & real[:, None] & real[None, :]
        tril = torch.ones(T, T, dtype=torch.bool).tril()
        if torch.equal(got, want.T):
            return fail(f"{where} your mask is transposed: it lets each token see the *future* "
                        "tokens of its example.",
                        "row i is the query, column j the key: allow j <= i (a lower triangle).")
        if torch.equal(got, same_doc) or torch.equal(got, seq[:, None] == seq[None, :]):
            return fail(f"{where} your mask is block-diagonal but not causal: a token sees the "
                        "later tokens of its own example.",
                        "AND it with a lower-triangular mask: torch.ones(T, T).tril().bool().")
        if torch.equal(got, tril) or torch.equal(got, tril & real[:, None] & real[None, :]):
            return fail(f"{where} your mask is causal but not block-diagonal: every example "
                        "still sees the examples before it (the bug of notebook 02).",
                        "AND it with 'same example': seq_ids[:, None] == seq_ids[None, :].")
        if torch.equal(got & real[:, None] & real[None, :], want):
            pad = [i for i in range(T) if ids[i] < 0]
            return fail(f"{where} your mask lets the padding tokens (positions {pad}) attend or "
                        "be attended to.",
                        "padding (-1) belongs to no example: its rows and columns must be all "
                        "False; AND with (seq_ids >= 0) on both sides.")
        bad = (got != want).nonzero()[0].tolist()
        return fail(
            f"{where} your mask differs at query {bad[0]}, key {bad[1]}: you have "
            f"{bool(got[bad[0], bad[1]])}, expected {bool(want[bad[0], bad[1]])}.",
            "True exactly when both tokens belong to the same example (not padding) and key <= "
            "query.",
        )
    return ok(
        f"right on {len(SEQ_ID_CASES)} packs, padding included: causal inside each example, "
        "nothing across examples."
    )
