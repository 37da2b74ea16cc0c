"""Packing: fit variable-length examples into fixed-capacity rows (notebook 01, "why pack").

Fine-tuning data is a list of examples of very different lengths. Giving each example its own row
and padding it wastes most of the compute on padding tokens. Packing puts several examples in one
row of ``capacity`` tokens instead. This module answers *which examples go in which row*; it only
needs the example lengths. (Making the packed examples not see each other is the job of the
attention mask, notebooks 02 onwards.)

Four strategies, each a teaching point of notebook 01:

- ``"wrapped"``: concatenate everything and cut every ``capacity`` tokens. No padding at all, but
  examples are cut in two at row boundaries.
- ``"sequential"`` (next fit): take examples in data order and start a new row when the next one
  does not fit. Examples stay whole and neighbours in the data stay neighbours in the row (the
  experiment's "related examples side by side" design relies on it); fill is worse.
- ``"ffd"`` (first-fit decreasing) and ``"bfd"`` (best-fit decreasing): classic bin packing. Take
  the examples longest first and put each in an existing row that still has room (the first such
  row, or the fullest such row), opening a new row only when none has. Examples stay whole, and the
  row count is provably at most about 11/9 of the best possible (on real length distributions
  it is usually within a row or two of the lower bound ``ceil(total_tokens / capacity)``).

Both decreasing strategies run in O(n log n) with two heaps (see :func:`_place`); ``"wrapped"``
and the overflow policies are numpy array operations with no loop over examples (see
:func:`_pack_wrapped`). What remains is building the Python lists and Pieces the packs are made
of, so a million examples pack in well under a second (``benchmarks/packing.py`` measures it
against TRL's ``pack_dataset``).

A pack is a list of entries in the order their tokens appear in the row. An entry is a plain
``int`` (the example index) when the whole example is in that pack, and a :class:`Piece` when
only some of its tokens are. :func:`packsim.core.pack_stats.packing_stats` turns packs into the numbers notebook 01 plots.

Lessons: 01.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from heapq import heappop, heappush
from itertools import pairwise, repeat
from typing import NamedTuple

import numpy as np

from packsim.core.errors import PacksimError

__all__ = [
    "STRATEGIES",
    "OVERFLOW_POLICIES",
    "Piece",
    "Entry",
    "pack",
    "pack_pieces",
    "as_piece",
]

STRATEGIES = ("wrapped", "sequential", "ffd", "bfd")
OVERFLOW_POLICIES = ("error", "truncate", "split")


class Piece(NamedTuple):
    """Tokens ``[start, stop)`` of example ``index`` (a part of it, or all of it).

    Notebook 01 meets pieces where an example is cut: by ``"wrapped"`` packing or by the
    ``"truncate"`` and ``"split"`` overflow policies.
    """

    index: int
    start: int
    stop: int


Entry = int | Piece
"""One entry of a pack: an example index (whole example) or a :class:`Piece` (part of one)."""


def pack(
    lengths: Sequence[int] | np.ndarray,
    capacity: int,
    strategy: str = "bfd",
    overflow: str = "error",
) -> list[list[Entry]]:
    """Group examples into packs of at most ``capacity`` tokens (notebook 01).

    Args:
        lengths: token count of each example, shape ``(n_examples,)``: a list, tuple or 1-D
            integer numpy array; every length at least 1. An empty list gives ``[]``.
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
        Use :func:`pack_pieces` to get every entry as a ``Piece``.

    Raises:
        PacksimError: on a bad capacity, strategy, overflow or length, or an overlong example
            with ``overflow="error"``.
    """
    capacity = _check_capacity(capacity)
    _check_choice("strategy", strategy, STRATEGIES, "strategy='bfd'")
    _check_choice("overflow", overflow, OVERFLOW_POLICIES, "overflow='split'")
    sizes = _check_lengths(lengths)
    # The packs are up to millions of small lists and Pieces, none in a reference cycle; with the
    # cyclic garbage collector running, every 700 new containers start a collection that walks
    # ever more of them (1M lengths at capacity 512: about 4x slower). Pause it, then restore it.
    collecting = gc.isenabled()
    gc.disable()
    try:
        if strategy == "wrapped":
            return _pack_wrapped(sizes, capacity)
        index, start, stop = _items(sizes, capacity, overflow)
        entries = _entries(index, start, stop, sizes)
        if strategy == "sequential":
            return _pack_sequential(entries, stop - start, capacity)
        return _pack_decreasing(entries, stop - start, capacity, best=strategy == "bfd")
    finally:
        if collecting:
            gc.enable()


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
    packs = pack(lengths, capacity, strategy, overflow)
    sizes = _check_lengths(lengths).tolist()
    return [[e if isinstance(e, Piece) else Piece(e, 0, sizes[e]) for e in p] for p in packs]


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


def _is_int(value: object) -> bool:
    """True for Python and numpy integers, False for bools (which Python counts as ints)."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _check_capacity(capacity: object) -> int:
    if not _is_int(capacity) or capacity <= 0:
        raise PacksimError(
            f"capacity must be a positive int (tokens per packed row), got {capacity!r}; "
            "pass e.g. capacity=2048 (use int(...) if you computed it as a float)."
        )
    return int(capacity)


def _check_choice(name: str, value: object, choices: tuple[str, ...], example: str) -> None:
    if value not in choices:
        raise PacksimError(
            f"{name}={value!r} is not one of {list(choices)}; pick one of those, e.g. {example}."
        )


def _check_lengths(lengths: object) -> np.ndarray:
    """Validate example lengths and return them as an int64 array of shape ``(n_examples,)``."""
    sizes = _as_int_array(lengths)
    bad = np.flatnonzero(sizes <= 0)
    if bad.size:
        i = int(bad[0])
        raise PacksimError(
            f"example {i} has length {sizes[i]}: every example needs at least 1 token; "
            "drop empty examples before packing."
        )
    return sizes


def _as_int_array(lengths: object) -> np.ndarray:
    if isinstance(lengths, np.ndarray):
        if lengths.ndim != 1:
            raise PacksimError(
                f"lengths must be 1-D (one length per example), got shape {lengths.shape}; "
                "pass a flat list or lengths.ravel()."
            )
        if lengths.dtype.kind in "iu":
            return lengths.astype(np.int64)
        values = lengths.tolist()
    elif isinstance(lengths, Sequence) and not isinstance(lengths, str | bytes):
        values = lengths
    else:
        raise PacksimError(
            f"lengths must be a list, tuple or 1-D numpy array of ints, got {type(lengths).__name__}; "
            "pass e.g. [len(ids) for ids in tokenized]."
        )
    for i, n in enumerate(values):
        if not _is_int(n):
            raise PacksimError(
                f"example {i} has length {n!r} ({type(n).__name__}), not an integer; "
                "lengths are token counts: pass ints (e.g. int(n), or lengths.astype(int))."
            )
    return np.asarray(values, dtype=np.int64)


# --- strategies ---------------------------------------------------------------------------------


def _pack_wrapped(sizes: np.ndarray, capacity: int) -> list[list[Entry]]:
    """Concatenate in data order and cut every ``capacity`` tokens (examples may straddle cuts).

    In numpy, no loop over examples: every cut that falls inside an example is inserted into the
    list of example starts, which gives the items (whole examples and pieces) in token order; a
    pack is then a run of consecutive items, starting at the item that starts at its cut.
    """
    n = len(sizes)
    if not n:
        return []
    bounds = np.zeros(n + 1, dtype=np.int64)  # (n + 1,) token offset where each example starts
    np.cumsum(sizes, out=bounds[1:])
    total = int(bounds[-1])
    cuts = np.arange(capacity, total, capacity)  # (n_packs - 1,) where rows 1, 2, ... start
    after = np.searchsorted(bounds, cuts)  # first example starting at or after each cut
    inside = bounds[after] != cuts  # the cut splits example after - 1
    cut_at = after[inside]  # (k,) insert before these example positions
    index = np.insert(np.arange(n), cut_at, cut_at - 1)  # (n + k,) example of each item
    item_start = np.insert(bounds, cut_at, cuts[inside])  # (n + k + 1,) token offsets, total last
    # the item at each cut, whether inserted or an example start, sits after the earlier insertions
    pack_start = [0, *(after + np.cumsum(inside) - inside).tolist(), len(index)]
    inserted = cut_at + np.arange(len(cut_at))  # (k,) positions of the inserted items
    is_piece = np.zeros(len(index), dtype=bool)  # every item of a cut example: each inserted
    is_piece[inserted] = is_piece[inserted - 1] = True  # item and the item before it
    piece_at = np.flatnonzero(is_piece)
    base = bounds[index[piece_at]]
    entries = _entry_array(index, piece_at, item_start[piece_at] - base, item_start[piece_at + 1] - base)
    return _split(entries.tolist(), pack_start)


def _pack_sequential(entries: np.ndarray, item_sizes: np.ndarray, capacity: int) -> list[list[Entry]]:
    """Next fit in data order: a new pack whenever the next item does not fit the current one."""
    packs: list[list[Entry]] = []
    room = 0
    for entry, size in zip(entries.tolist(), item_sizes.tolist(), strict=True):
        if size > room:
            packs.append([])
            room = capacity
        packs[-1].append(entry)
        room -= size
    return packs


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
    chunks = -(-sizes // capacity)
    index = np.repeat(np.arange(len(sizes)), chunks)
    first_chunk = np.repeat(np.cumsum(chunks) - chunks, chunks)
    start = (np.arange(len(index)) - first_chunk) * capacity
    return index, start, np.minimum(start + capacity, sizes[index])


def _entries(index: np.ndarray, start: np.ndarray, stop: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """One pack entry per item, shape ``(n_items,)`` (object): the example index if the item is
    the whole example, else a Piece."""
    piece_at = np.flatnonzero((start > 0) | (stop < sizes[index]))
    return _entry_array(index, piece_at, start[piece_at], stop[piece_at])


def _entry_array(
    index: np.ndarray, piece_at: np.ndarray, start: np.ndarray, stop: np.ndarray
) -> np.ndarray:
    """Entries as an object array, shape ``(n_items,)``: Python ints, and at ``piece_at`` (k,)
    ``Piece(index, start, stop)``. The pieces are made in one C-level pass (``tuple.__new__``
    on each ``(index, start, stop)`` tuple), not by calling ``Piece(...)`` (a Python function)
    once each: about half the time per piece."""
    entries = index.astype(object)  # Python ints
    if piece_at.size:
        fields = zip(entries[piece_at].tolist(), start.tolist(), stop.tolist(), strict=True)
        pieces = map(tuple.__new__, repeat(Piece), fields)
        entries[piece_at] = np.fromiter(pieces, dtype=object, count=piece_at.size)
    return entries


def _split(flat: list[Entry], bounds: Sequence[int]) -> list[list[Entry]]:
    """``flat[bounds[p]:bounds[p + 1]]`` for each pack ``p``."""
    return [flat[a:b] for a, b in pairwise(bounds)]


def _pack_decreasing(
    entries: np.ndarray, item_sizes: np.ndarray, capacity: int, best: bool
) -> list[list[Entry]]:
    """Place items longest first (stable), then group entries by the pack :func:`_place` chose."""
    order = np.argsort(-item_sizes, kind="stable")
    placed = np.asarray(_place(item_sizes[order].tolist(), capacity, best), dtype=np.int64)
    by_pack = order[np.argsort(placed, kind="stable")]  # stable: placement order inside a pack
    return _split(entries[by_pack].tolist(), [0, *np.cumsum(np.bincount(placed)).tolist()])


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
