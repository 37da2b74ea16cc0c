"""Example lengths from whatever holds them, as one validated int64 array ``(n_examples,)``.

:func:`check_lengths` is what :func:`packsim.core.packing.pack` / ``pack_arrays`` /
``pack_pieces`` and :func:`packsim.core.pack_stats.packing_stats` read their ``lengths`` with.
It takes, at array speed (no Python call per example):

- a list or tuple of ints (Python or numpy integers) and any other sequence (``range``, a
  ``datasets`` column): one C-level pass over the element types (``set(map(type, values))``,
  which is how a ``True`` among ints is told apart from a 1: ``np.asarray([3, True])`` is an
  int64 array), then ``np.fromiter``;
- a 1-D numpy array of any integer dtype: bounds by ``max`` (uint64 past ``2**63 - 1``);
- a 1-D torch tensor (on any device), a pyarrow ``Array`` / ``ChunkedArray`` and anything else
  numpy reads through ``__array__`` (a pandas ``Series``): converted to numpy once, then as above.

Only what is not all integers (floats, bools, strings, nested lists, object arrays holding
other things) walks the values one by one, to name the first bad example in one line. Floats
are refused even when integral (``3.0``), as are bools (``np.bool_`` too) and numpy bool arrays.
Lengths must also be at least 1 and at most ``2**63 - 1`` (packsim's offsets are int64). For the
packers, :func:`total_tokens` is their exact sum, refused past ``2**63 - 1`` (the packed tokens'
offsets are int64), and :func:`check_room` refuses, before it is allocated, a packing whose arrays
would not fit this machine's memory (a capacity far below the lengths: billions of pieces).
:func:`packable_lengths` is both checks at once (what the packers and the statistics take), and
:func:`check_capacity` the row length they pack into.

Lessons: none directly.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import numpy as np

from packsim.core.errors import PacksimError

__all__ = ["check_capacity", "check_lengths", "check_room", "is_int", "packable_lengths", "total_tokens"]

_INT64_MAX = 2**63 - 1
# element types whose values np.fromiter(..., np.int64) takes exactly (uint64 may not fit: checked one by one)
_FAST_TYPES = frozenset({int} | {np.dtype(c).type for c in "bhilqBHI"})


def is_int(value: object) -> bool:
    """True for Python and numpy integers, False for bools (which Python counts as ints)."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


_one_int = is_int  # one value (the capacity), never per example: the per-element tests patch is_int


def check_lengths(lengths: object) -> np.ndarray:
    """Validate example lengths and return them as a new int64 array of shape ``(n_examples,)``.

    Raises :class:`PacksimError` (one line: the example, its value, the fix) for input that is not
    a 1-D collection of integers, or a length below 1 or above ``2**63 - 1``. Their sum is not
    checked here: the packers check it (:func:`total_tokens`).
    """
    sizes = _as_int64(_as_values(lengths))
    if sizes.size and sizes.min() <= 0:  # one pass, no temporary array, in the common case
        i = int(np.argmax(sizes <= 0))
        raise _bad_length(i, int(sizes[i]))
    return sizes


def total_tokens(sizes: np.ndarray) -> int:
    """The exact sum of validated lengths (int64 ``(n,)``, each 1 .. ``2**63 - 1``) as a Python int.

    ``sizes.sum()`` wraps silently past ``2**63 - 1`` (``3 * 2**62`` sums to ``-2**62``); where
    ``n * max`` could pass it, the sum is taken exactly (high and low 32 bits apart, in uint64)
    and a total past ``2**63 - 1`` raises :class:`PacksimError`: every packer's token offsets,
    ``row_lengths`` and ``packing_stats`` sum in int64.
    """
    if not sizes.size:
        return 0
    if int(sizes.max()) <= _INT64_MAX // sizes.size:  # n times the longest fits: so does the sum
        return int(sizes.sum())
    high = int((sizes >> 32).sum(dtype=np.uint64))  # each < 2**31: exact below 2**33 examples
    low = int((sizes & 0xFFFFFFFF).sum(dtype=np.uint64))  # each < 2**32: exact below 2**32 examples
    total = (high << 32) + low
    if total > _INT64_MAX:
        raise PacksimError(
            f"the {sizes.size} lengths sum to {total} tokens, past 2**63 - 1, the most packsim's int64 "
            "token offsets hold; pack the examples in shards of fewer tokens, and check the lengths are "
            "token counts (e.g. [len(ids) for ids in tokenized])."
        )
    return total


def check_capacity(capacity: object) -> int:
    """``capacity`` (tokens per packed row) as a positive int at most ``2**63 - 1``, or a one-line error."""
    if not _one_int(capacity) or capacity <= 0:
        raise PacksimError(
            f"capacity must be a positive int (tokens per packed row), got {capacity!r}; "
            "pass e.g. capacity=2048 (use int(...) if you computed it as a float)."
        )
    if capacity > _INT64_MAX:  # lengths and offsets are int64: no row can use more
        raise PacksimError(
            f"capacity {capacity} is past 2**63 - 1, the most tokens packsim's int64 offsets hold; "
            "pass the row length you train with (e.g. capacity=2048)."
        )
    return int(capacity)


def packable_lengths(lengths: object) -> np.ndarray:
    """The lengths as every packer and ``packing_stats`` take them, int64 ``(n_examples,)``: read and
    checked (:func:`~packsim.core.pack_lengths.check_lengths`), and their sum at most ``2**63 - 1``
    (:func:`~packsim.core.pack_lengths.total_tokens`): the packed tokens' offsets (``np.cumsum(length)``,
    ``PackArrays.row_lengths``, the wrapped cuts) and the statistics' totals are int64 and would wrap."""
    sizes = check_lengths(lengths)
    total_tokens(sizes)
    return sizes


def check_room(n_values: int, itemsize: int, what: str, fix: str) -> None:
    """Refuse arrays of ``n_values`` values of ``itemsize`` bytes past this machine's memory.

    Asked before allocating: numpy refuses past ``2**63 - 1`` bytes with a bare ``ValueError``, and
    below that an allocation larger than memory either fails (``MemoryError``) or, where the kernel
    overcommits, is granted and the process is killed as the packer writes it. ``what`` names the
    arrays (e.g. "the 2**63 pieces of ..."), ``fix`` says what to change.
    """
    needed = n_values * itemsize
    if needed > _memory_bytes():
        raise PacksimError(f"{what} would take {needed} bytes of arrays, more than this machine's "
                           f"memory ({_memory_bytes()} bytes); {fix}.")


def _as_values(lengths: object) -> np.ndarray | Sequence:
    """``lengths`` as a numpy array or a sequence: tensors, Arrow and ``datasets`` columns converted."""
    if isinstance(lengths, np.ndarray):
        return lengths
    torch = sys.modules.get("torch")  # a tensor exists only if torch is imported: never import it here
    if torch is not None and isinstance(lengths, torch.Tensor):
        tensor = lengths.detach()
        if tensor.ndim != 1:
            raise _not_1d(tuple(tensor.shape))
        try:
            return tensor.cpu().numpy()
        except TypeError:  # a dtype numpy lacks (bfloat16): its values, refused one by one
            return tensor.tolist()
    pa = sys.modules.get("pyarrow")
    if pa is not None and isinstance(lengths, pa.Array | pa.ChunkedArray):
        if lengths.null_count:
            i = int(np.argmax(np.asarray(lengths.is_null())))
            raise PacksimError(
                f"example {i} has no length (a null in the Arrow column); "
                "drop or fill the missing lengths before packing."
            )
        return np.asarray(lengths)
    if isinstance(lengths, Sequence) and not isinstance(lengths, str | bytes):
        if isinstance(lengths, list | tuple):
            return lengths
        return _column_values(lengths)
    if hasattr(lengths, "__array__") and not isinstance(lengths, np.generic):  # not a numpy scalar
        return np.asarray(lengths)
    raise PacksimError(
        f"lengths must be a list, tuple or 1-D numpy array of ints, got {type(lengths).__name__}; "
        "pass e.g. [len(ids) for ids in tokenized]."
    )


def _column_values(column: Sequence) -> np.ndarray | Sequence:
    """A sequence other than a list or tuple, as an array or a list.

    A ``datasets`` column (``dataset["length"]``) reads each row through the dataset's formatter
    when iterated; its whole Arrow column is one slice away (``with_format("arrow")``), with the
    same values as any format but a custom transform (``set_transform``), which is read as
    ``column[:]``. Any other sequence (``range``, a user's class) is read once into a list.
    """
    source, name = getattr(column, "source", None), getattr(column, "column_name", None)
    if type(column).__module__.startswith("datasets") and hasattr(source, "with_format"):
        if source.format.get("type") != "custom":
            return _as_values(source.with_format("arrow")[name])
        return _as_values(column[:])
    return list(column)


def _as_int64(values: np.ndarray | Sequence) -> np.ndarray:
    """An int64 copy of ``values`` (an array or a sequence), or the error naming the first bad example."""
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise _not_1d(values.shape)
        if values.dtype.kind == "u" and values.itemsize == 8 and values.size and values.max() > _INT64_MAX:
            i = int(np.argmax((values == 0) | (values > _INT64_MAX)))  # the first bad example, whichever kind
            raise _bad_length(i, int(values[i]))
        if values.dtype.kind in "iu":
            return values.astype(np.int64)
        values = values.tolist()  # bools, floats, objects, strings: named one by one below
    if set(map(type, values)) <= _FAST_TYPES:  # no Python call per element; a bool would show here
        try:
            return np.fromiter(values, dtype=np.int64, count=len(values))
        except OverflowError:  # a Python int past int64
            raise _first_out_of_range(values) from None
    _check_each(values)
    try:
        return np.asarray(values, dtype=np.int64)
    except OverflowError:  # a Python (or numpy uint64) int past int64
        raise _first_out_of_range(values) from None


def _memory_bytes() -> int:
    """Physical memory in bytes, or ``2**63 - 1`` (numpy's own limit) where the system does not say."""
    try:
        return min(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), _INT64_MAX)
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows), or the name unknown
        return _INT64_MAX


def _check_each(values: Sequence) -> None:
    """The per-element check, for values that are not all plain integers: the first non-integer."""
    for i, n in enumerate(values):
        if not is_int(n):
            raise PacksimError(
                f"example {i} has length {n!r} ({type(n).__name__}), not an integer; "
                "lengths are token counts: pass ints (e.g. int(n), or lengths.astype(int))."
            )


def _first_out_of_range(values: Sequence) -> PacksimError:
    """The error for the first integer of ``values`` below 1 or above ``2**63 - 1``."""
    i, n = next((i, int(n)) for i, n in enumerate(values) if not 0 < n <= _INT64_MAX)
    return _bad_length(i, n)


def _bad_length(i: int, n: int) -> PacksimError:
    if n > _INT64_MAX:
        return PacksimError(
            f"example {i} has length {n}, past 2**63 - 1, the most tokens packsim's int64 offsets hold; "
            "lengths are token counts: pass the real ones (e.g. [len(ids) for ids in tokenized])."
        )
    return PacksimError(
        f"example {i} has length {n}: every example needs at least 1 token; "
        "drop empty examples before packing."
    )


def _not_1d(shape: tuple) -> PacksimError:
    return PacksimError(
        f"lengths must be 1-D (one length per example), got shape {shape}; "
        "pass a flat list or lengths.ravel()."
    )
