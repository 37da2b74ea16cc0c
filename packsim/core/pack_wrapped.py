"""Wrapped packing in numpy: concatenate the examples in data order and cut every ``capacity`` tokens.

:func:`wrapped_arrays` computes the piece arrays of :class:`~packsim.core.pack_result.PackArrays`
for ``pack_arrays(lengths, capacity, "wrapped")`` (:mod:`packsim.core.packing`) with no loop over
examples. Row r starts at the piece holding token ``r * capacity``: the rest of the example that
cut r falls inside (an added piece), or the example starting there. Per cut, a few gathers (the
example before it, the next example start); per piece, a fill, a cumulative sum (``index``) and
a gather (``length``); then each cut's pieces are patched. The time goes to passes over memory,
much of it fresh (page faults), so: the outputs are int32 where they fit
(:func:`~packsim.core.pack_result.piece_dtype`, half the bytes), token offsets are int64 only in
``bounds``, and the temporaries are views of one scratch buffer.

Lessons: none directly.
"""

from __future__ import annotations

import numpy as np

from packsim.core.pack_result import piece_dtype

__all__ = ["wrapped_arrays"]

_SPARSE_CUTS = 8  # fewer cuts than examples / this: find the cuts from row changes, not bincount


def wrapped_arrays(sizes: np.ndarray, capacity: int) -> tuple[np.ndarray, ...]:
    """``(index, start, length, row_offsets)`` of the wrapped packing, views of one buffer.

    Args:
        sizes: the validated example lengths, int64 ``(n,)``, each at least 1.
        capacity: tokens per row, positive.
    """
    n = len(sizes)
    if not n:
        empty = np.zeros(0, dtype=np.int32)
        return empty, empty, empty, np.zeros(1, dtype=np.int32)
    total = int(sizes.sum())
    n_rows = -(-total // capacity)
    m = n_rows - 1  # cuts, at tokens r * capacity for r = 1 .. m
    # int64 slots: bounds (n + 1), cuts and gap64 (m each), work (n + m: the rows of the example
    # starts, then the pieces' example index; at most one added piece per cut), then src (n), gap,
    # lead and tail (m each) in the output dtype (int32 leaves half of that room untouched)
    scratch = np.empty(n + 1 + 2 * m + (n + m) + n + 3 * m, dtype=np.int64)
    bounds, cuts, gap64, work = _views(scratch, (n + 1, m, m, n + m))
    bounds[0] = 0
    np.cumsum(sizes, out=bounds[1:])  # (n + 1,) token offset of each example start, total last
    shift = capacity.bit_length() - 1
    if capacity != 1 << shift:
        shift = None  # else row = token >> shift, cheaper than a division
    rows = work[:n]  # (n,) row of each example start
    _row_of(bounds[:-1], capacity, shift, rows)
    before = _starts_before_cuts(rows, m)  # (m,) examples starting before each cut
    cuts.fill(capacity)
    np.cumsum(cuts, out=cuts)  # (m,) r * capacity
    np.take(bounds, before, out=gap64, mode="clip")  # first example start at or after each cut
    gap64 -= cuts  # tokens from the cut to it: 0 when the cut falls on an example start
    n_cut = int(np.count_nonzero(gap64))  # cuts inside an example, one added piece each
    n_pieces = n + n_cut
    dt = piece_dtype(n_pieces, sizes, total)
    gap, lead, tail, src = _views(scratch[len(scratch) - n - 3 * m :].view(dt), (m, m, m, n))
    np.copyto(gap, gap64, casting="same_kind")
    on_start = np.flatnonzero(gap64 == 0) if n_cut < m else None  # no added piece at these cuts
    # the first piece of row r: after the first pieces of examples 0 .. before[r] - 1 and the added
    # pieces of the cuts before r (r - 1 of them when every cut is inside an example)
    at = cuts  # reuse
    if on_start is None:
        _row_of(at, capacity, shift, at)
        at -= 1
    else:
        inside = gap64  # reuse: the gaps are in `gap` now
        np.minimum(gap64, 1, out=inside)  # 1 where the cut is inside an example (gap64 >= 0)
        np.cumsum(inside, out=at)
        at -= inside
    at += before
    before -= 1  # (m,) the example of the last piece before each cut
    np.copyto(src, sizes, casting="same_kind")  # (n,) lengths in the output dtype, to gather from
    np.take(src, before, out=lead, mode="clip")
    lead -= gap  # its length minus the gap: where the cut falls inside it (its added piece's start)
    np.minimum(lead, min(capacity, np.iinfo(dt).max), out=tail)  # length of the piece ending at the cut
    if on_start is not None:
        lead[on_start] = 0  # the example starting at the cut starts whole
    buf = np.empty(3 * n_pieces + n_rows + 2, dtype=dt)
    shifted, row_offsets = buf[: n_pieces + 1], buf[3 * n_pieces + 1 :]  # shifted[i + 1] is length[i]
    length, index, start = _views(buf[1:], (n_pieces,) * 3)
    row_offsets[0], row_offsets[1:-1], row_offsets[-1] = 0, at, n_pieces
    # index: every piece after the first that is not an added piece starts the next example
    index.fill(1)
    index[0] = 0
    index[at] = 0
    if on_start is not None:
        at_start = at[on_start]
        index[at_start] = 1
    np.cumsum(index, out=index, dtype=dt)
    _gather_lengths(sizes, src, index, length, work)  # whole examples; the pieces at cuts are set below
    length[at] = gap  # an added piece runs to the next example start (or the next cut: below)
    if on_start is not None:
        length[at_start] = sizes[before[on_start] + 1]
    shifted[at] = tail  # the piece before each cut ends at it
    start.fill(0)
    start[at] = lead
    return index, start, length, row_offsets


def _gather_lengths(sizes: np.ndarray, src: np.ndarray, index: np.ndarray, length: np.ndarray,
                    work: np.ndarray) -> None:
    """``length[:] = sizes[index]``; np.take wants an intp index (it converts any other into a new
    array): an int64 index is used as it is, an int32 one is first copied into ``work``."""
    if index.dtype == np.int64:
        np.take(sizes, index, out=length, mode="clip")
    else:
        pieces = work[: len(index)]
        np.copyto(pieces, index)
        np.take(src, pieces, out=length, mode="clip")


def _row_of(tokens: np.ndarray, capacity: int, shift: int | None, out: np.ndarray) -> np.ndarray:
    """The row of each token offset, into ``out``: ``tokens >> shift`` when capacity is 2**shift."""
    if shift is None:
        return np.floor_divide(tokens, capacity, out=out)
    return np.right_shift(tokens, shift, out=out)


def _views(buf: np.ndarray, sizes: tuple[int, ...]) -> list[np.ndarray]:
    """Consecutive views of ``buf``, one per size."""
    ends = np.cumsum(sizes).tolist()
    return [buf[e - k : e] for e, k in zip(ends, sizes, strict=True)]


def _starts_before_cuts(rows: np.ndarray, m: int) -> np.ndarray:
    """For cuts r = 1 .. m, how many examples start before token ``r * capacity``, shape ``(m,)``,
    from the sorted ``rows`` of the example starts: counts per row (``bincount``) summed, or with
    few cuts (``m * _SPARSE_CUTS < n``) the examples starting in a new row (bincount is slow on
    long runs of one row: each count waits for the previous one)."""
    n = len(rows)
    if m * _SPARSE_CUTS >= n:
        before = np.bincount(rows, minlength=m + 1)[:-1]
        return np.cumsum(before, out=before)
    return _from_new_rows(np.flatnonzero(rows[1:] != rows[:-1]), rows, int(rows[-1]), m, n)


def _from_new_rows(new_row: np.ndarray, rows, last: int, m: int, n: int) -> np.ndarray:
    """``before`` from the examples ``new_row + 1`` that start in a later row than the one before
    them, ``rows`` the row of each example start, ``last`` the row of the last one."""
    before = new_row
    before += 1
    if len(before) != last:  # an example spans whole rows: the cuts inside it share a count
        skipped = rows[before]
        skipped -= rows[before - 1]
        before = np.repeat(before, skipped)
    if last < m:  # the cuts after the last example start
        before = np.concatenate([before, np.full(m - last, n, dtype=np.int64)])
    return before
