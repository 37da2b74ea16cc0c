"""Checks for the exercises of notebook 02_the_leak (solutions: packsim.course.solutions.lesson02_the_leak).

- :func:`check_which_examples_move`: ``which_examples_move(k, n_examples, mask) -> set[int]``;
- :func:`check_outside_attention_share`: ``outside_attention_share(attn, seq_ids) -> (T,)``.

Oracles: packsim's boolean masks (who may attend to whom) and :func:`packsim.core.attention_share.outside_share`
on attention rows drawn here; the usual mistakes (own example counted, earlier examples counted,
off-by-one at a boundary, the wrong axis) are recognised by name.
"""

from __future__ import annotations

import numbers

import torch

from packsim.core.attention_share import outside_share
from packsim.core.masks import block_diagonal_mask, causal_mask
from packsim.course.exercises import Feedback, check, fail, ok

__all__ = ["check_which_examples_move", "check_outside_attention_share"]

MASKS = ("causal", "block_diagonal")


# --- which examples move --------------------------------------------------------------------------


def _row_seq_ids(n_examples: int) -> torch.Tensor:
    """(T,) example ids of one packed row: examples 0..n-1 of lengths 3, 5, 2, 4, ... in order."""
    lengths = [3 + (2 * i) % 5 for i in range(n_examples)]
    return torch.repeat_interleave(torch.arange(n_examples), torch.tensor(lengths))


def _moving_by_mask(k: int, n_examples: int, mask: str) -> set[int]:
    """Other examples with a query allowed to read a key of example ``k`` (the oracle)."""
    seq = _row_seq_ids(n_examples)  # (T,)
    allowed = causal_mask(len(seq)) if mask == "causal" else block_diagonal_mask(seq)  # (T, T)
    reads_k = allowed[:, seq == k].any(-1)  # (T,): query may attend to some token of k
    return {int(e) for e in seq[reads_k].unique()} - {k}


def _as_int_set(got) -> set[int] | str:
    if isinstance(got, (str, bytes, numbers.Number)) or got is None or not hasattr(got, "__iter__"):
        return f"returned {got!r} ({type(got).__name__}), not a set of example indices"
    items = list(got.tolist() if hasattr(got, "tolist") else got)
    bad = [x for x in items if isinstance(x, bool) or not isinstance(x, numbers.Integral)]
    if bad:
        return f"returned a collection holding {bad[0]!r}; hold example indices (ints)"
    return {int(x) for x in items}


@check("which examples move")
def check_which_examples_move(which_examples_move) -> Feedback:
    """``which_examples_move(k, n, mask)`` on every k for n = 1..5, both masks."""
    cases = [(1, 4, "causal"), (1, 4, "block_diagonal")]  # the notebook's case first
    cases += [(k, n, m) for m in MASKS for n in range(1, 6) for k in range(n)]
    for k, n, mask in cases:
        want = _moving_by_mask(k, n, mask)
        shown = f"which_examples_move(k={k}, n_examples={n}, mask={mask!r})"
        got = _as_int_set(which_examples_move(k, n, mask))
        if isinstance(got, str):
            return fail(f"{shown} {got}.", "return a set such as {2, 3} (or set() for none).")
        if got == want:
            continue
        wanted = sorted(want) if want else "set()"
        head = f"{shown} returned {sorted(got) if got else 'set()'}, expected {wanted}"
        if k in got:
            return fail(f"{head}: you included example {k} itself.",
                        "the question is about the *other* examples: example k obviously "
                        "changes when its own tokens do. Leave k out.")
        beyond = sorted(x for x in got if not 0 <= x < n)
        if beyond:
            return fail(f"{head}: there is no example {beyond[0]} (examples are 0..{n - 1}).",
                        "keep the indices inside range(n_examples).")
        if mask == "block_diagonal":
            return fail(f"{head}: a block-diagonal mask stops attention at the example boundary.",
                        "no token of another example may read example k's tokens, so nothing "
                        "else moves: return set().")
        earlier = sorted(x for x in got if x < k)
        if earlier:
            return fail(f"{head}: example {earlier[0]} is packed before example {k}, and a causal "
                        "mask only lets tokens look back.",
                        "an earlier example never sees a later one: only the examples after k "
                        "can read its tokens.")
        missing = sorted(want - got)
        if missing == [n - 1]:
            return fail(f"{head}: you missed the last example ({n - 1}).",
                        "range(a, b) stops before b: the examples after k are range(k + 1, n).")
        if missing and missing[0] == k + 1:
            return fail(f"{head}: you missed example {k + 1}, right after example {k}.",
                        "the very next example reads k's tokens too: start at k + 1.")
        return fail(f"{head}.", "under a causal mask every example after k in the row can read k.")
    return ok("causal: every later example in the row moves; block-diagonal: none. "
              "That is exactly what the perturbation above measured.")


# --- outside attention share ----------------------------------------------------------------------


def _attention_rows(seq: torch.Tensor, mask: str, seed: int) -> torch.Tensor:
    """Random attention (T, T) whose rows sum to 1 over the keys ``mask`` allows."""
    gen = torch.Generator().manual_seed(seed)
    T = len(seq)
    if mask == "causal":
        allowed = causal_mask(T)  # (T, T)
    else:  # padding queries attend to themselves (block_diagonal_mask gives them no key)
        allowed = block_diagonal_mask(seq) | ((seq < 0)[:, None] & torch.eye(T, dtype=torch.bool))
    scores = torch.randn(T, T, generator=gen, dtype=torch.float64)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(-1)  # (T, T)


def _hand_case() -> tuple[torch.Tensor, torch.Tensor]:
    """Two examples (2 and 3 tokens), uniform causal attention: shares 0, 0, 2/3, 1/2, 2/5."""
    seq = torch.tensor([0, 0, 1, 1, 1])
    attn = causal_mask(5).double()
    return attn / attn.sum(-1, keepdim=True), seq


def _as_shares(got, T: int) -> torch.Tensor | str:
    try:
        got = got.detach() if isinstance(got, torch.Tensor) else got
        t = torch.as_tensor(got, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        return f"returned {type(got).__name__}, not numbers"
    if t.ndim == 0:
        return "returned one number; return one share per query token, shape (T,)"
    if tuple(t.shape) != (T,):
        return f"returned shape {tuple(t.shape)}, expected ({T},): one share per query token"
    return t


@check("share of attention outside the own example")
def check_outside_attention_share(outside_attention_share) -> Feedback:
    """``outside_attention_share(attn (T, T), seq_ids (T,))`` on a hand case and random rows."""
    pad_row = torch.tensor([0] * 6 + [1] * 4 + [2] * 7 + [-1] * 3)  # (20,): padding at the end
    hand = "a hand case of two examples (seq_ids [0, 0, 1, 1, 1], uniform causal attention)"
    cases = [(hand, *_hand_case())]
    for i, mask in enumerate(MASKS):
        what = f"a pack of 3 examples and 3 padding tokens, {mask} attention"
        cases.append((what, _attention_rows(pad_row, mask, i), pad_row))
    for what, attn, seq in cases:
        want = outside_share(attn[None, None], seq[None])[0, 0]  # (T,)
        got = _as_shares(outside_attention_share(attn.clone(), seq.clone()), len(seq))
        if isinstance(got, str):
            return fail(f"on {what}, your function {got}.",
                        "sum attn[q, k] over the keys k of other examples, for every query q.")
        wrong = (got - want).abs() > 1e-6
        if not wrong.any():
            continue
        head = f"on {what}: got {_fmt(got)}, expected {_fmt(want)}"
        other = seq[:, None] != seq[None, :]
        if torch.allclose(got, 1 - want, atol=1e-6):
            return fail(f"{head}: that is the share *inside* the own example.",
                        "count the keys whose example id differs from the query's.")
        if torch.allclose(got, (attn * other).sum(0), atol=1e-6):
            return fail(f"{head}: you summed over the queries (axis 0).",
                        "attn[q, k] is query q's weight on key k: sum over the last axis (keys).")
        q = int(wrong.nonzero()[0])
        e = int(seq[q])
        if bool((seq[wrong] < 0).all()):
            return fail(f"{head}: only the padding queries are off (first: token {q}).",
                        "treat padding (id -1) as one more group: a padding query's weight on "
                        "real tokens counts as outside, as seq_ids[q] != seq_ids[k] gives.")
        starts = {0} | {t for t in range(1, len(seq)) if seq[t] != seq[t - 1]}
        ends = {t - 1 for t in starts if t > 0} | {len(seq) - 1}
        if all(t in starts or t in ends for t in wrong.nonzero().flatten().tolist()):
            return fail(f"{head}: only tokens at example boundaries are off (first: token {q}, "
                        f"example {e}): an off-by-one in where examples start or end.",
                        "don't rebuild boundaries by hand: compare seq_ids[q] with seq_ids[k].")
        return fail(f"{head}: first wrong at query token {q} (example {e}).",
                    "share[q] = sum of attn[q, k] over keys k with seq_ids[k] != seq_ids[q].")
    return ok("one share per query, summed over keys of other examples (padding is a group of "
              "its own): the number the leakage explorer shows for a clicked token.")


def _fmt(t: torch.Tensor, n: int = 6) -> str:
    vals = ", ".join(f"{float(x):.3f}" for x in t[:n])
    return f"[{vals}{', ...' if len(t) > n else ''}]"
