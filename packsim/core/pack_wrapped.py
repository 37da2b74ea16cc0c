"""Wrapped packing in numpy: concatenate the examples in data order and cut every ``capacity`` tokens.

:func:`wrapped_arrays` computes the piece arrays of :class:`~packsim.core.pack_result.PackArrays`
for ``pack_arrays(lengths, capacity, "wrapped")`` (:mod:`packsim.core.packing`) with no loop over
examples. Row r starts at the piece holding token ``r * capacity``: the rest of the example that
cut r falls inside (an added piece), or the example starting there. Per cut, a few gathers (the
example before it, the next example start); per piece, a fill, a cumulative sum (``index``) and
a gather (``length``); then each cut's pieces are patched. The time goes to passes over memory,
much of it fresh (page faults), so: the outputs are int32 where they fit
(:func:`~packsim.core.pack_result.piece_dtype`, half the bytes), token offsets are int64 only in
``bounds``, the temporaries are views of one scratch buffer, and past ``_CHUNKED_FROM`` pieces
the per-example and per-piece intermediates are made ``_CHUNK`` elements at a time in small
reused buffers instead of whole arrays.

Lessons: none directly.
"""

from __future__ import annotations

import numpy as np

from packsim.core.pack_result import piece_dtype

__all__ = ["wrapped_arrays"]

_SPARSE_CUTS = 8  # fewer cuts than examples / this: find the cuts from row changes, not bincount
_CHUNKED_FROM = 1 << 20  # from this many pieces (at most), work in chunks of _CHUNK elements
_CHUNK = 1 << 16


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
    chunked = n + m >= _CHUNKED_FROM  # n + m: at most one added piece per cut
    # int64 slots: bounds (n + 1), cuts and gap64 (m each), work (n + m, unless chunked: the rows of
    # the example starts, then the pieces' example index), then src (n, unless chunked), gap,
    # lead and tail (m each) in the output dtype (int32 leaves half of that room untouched)
    scratch = np.empty(n + 1 + 2 * m + (0 if chunked else n + m) + n + 3 * m, dtype=np.int64)
    bounds, cuts, gap64 = _views(scratch, (n + 1, m, m))
    work = None if chunked else scratch[n + 1 + 2 * m : 2 * n + 3 * m + 1]
    bounds[0] = 0
    np.cumsum(sizes, out=bounds[1:])  # (n + 1,) token offset of each example start, total last
    shift = capacity.bit_length() - 1
    if capacity != 1 << shift:
        shift = None  # else row = token >> shift, cheaper than a division
    if chunked:
        before = _starts_before_cuts_chunked(bounds, capacity, shift, m)
    else:
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
    if chunked:
        np.take(sizes, before, out=gap64, mode="clip")
        np.copyto(lead, gap64, casting="same_kind")
    else:
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
                    work: np.ndarray | None) -> None:
    """``length[:] = sizes[index]``; np.take wants an intp index (it converts any other into a new
    array): an int64 index is used as it is; else it is copied into ``work`` (when given) or, a
    chunk at a time, into a small buffer (gathering from the int64 ``sizes``, then cast)."""
    if index.dtype == np.int64:
        np.take(sizes, index, out=length, mode="clip")
    elif work is not None:
        pieces = work[: len(index)]
        np.copyto(pieces, index)
        np.take(src, pieces, out=length, mode="clip")
    else:
        at, got = np.empty((2, min(len(index), _CHUNK)), dtype=np.int64)
        for a in range(0, len(index), _CHUNK):
            k = min(_CHUNK, len(index) - a)
            np.copyto(at[:k], index[a : a + k])
            np.take(sizes, at[:k], out=got[:k], mode="clip")
            np.copyto(length[a : a + k], got[:k], casting="same_kind")


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


def _starts_before_cuts_chunked(bounds: np.ndarray, capacity: int, shift: int | None, m: int) -> np.ndarray:
    """:func:`_starts_before_cuts` with the rows made ``_CHUNK`` example starts at a time."""
    n = len(bounds) - 1
    rows = np.empty(min(n, _CHUNK) + 1, dtype=np.int64)
    if m * _SPARSE_CUTS >= n:
        counts = np.zeros(m + 1, dtype=np.int64)
        for a in range(0, n, _CHUNK):
            r = _row_of(bounds[a : min(a + _CHUNK, n)], capacity, shift, rows[: min(_CHUNK, n - a)])
            first = int(r[0])
            r -= first
            per_row = np.bincount(r)
            counts[first : first + len(per_row)] += per_row
        before = counts[:-1]
        return np.cumsum(before, out=before)
    new_row = np.empty(n - 1, dtype=bool)  # example e + 1 starts in a later row than example e
    for a in range(0, n - 1, _CHUNK):
        k = min(_CHUNK, n - 1 - a)
        r = _row_of(bounds[a : a + k + 1], capacity, shift, rows[: k + 1])
        np.not_equal(r[1:], r[:-1], out=new_row[a : a + k])
    last = int(bounds[n - 1]) // capacity
    return _from_new_rows(np.flatnonzero(new_row), _LazyRows(bounds, capacity, shift), last, m, n)


class _LazyRows:
    """``rows[i]`` for an index array ``i``, computed from ``bounds`` on demand (few elements)."""

    def __init__(self, bounds: np.ndarray, capacity: int, shift: int | None):
        self.bounds, self.capacity, self.shift = bounds, capacity, shift

    def __getitem__(self, i: np.ndarray) -> np.ndarray:
        picked = np.take(self.bounds, i)
        return _row_of(picked, self.capacity, self.shift, picked)


def _from_new_rows(new_row: np.ndarray, rows, last: int, m: int, n: int) -> np.ndarray:
    """``before`` from the examples ``new_row + 1`` that start in a later row than the one before
    them, ``rows`` (indexable by an array) giving the row of any example start, ``last`` the row
    of the last one."""
    before = new_row
    before += 1
    if len(before) != last:  # an example spans whole rows: the cuts inside it share a count
        skipped = rows[before]
        skipped -= rows[before - 1]
        before = np.repeat(before, skipped)
    if last < m:  # the cuts after the last example start
        before = np.concatenate([before, np.full(m - last, n, dtype=np.int64)])
    return before
