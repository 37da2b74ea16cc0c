"""Context parallelism over packed documents: how each document is split across ranks, and why it is padded.

Context parallelism (CP) splits one long packed row over ``cp`` ranks along the sequence. With
packed documents the attention stays block-diagonal, so the split has to follow the documents:

- **by document, load-balanced** (:func:`zigzag_split`): every document is cut into ``2 * cp``
  equal chunks and rank ``i`` keeps chunks ``i`` and ``2*cp - 1 - i``. Under a causal mask a
  later chunk attends to more keys than an earlier one, so pairing the first with the last gives
  every rank the same attention work. The chunks are equal only if every document's length is a
  multiple of ``2 * cp``: :func:`pad_lengths` pads each document up to one (the extra tokens are
  padding: ignored labels), and the kernels then carry both the padded and the real boundaries.
- **contiguous** (:func:`contiguous_split`): rank ``i`` takes the ``i``-th ``1/cp`` of the row. The
  last rank's queries sit late in their documents and attend to many more keys: a straggler.

A split is a list per rank of :class:`~packsim.core.pack_result.Piece` ``(index, start, stop)``:
tokens ``[start, stop)`` of document ``index``, as in a packing. :func:`causal_work` counts
attention work per rank: a query at position ``p`` of its document attends to ``p + 1`` keys
(:func:`packsim.core.tiles.score_pairs`).
:func:`dropped_tokens` counts what a kernel that assumes multiples of ``2 * cp`` (chunks of
``L // (2 * cp)`` tokens) would leave out of an unpadded document. Lengths are 1-D int sequences.

Lessons: 10.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from packsim.core.errors import PacksimError
from packsim.core.pack_result import Piece
from packsim.core.tiles import score_pairs

__all__ = ["pad_lengths", "zigzag_split", "contiguous_split", "causal_work", "dropped_tokens"]


def _check(lengths: Sequence[int], cp_size: int) -> np.ndarray:
    if not isinstance(cp_size, int) or isinstance(cp_size, bool) or cp_size < 1:
        raise PacksimError(f"cp_size must be a positive int (ranks sharing one sequence), got {cp_size!r}.")
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if lengths.size == 0 or bool((lengths <= 0).any()):
        raise PacksimError("lengths must be a non-empty list of positive document lengths.")
    return lengths


def pad_lengths(lengths: Sequence[int], cp_size: int) -> np.ndarray:
    """Each length rounded up to a multiple of ``2 * cp_size`` (int64, same shape)."""
    lengths = _check(lengths, cp_size)
    m = 2 * cp_size
    return -(-lengths // m) * m


def zigzag_split(lengths: Sequence[int], cp_size: int) -> list[list[Piece]]:
    """Per rank: chunks ``i`` and ``2*cp - 1 - i`` of every document (lengths must be multiples of 2*cp)."""
    lengths = _check(lengths, cp_size)
    m = 2 * cp_size
    bad = [int(x) for x in lengths if x % m]
    if bad:
        raise PacksimError(f"document length {bad[0]} is not a multiple of 2 x cp_size = {m}: the {m} chunks "
                           f"would differ in size; pad each document first (pad_lengths(lengths, {cp_size})).")
    ranks: list[list[Piece]] = [[] for _ in range(cp_size)]
    for doc, length in enumerate(lengths.tolist()):
        c = length // m
        for i in range(cp_size):
            ranks[i] += [Piece(doc, i * c, (i + 1) * c), Piece(doc, (m - 1 - i) * c, (m - i) * c)]
    return ranks


def contiguous_split(lengths: Sequence[int], cp_size: int) -> list[list[Piece]]:
    """Per rank: the ``i``-th contiguous ``1/cp`` of the packed row, cut at document boundaries."""
    lengths = _check(lengths, cp_size)
    starts = np.concatenate([[0], np.cumsum(lengths)])  # (D+1,) row offsets of the documents
    bounds = np.linspace(0, starts[-1], cp_size + 1).round().astype(np.int64)
    ranks: list[list[Piece]] = [[] for _ in range(cp_size)]
    for i in range(cp_size):
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        for doc in range(len(lengths)):
            a, b = max(lo, int(starts[doc])), min(hi, int(starts[doc + 1]))
            if a < b:
                ranks[i].append(Piece(doc, a - int(starts[doc]), b - int(starts[doc])))
    return ranks


def causal_work(split: list[list[Piece]]) -> np.ndarray:
    """Attention work per rank (cp,) int64: sum over its queries of the keys they attend to (p + 1)."""
    return np.array([sum(score_pairs(b) - score_pairs(a) for _, a, b in rank) for rank in split], dtype=np.int64)


def dropped_tokens(lengths: Sequence[int], cp_size: int) -> int:
    """Tokens left out if each unpadded document were cut into ``2*cp`` chunks of ``L // (2*cp)`` tokens."""
    lengths = _check(lengths, cp_size)
    return int((lengths % (2 * cp_size)).sum())
