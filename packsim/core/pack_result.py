"""The columnar packing result: which tokens of which example go in which row, as numpy arrays.

:func:`packsim.core.packing.pack_arrays` returns a :class:`PackArrays` (``pack`` is
``pack_arrays(...).to_lists()``): pieces (runs of tokens of one example) row after row::

    index        (n_pieces,)     int32  example each piece comes from
    start        (n_pieces,)     int32  first token of the piece inside its example
    length       (n_pieces,)     int32  tokens in the piece (>= 1)
    row_offsets  (n_rows + 1,)   int32  row r holds pieces row_offsets[r]:row_offsets[r + 1]
    example_lengths (n_examples,) int64 the lengths that were packed

The four piece arrays are int32 when ``n_pieces`` and every example length are at most
``2**31 - 1`` (then so is every value in them), int64 otherwise: half the bytes to write and
read in the common case. Mind the sum of many of them: ``length.sum()`` and ``np.cumsum(length)``
accumulate in int64 (numpy's default for int32), but ``start + length`` and other elementwise
arithmetic stay int32 (within one example, so they fit). ``to_lists()`` and ``to_pieces()`` give
Python ints either way.

Arrays, not lists of ints and :class:`Piece` objects: a data loader slices tokens with ``start``
and ``length`` and cuts rows with ``row_offsets`` (as TRL's ``pack_dataset`` does with its Arrow
offsets), and a million examples would be millions of Python objects (``benchmarks/packing.py``).

Lessons: none directly.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from itertools import pairwise, repeat
from typing import NamedTuple

import numpy as np

__all__ = ["Entry", "PackArrays", "Piece", "piece_dtype"]

_INT32_MAX = 2**31 - 1  # the piece arrays are int32 up to this (see piece_dtype), else int64


def piece_dtype(n_pieces: int, sizes: np.ndarray, total: int | None = None) -> type:
    """The dtype of a packing's piece arrays and row offsets: int32 if ``n_pieces`` and every
    example length (``sizes``; ``total``, their sum, if known, spares a pass) are at most
    ``2**31 - 1`` (so is then every index, offset, start and length), else int64."""
    if n_pieces > _INT32_MAX:
        return np.int64
    if total is not None and total <= _INT32_MAX:  # no example is longer than all of them
        return np.int32
    return np.int32 if not sizes.size or int(sizes.max()) <= _INT32_MAX else np.int64


class Piece(NamedTuple):
    """Tokens ``[start, stop)`` of example ``index`` (a part of it, or all of it).

    Notebook 01 meets pieces where an example is cut: by ``"wrapped"`` packing or by the
    ``"truncate"`` and ``"split"`` overflow policies. ``start`` says which tokens, not their
    position ids: in a batch every piece counts from 0
    (:func:`packsim.core.batch_layout.piece_positions`).
    """

    index: int
    start: int
    stop: int


Entry = int | Piece
"""One entry of a pack: an example index (whole example) or a :class:`Piece` (part of one)."""


@dataclass(frozen=True, eq=False)
class PackArrays:
    """A packing as arrays (shapes and dtypes in the module docstring); build it with ``pack_arrays``.

    ``to_lists()`` gives what :func:`packsim.core.packing.pack` returns, ``to_pieces()`` what
    :func:`packsim.core.packing.pack_pieces` returns. The arrays are read-only.
    """

    index: np.ndarray  # (n_pieces,)
    start: np.ndarray  # (n_pieces,)
    length: np.ndarray  # (n_pieces,)
    row_offsets: np.ndarray  # (n_rows + 1,)
    example_lengths: np.ndarray  # (n_examples,)

    @property
    def n_rows(self) -> int:
        return len(self.row_offsets) - 1

    @property
    def n_pieces(self) -> int:
        return len(self.index)

    def row_lengths(self) -> np.ndarray:
        """Tokens in each row, shape ``(n_rows,)``."""
        ends = np.zeros(self.n_pieces + 1, dtype=np.int64)  # (n_pieces + 1,) tokens before each piece
        np.cumsum(self.length, out=ends[1:])
        return ends[self.row_offsets[1:]] - ends[self.row_offsets[:-1]]

    def whole(self) -> np.ndarray:
        """True where the piece is its whole example, shape ``(n_pieces,)``."""
        return self.length == self.example_lengths[self.index]  # a piece never runs past its example

    def to_lists(self) -> list[list[Entry]]:
        """The packs as :func:`packsim.core.packing.pack` returns them: per row, a list of entries,
        an ``int`` example index for a whole example, else ``Piece(index, start, stop)``."""
        return self._rows(~self.whole())

    def to_pieces(self) -> list[list[Piece]]:
        """The packs with every entry a ``Piece`` (whole examples too), as ``pack_pieces`` returns them."""
        return self._rows(np.ones(self.n_pieces, dtype=bool))

    def _rows(self, as_piece: np.ndarray) -> list[list]:
        """Per row, the pieces as Python entries: ``Piece`` where ``as_piece`` (n_pieces,), else int.

        The rows are up to millions of small lists and Pieces, none in a reference cycle; with the
        cyclic garbage collector running, every 700 new containers start a collection that walks
        ever more of them (benchmarks/RESULTS.md has the slowdown measured). It is paused meanwhile.
        The Pieces are made in one C-level pass (``tuple.__new__`` on each ``(index, start,
        stop)`` tuple), not by calling ``Piece(...)`` (a Python function) once each: about half
        the time per piece.
        """
        collecting = gc.isenabled()
        gc.disable()
        try:
            entries = self.index.astype(object)  # (n_pieces,) Python ints
            at = np.flatnonzero(as_piece)
            if at.size:
                starts = self.start[at]
                fields = zip(entries[at].tolist(), starts.tolist(), (starts + self.length[at]).tolist(),
                             strict=True)
                pieces = map(tuple.__new__, repeat(Piece), fields)
                entries[at] = np.fromiter(pieces, dtype=object, count=at.size)
            flat = entries.tolist()
            return [flat[a:b] for a, b in pairwise(self.row_offsets.tolist())]
        finally:
            if collecting:
                gc.enable()
