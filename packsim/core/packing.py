"""Packing: fit variable-length examples into fixed-capacity rows (notebook 01, "why pack").

Which examples go in which row of ``capacity`` tokens, from the example lengths alone (keeping
packed examples apart is the attention mask's job, notebooks 02 on). Strategies
(:data:`STRATEGIES`): ``"wrapped"`` (concatenate and cut every ``capacity`` tokens: no padding,
examples cut in two), ``"sequential"`` (next fit in data order: neighbours stay neighbours),
``"ffd"`` / ``"bfd"`` (first- / best-fit decreasing bin packing, O(n log n) with two heaps,
:func:`_place`; at most about 11/9 of the optimal row count).

:func:`pack_arrays` computes the packs as a :class:`~packsim.core.pack_result.PackArrays`
(``"wrapped"`` in :mod:`packsim.core.pack_wrapped`);
:func:`pack` turns them into lists, one per row, of entries in row order: an ``int`` (a whole
example) or a :class:`Piece` (part of one). :func:`packsim.core.pack_stats.packing_stats` turns
packs into the numbers notebook 01 plots. The lengths may come as a list, a numpy array of any
integer dtype, a tensor or an Arrow / ``datasets`` column: :mod:`packsim.core.pack_lengths` reads
and checks them at array speed. Near the integer limits every strategy packs correctly or refuses
in one line: lengths summing past ``2**63 - 1`` (the int64 token offsets), or a packing whose
pieces would not fit in memory (``"split"`` or ``"wrapped"`` with a capacity far below the lengths).

Lessons: 01.
"""

from __future__ import annotations

from collections.abc import Sequence
from heapq import heappop, heappush

import numpy as np

from packsim.core.errors import PacksimError
from packsim.core.pack_lengths import (
    check_capacity,
    check_lengths,
    check_room,
    total_tokens,
)
from packsim.core.pack_lengths import is_int as _is_int
from packsim.core.pack_result import Entry, PackArrays, Piece, piece_dtype
from packsim.core.pack_wrapped import wrapped_arrays

__all__ = [
    "STRATEGIES",
    "OVERFLOW_POLICIES",
    "Piece",
    "Entry",
    "pack",
    "pack_arrays",
    "pack_pieces",
    "as_piece",
]

STRATEGIES = ("wrapped", "sequential", "ffd", "bfd")
OVERFLOW_POLICIES = ("error", "truncate", "split")


def pack(
    lengths: Sequence[int] | np.ndarray,
    capacity: int,
    strategy: str = "bfd",
    overflow: str = "error",
) -> list[list[Entry]]:
    """Group examples into packs of at most ``capacity`` tokens (notebook 01).

    Args:
        lengths: token count of each example, shape ``(n_examples,)``: a list or tuple of ints, a
            1-D numpy array of any integer dtype, a 1-D torch tensor, a pyarrow ``Array`` /
            ``ChunkedArray`` or a ``datasets`` column (:mod:`packsim.core.pack_lengths`); every
            length at least 1. Floats (even ``3.0``) and bools are refused. An empty list gives ``[]``.
        capacity: tokens per packed row, a positive int (e.g. 2048).
        strategy: one of :data:`STRATEGIES`:

            - ``"wrapped"``: concatenate the examples in data order and cut every ``capacity``
              tokens. Examples that straddle a cut become pieces; every pack but the last is
              exactly full. ``overflow`` does not apply (wrapped always cuts).
            - ``"sequential"``: next fit in data order: each item goes into the current pack if
              it fits, else opens a new one. Keeps data order inside and across packs.
            - ``"ffd"``: first-fit decreasing. Longest example first (ties keep data order),
              each goes into the earliest-opened pack with room, else a new pack.
            - ``"bfd"``: best-fit decreasing. Same order, each goes into the pack with the least
              room that still fits it (ties: earliest opened), else a new pack.

        overflow: what ``"ffd"``/``"bfd"`` do with an example longer than ``capacity``, one of
            :data:`OVERFLOW_POLICIES`:

            - ``"error"``: raise :class:`PacksimError` (the default: nothing is lost silently);
            - ``"truncate"``: keep ``Piece(i, 0, capacity)`` and **drop the remaining tokens**;
            - ``"split"``: cut it into ``capacity``-token chunks (the last one holds the rest) and
              pack each chunk as its own item.

    Returns:
        A list of packs, in the order they were opened. Each pack lists its entries in the order
        their tokens appear in the row: an ``int`` example index when the whole example is in
        this pack, a ``Piece(index, start, stop)`` when only its tokens ``[start, stop)`` are.
        For ``"ffd"``/``"bfd"`` the order inside a pack is the placement order, longest first.
        Use :func:`pack_pieces` to get every entry as a ``Piece``, :func:`pack_arrays` to get the
        same packs as numpy arrays (no Python object per example: faster at scale).

    Raises:
        PacksimError: on a bad capacity, strategy, overflow or length, an overlong example
            with ``overflow="error"``, lengths summing past ``2**63 - 1``, or pieces past memory.

    Example::

        >>> from packsim import pack
        >>> pack([5, 3, 4, 2], capacity=8)  # bfd: 5 then 3 fill a row; 4 and 2 share the next
        [[0, 1], [2, 3]]
        >>> pack([6, 5, 2], capacity=8, strategy="wrapped")  # cut every 8 tokens: pieces (index, start, stop)
        [[0, Piece(index=1, start=0, stop=2)], [Piece(index=1, start=2, stop=5), 2]]
    """
    return pack_arrays(lengths, capacity, strategy, overflow).to_lists()


def pack_arrays(
    lengths: Sequence[int] | np.ndarray,
    capacity: int,
    strategy: str = "bfd",
    overflow: str = "error",
) -> PackArrays:
    """The packs of :func:`pack` as numpy arrays instead of Python lists.

    Same arguments, same packs and same errors as :func:`pack`:
    ``pack_arrays(...).to_lists() == pack(...)``. The result holds, row after row, each piece's
    example ``index``, ``start`` inside the example and ``length``, and ``row_offsets``
    (``(n_rows + 1,)``: row r is pieces ``row_offsets[r]:row_offsets[r + 1]``); see
    :mod:`packsim.core.pack_result` for the shapes. They are int32 when the packing fits (at most
    ``2**31 - 1`` pieces and tokens per example), else int64; ``example_lengths`` is int64. It makes
    no Python object per example, so it is the form to use for large datasets (for ``"wrapped"``
    at a million examples, several times faster than building the lists).

    Example::

        >>> from packsim import pack_arrays
        >>> packs = pack_arrays([5, 3, 4, 2], capacity=8)
        >>> packs.index.tolist(), packs.row_offsets.tolist(), packs.to_lists()
        ([0, 1, 2, 3], [0, 2, 4], [[0, 1], [2, 3]])
    """
    capacity = check_capacity(capacity)
    _check_choice("strategy", strategy, STRATEGIES, "strategy='bfd'")
    _check_choice("overflow", overflow, OVERFLOW_POLICIES, "overflow='split'")
    sizes = check_lengths(lengths)
    total = total_tokens(sizes)  # refused past 2**63 - 1, as packable_lengths does for packing_stats
    if strategy == "wrapped":
        index, start, length, row_offsets = wrapped_arrays(sizes, capacity, total)
    else:
        index, start, stop = _items(sizes, capacity, overflow)
        length = stop - start
        if strategy == "sequential":
            row_offsets = _pack_sequential(length, capacity)
        else:
            order, row_offsets = _pack_decreasing(length, capacity, best=strategy == "bfd")
            index, start, length = index[order], start[order], length[order]
        dt = piece_dtype(len(index), sizes)
        index, start, length, row_offsets = (a.astype(dt, copy=False) for a in (index, start, length, row_offsets))
    for array in (index, start, length, row_offsets, sizes):
        array.setflags(write=False)
    return PackArrays(index, start, length, row_offsets, sizes)


def pack_pieces(
    lengths: Sequence[int] | np.ndarray,
    capacity: int,
    strategy: str = "bfd",
    overflow: str = "error",
) -> list[list[Piece]]:
    """Like :func:`pack`, but every entry is a :class:`Piece` (notebook 01).

    A whole example ``i`` becomes ``Piece(i, 0, lengths[i])``, so callers such as ``PackedBatch``
    can slice tokens without checking entry types.
    """
    return pack_arrays(lengths, capacity, strategy, overflow).to_pieces()


def as_piece(entry: Entry, lengths: Sequence[int] | np.ndarray) -> Piece:
    """Normalise one pack entry to a :class:`Piece` (notebook 01).

    Args:
        entry: an ``int`` example index (meaning the whole example) or a ``Piece``, returned as is.
        lengths: the example lengths the packs were built from, shape ``(n_examples,)``.
    """
    if isinstance(entry, Piece):
        return entry
    if not _is_int(entry):
        raise PacksimError(
            f"pack entry {entry!r} is neither an example index (int) nor a Piece; "
            "pass entries exactly as pack() returned them."
        )
    if not 0 <= entry < len(lengths):
        raise PacksimError(
            f"pack entry {entry} is not an example index: there are {len(lengths)} examples; "
            "pass the same lengths the packs were built from."
        )
    return Piece(int(entry), 0, int(lengths[entry]))


# --- validation ---------------------------------------------------------------------------------


def _check_choice(name: str, value: object, choices: tuple[str, ...], example: str) -> None:
    if value not in choices:
        raise PacksimError(
            f"{name}={value!r} is not one of {list(choices)}; pick one of those, e.g. {example}."
        )


# --- strategies ---------------------------------------------------------------------------------


def _pack_sequential(item_sizes: np.ndarray, capacity: int) -> np.ndarray:
    """Next fit in data order: a new row whenever the next item does not fit the current one.

    Returns the row offsets, shape ``(n_rows + 1,)``: row r holds items ``[offsets[r], offsets[r + 1])``.
    """
    offsets: list[int] = []
    room = 0
    for k, size in enumerate(item_sizes.tolist()):
        if size > room:
            offsets.append(k)
            room = capacity
        room -= size
    offsets.append(len(item_sizes))
    return np.asarray(offsets, dtype=np.int64)


def _items(
    sizes: np.ndarray, capacity: int, overflow: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(index, start, stop)`` arrays of the items to place, in data order, after ``overflow``."""
    too_long = np.flatnonzero(sizes > capacity)
    if overflow == "error" and too_long.size:
        i = int(too_long[0])
        raise PacksimError(
            f"example {i} has length {sizes[i]} but capacity is {capacity} "
            f"({too_long.size} example(s) are too long); raise capacity, pass "
            "overflow='truncate' (drops the extra tokens) or overflow='split' (cuts it into "
            "capacity-sized chunks), or filter out long examples before packing."
        )
    if overflow != "split":
        return np.arange(len(sizes)), np.zeros_like(sizes), np.minimum(sizes, capacity)
    chunks = -(-sizes // capacity)  # (n,) each at most its length: their sum fits int64 (check_lengths)
    n_items = int(chunks.sum())
    check_room(6 * n_items, 8, f"splitting {len(sizes)} example(s) into chunks of {capacity} tokens: {n_items} "
               "pieces", "raise capacity (the tokens per row you train with, e.g. 2048)")
    index = np.repeat(np.arange(len(sizes)), chunks)
    first_chunk = np.repeat(np.cumsum(chunks) - chunks, chunks)
    start = (np.arange(len(index)) - first_chunk) * capacity  # < the example's length
    # the rest of the example, at most capacity: start + capacity could pass 2**63 - 1 and wrap
    return index, start, start + np.minimum(sizes[index] - start, capacity)


def _pack_decreasing(item_sizes: np.ndarray, capacity: int, best: bool) -> tuple[np.ndarray, np.ndarray]:
    """Place items longest first (stable), then group them by the row :func:`_place` chose.

    Returns ``(order, row_offsets)``: the items row after row (placement order inside a row),
    shape ``(n_items,)``, and the row offsets into it, shape ``(n_rows + 1,)``.
    """
    order = np.argsort(-item_sizes, kind="stable")
    placed = np.asarray(_place(item_sizes[order].tolist(), capacity, best), dtype=np.int64)
    by_row = order[np.argsort(placed, kind="stable")]  # stable: placement order inside a row
    row_offsets = np.zeros(1 + (int(placed.max()) + 1 if placed.size else 0), dtype=np.int64)
    np.cumsum(np.bincount(placed), out=row_offsets[1:])
    return by_row, row_offsets


def _place(sizes: list[int], capacity: int, best: bool) -> list[int]:
    """Pack number of each item; ``sizes`` must be non-increasing, each at most ``capacity``.

    Because sizes only decrease, a pack with room for the current item has room for every later
    one. So open packs live in two heaps: ``ready`` (room >= current size) and ``waiting`` (room
    < current size, largest room on top); packs move from ``waiting`` to ``ready`` as sizes
    shrink. The top of ``ready`` is the answer: keyed by pack number it is the first fit, keyed
    by (room, pack number) the best fit. A pack re-enters a heap only after an item is placed in
    it, so there are O(n) heap operations: O(n log n) in all, with no scan over packs.

    Heap keys are plain ints (fast to compare): ``room * stride + pack`` (``room * 0 + pack`` for
    first fit) in ``ready`` and ``pack - room * stride`` in ``waiting``; ``key % stride`` gives
    the pack back.
    """
    stride = len(sizes) + 1  # more than the largest possible pack number
    room_weight = stride if best else 0
    room: list[int] = []
    ready: list[int] = []
    waiting: list[int] = []
    placed: list[int] = []
    for size in sizes:
        while waiting and room[waiting[0] % stride] >= size:
            p = heappop(waiting) % stride
            heappush(ready, room[p] * room_weight + p)
        if ready:
            p = heappop(ready) % stride
        else:
            p = len(room)
            room.append(capacity)
        room[p] -= size
        left = room[p]
        placed.append(p)
        if left >= size:
            heappush(ready, left * room_weight + p)
        elif left:
            heappush(waiting, p - left * stride)
    return placed
