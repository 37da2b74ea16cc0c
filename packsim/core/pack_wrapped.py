"""Wrapped packing in one compiled pass: concatenate the examples in data order and cut every
``capacity`` tokens.

:func:`wrapped_arrays` computes the piece arrays of :class:`~packsim.core.pack_result.PackArrays`
for ``pack_arrays(lengths, capacity, "wrapped")`` (:mod:`packsim.core.packing`)::

    index        (n_pieces,)    example each piece comes from
    start        (n_pieces,)    first token of the piece inside its example
    length       (n_pieces,)    tokens in the piece
    row_offsets  (n_rows + 1,)  row r holds pieces row_offsets[r]:row_offsets[r + 1]

:func:`_fill_pieces` is the whole algorithm, a plain loop over the examples: each example goes
into the current row; if it reaches the row's end it is cut there, and its rest continues in the
next rows (one piece per row it touches). numba compiles that loop to machine code on the first
call (``cache=True`` keeps the compiled code on disk, by default beside this file, so later
processes load it): one
pass that reads each length once and writes each output value once, where the numpy formulation
it replaced (issue 24) made many passes over fresh memory (a cumulative sum, gathers, scatters
and patches per cut). benchmarks/RESULTS.md holds the figures: against that formulation (issue
24), and ``benchmarks/packing.py``'s against TRL and a bare ``np.cumsum``.

numba loads only when wrapped packing first runs (``import packsim`` does not import it).

The loop writes where the counts before it say, with no bounds check: the total comes exact
(:func:`~packsim.core.pack_lengths.total_tokens`, refused past ``2**63 - 1``, where ``sizes.sum()``
would wrap to a negative row count and the loop would write past its buffer), and a buffer past
this machine's memory is refused before it is asked for (:func:`~packsim.core.pack_lengths.check_room`).

Lessons: none directly (notebook 01 packs with ``"wrapped"``).
"""

from __future__ import annotations

from functools import cache

import numpy as np

from packsim.core.pack_lengths import check_room, total_tokens
from packsim.core.pack_result import piece_dtype

__all__ = ["wrapped_arrays"]


def wrapped_arrays(sizes: np.ndarray, capacity: int, total: int | None = None) -> tuple[np.ndarray, ...]:
    """``(index, start, length, row_offsets)`` of the wrapped packing, views of one buffer (copies
    in the rare case they are cast down to int32 after the count).

    Args:
        sizes: the validated example lengths, int64 ``(n,)``, each at least 1.
        capacity: tokens per row, positive, at most ``2**63 - 1``.
        total: ``total_tokens(sizes)`` where the caller has it (spares a pass), else computed here.

    Raises:
        PacksimError: the lengths sum past ``2**63 - 1``, or the pieces would not fit in memory.
    """
    n = len(sizes)
    if not n:
        empty = np.zeros(0, dtype=np.int32)
        return empty, empty, empty, np.zeros(1, dtype=np.int32)
    total = total_tokens(sizes) if total is None else total  # exact: sizes.sum() wraps past 2**63 - 1
    n_rows = -(-total // capacity)
    most = n + n_rows - 1  # every cut (at tokens r * capacity, r = 1 .. n_rows - 1) inside an example
    dtype = piece_dtype(most, sizes, total)
    check_room(3 * most + n_rows + 1, np.dtype(dtype).itemsize,
               f"wrapped packing of {n} example(s) ({total} tokens) into rows of {capacity} tokens: up to {most} "
               f"pieces in {n_rows} rows", "raise capacity (the tokens per row you train with, e.g. 2048)")
    buf = np.empty(3 * most + n_rows + 1, dtype=dtype)
    index, start, length = buf[:most], buf[most : 2 * most], buf[2 * most : 3 * most]
    row_offsets = buf[3 * most :]  # (n_rows + 1,)
    k = _compiled()(sizes, capacity, index, start, length, row_offsets)
    pieces = index[:k], start[:k], length[:k], row_offsets
    if piece_dtype(k, sizes, total) != buf.dtype:  # cuts on example starts brought it under the int32 limit
        return tuple(a.astype(np.int32) for a in pieces)
    return pieces


def _fill_pieces(sizes, capacity, index, start, length, row_offsets):
    """Write the pieces of the wrapped packing of ``sizes`` into ``index``, ``start``, ``length``
    (room for every cut inside an example) and ``row_offsets`` (``(n_rows + 1,)``); return the
    number of pieces. Plain Python that numba compiles (:func:`_compiled`)."""
    k = 0  # pieces written
    row = 0  # the row being filled
    room = capacity  # tokens left in it
    row_offsets[0] = 0
    for i in range(sizes.shape[0]):
        done = 0  # tokens of example i placed so far
        left = sizes[i]
        while left > 0:
            take = min(left, room)  # the piece of example i in this row
            index[k] = i
            start[k] = done
            length[k] = take
            k += 1
            done += take
            left -= take
            room -= take
            if room == 0:  # the row is full: the next piece starts the next row
                row += 1
                row_offsets[row] = k
                room = capacity
    row_offsets[row_offsets.shape[0] - 1] = k  # the last row, full or not, ends with the last piece
    return k


@cache
def _compiled():
    """:func:`_fill_pieces` compiled by numba (imported here: only wrapped packing needs it), its
    machine code cached on disk; where numba finds no writable folder for that cache (a read-only
    install and no home folder: it raises RuntimeError), compiled in each process instead."""
    import numba

    try:
        return numba.njit(cache=True, nogil=True)(_fill_pieces)
    except RuntimeError:
        return numba.njit(nogil=True)(_fill_pieces)
