"""Laying packed pieces out in (B, T) rows from the packing arrays, with no Python object per piece.

:meth:`packsim.core.batch.PackedBatch.from_examples` packs with
:func:`packsim.core.packing.pack_arrays` and calls :func:`layout`: every tensor of the batch comes
from a few whole-array gathers over the pieces (example, start, length, row offsets) and the
examples' tokens concatenated once. The batch's ``segments`` are a :class:`Segments`, a sequence
over the same arrays that makes a :class:`~packsim.core.segments.Segment` only when one is read.

**The position convention** (one rule, :func:`piece_positions`, used by ``from_examples``,
``to_flattening``, ``from_flattening`` and :class:`~packsim.core.collator.PackingCollator`):
position ids count from 0 at the start of every *piece*, a run of one example's tokens in one row.
A whole example is one piece; an example cut by ``"wrapped"`` packing or ``overflow="split"``
is several, and each restarts at 0, as TRL's ``bfd_split`` does (lengths ``[9, 3]``, capacity 4,
``bfd``: ``[0,1,2,3 | 0,1,2,3 | 0,1,2,0]``, not the example's offsets ``[0,1,2,3 | 4,5,6,7 |
0,1,2,8]``). A piece cannot attend to the rest of its example (another row, or another sequence
once flattened), and position ids are how transformers finds the sequences: sdpa / eager / flex
start one wherever a position does not continue by +1 (``find_packed_sequence_indices``), the
flash path only where it equals the minimum, 0 (``prepare_fa_kwargs_from_position_ids``). A 0
continues nothing, so under this rule both readers find exactly the pieces in any row and in any
concatenation of rows; continued offsets would merge ``0,1,2,3`` and ``4,5,6,7`` of two rows
into one sequence once flattened (of two different examples, with ``bfd``), and flash would read
``[0,1,2,8]`` as one sequence. The cost: a model with absolute position embeddings (GPT-2)
reads a later piece at positions 0.. instead of its offset in the example; under RoPE only
differences of positions count, so the logits are the same.

Lessons: none directly.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch

from packsim.core.loss import Role
from packsim.core.pack_result import PackArrays
from packsim.core.segments import Segment

__all__ = ["Segments", "layout", "piece_positions"]


class Segments(Sequence):
    """The pieces of a batch in row-major order as a read-only sequence of :class:`Segment`.

    Backed by four ``(S,)`` int64 arrays (``row``, ``start``, ``stop`` in the row, ``example``);
    indexing and iteration make ``Segment`` tuples on demand. Equal to any sequence of the same
    segments (a list of ``Segment`` included).
    """

    def __init__(self, row: np.ndarray, start: np.ndarray, stop: np.ndarray, example: np.ndarray):
        self._cols = (row, start, stop, example)

    def __len__(self) -> int:
        return len(self._cols[0])

    def lengths(self) -> np.ndarray:
        """Tokens in each segment, ``(S,)`` int64."""
        return self._cols[2] - self._cols[1]

    def __getitem__(self, k):
        if isinstance(k, slice):
            return list(self)[k]
        return Segment(*(int(c[k]) for c in self._cols))  # numpy raises IndexError past the end

    def __iter__(self) -> Iterator[Segment]:
        return (Segment(*fields) for fields in zip(*(c.tolist() for c in self._cols), strict=True))

    def __eq__(self, other) -> bool:
        if isinstance(other, Segments):
            return all(np.array_equal(a, b) for a, b in zip(self._cols, other._cols, strict=True))
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None

    def __repr__(self) -> str:
        if len(self) <= 12:  # a lesson's batch: show them all
            return f"Segments({list(self)!r})"
        return f"Segments({len(self)} pieces: {self[0]!r}, ..., {self[-1]!r})"


def piece_positions(lengths) -> torch.Tensor:
    """Position ids under packsim's convention (module docstring): ``(P,)`` piece lengths, in the
    order their tokens come, -> ``(sum(lengths),)`` long, counting from 0 in every piece.

    ``[4, 4, 3, 1]`` -> ``[0,1,2,3, 0,1,2,3, 0,1,2, 0]``. Takes a list, numpy array or tensor
    (a tensor's device is kept); every length must be positive (an empty piece is no piece).
    """
    lengths = torch.as_tensor(lengths).reshape(-1).long()  # (P,)
    before = torch.zeros(lengths.numel(), dtype=torch.long, device=lengths.device)  # (P,) tokens before each
    torch.cumsum(lengths[:-1], 0, out=before[1:])
    N = int(lengths.sum())
    starts = torch.repeat_interleave(before, lengths, output_size=N)  # (N,) where each token's piece starts
    return torch.arange(N, device=lengths.device) - starts


def layout(tokens: torch.Tensor, n_prompt: np.ndarray, arrays: PackArrays, T: int, packed: bool, pad_id: int):
    """The (B, T) tensors of a batch and its :class:`Segments`, from the packing arrays.

    Args:
        tokens: every example's tokens concatenated in example order, ``(sum(lengths),)`` long.
        n_prompt: prompt tokens of each example, ``(n_examples,)``.
        arrays: the packs of the example lengths (``arrays.example_lengths``).
        T: tokens per row. packed: False for one piece per row (the ``padded`` layout), pieces
            then in example order.
        pad_id: the token id of padding.

    Returns:
        ``(input_ids, seq_ids, roles, example_positions, segments)``: ids and seq ids ``-1`` on
        padding, roles as :class:`Role` values, position ids of the convention (0.. in every piece:
        :func:`piece_positions`; padding runs count 0.. on their own).
    """
    # writable int64 copies: torch.from_numpy warns on the read-only arrays of PackArrays (int32 or int64)
    index, start, length = (a.astype(np.int64) for a in (arrays.index, arrays.start, arrays.length))  # (P,) each
    row_offsets = arrays.row_offsets
    if not packed:  # one piece per row, in example order
        order = np.lexsort((start, index))
        index, start, length = index[order], start[order], length[order]
        row_offsets = np.arange(len(index) + 1)
    B, P = len(row_offsets) - 1, len(index)
    lengths = arrays.example_lengths.copy()
    ex_off = np.zeros(len(lengths) + 1, dtype=np.int64)  # (n + 1,) where each example's tokens begin
    np.cumsum(lengths, out=ex_off[1:])
    before = np.zeros(P + 1, dtype=np.int64)  # (P + 1,) real tokens before each piece, row-major
    np.cumsum(length, out=before[1:])
    row = np.repeat(np.arange(B), np.diff(row_offsets))  # (P,) row of each piece
    col = before[:-1] - before[row_offsets[:-1]][row]  # (P,) column where each piece starts
    piece = torch.repeat_interleave(torch.arange(P), torch.from_numpy(length))  # (N,) piece of each token
    within = piece_positions(length)  # (N,) offset in its piece: the position ids (the convention)
    example = torch.from_numpy(index)[piece]  # (N,)
    pos = torch.from_numpy(start)[piece] + within  # (N,) offset in its example: which token, which role
    dst = torch.from_numpy(row * T + col)[piece] + within  # (N,) flat (B*T) place of each token
    ids = torch.full((B * T,), pad_id, dtype=torch.long)
    ids[dst] = tokens[torch.from_numpy(ex_off[:-1])[example] + pos]
    seq = torch.full((B * T,), -1, dtype=torch.long)
    seq[dst] = example
    # padding runs: positions 0.. from the end of each row's tokens
    row_len = torch.from_numpy(before[row_offsets[1:]] - before[row_offsets[:-1]])  # (B,)
    cols = torch.arange(T).expand(B, T)
    reset_pos = (cols - row_len[:, None]).clamp_min(0).reshape(-1)  # (B*T,) real tokens set below
    reset_pos[dst] = within
    last = torch.from_numpy(lengths)[example] - 1
    role = torch.where(pos < torch.from_numpy(n_prompt)[example], int(Role.PROMPT),
                       torch.where(pos == last, int(Role.EOS), int(Role.RESPONSE)))
    firsts = torch.from_numpy(before[:-1])  # (P,) each piece's first token in the real-token order
    role[firsts] = torch.where(torch.from_numpy(col) == 0, int(Role.FIRST), int(Role.BOUNDARY))
    roles = torch.full((B * T,), int(Role.PAD), dtype=torch.uint8)
    roles[dst] = role.to(torch.uint8)
    segments = Segments(row, col, col + length, index)
    shape = (B, T)
    return ids.view(shape), seq.view(shape), roles.view(shape), reset_pos.view(shape), segments
