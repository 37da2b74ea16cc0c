"""Where the examples of a batch are: seq ids, ``cu_seqlens`` and position ids.

A *pack* is one row holding several examples back to back; three equivalent ways to say where:

- ``seq_ids``      (T,) or (B, T) long: the example of each token, e.g. ``[0, 0, 0, 1, 1, 2, -1]``
  (each example one consecutive run, ``-1`` padding);
- ``cu_seqlens``   (S+1,) int32: where each example starts, plus the total, e.g. ``[0, 3, 5, 6]``
  (FlashAttention's ``cu_seqlens``, transformers' ``cu_seq_lens_q``; padding left out);
- ``position_ids`` (T,) or (B, T): restarting at 0 for each example, e.g. ``[0, 1, 2, 0, 1, 0]``.

This module converts between them, finds where runs start (:func:`run_starts`), numbers the
examples from where they start (:func:`seq_ids_from_starts`), gives each token's position in its
run (:func:`example_positions`), and holds :class:`Segment` (row, [start, stop),
example). Reading any batch's boundaries: :mod:`packsim.core.boundaries`. Every function here that
builds int32 offsets refuses, with :func:`check_int32_offsets`, offsets past ``2**31 - 1`` (they
would wrap to negative values: flash-attn reads them as int32) instead of casting them down.

Lessons: 04, 06, 08, 09, A3, A7.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from packsim.core.errors import PacksimError

__all__ = [
    "Segment",
    "check_cu_seqlens",
    "check_int32_offsets",
    "check_seq_ids",
    "seq_ids_from_cu_seqlens",
    "seq_ids_from_starts",
    "cu_seqlens_from_seq_ids",
    "cu_seqlens_from_position_ids",
    "cu_seqlens_from_lengths",
    "run_starts",
    "run_cu_seqlens",
    "example_positions",
]


INT32_MAX = 2**31 - 1  # the largest offset an int32 cu_seqlens holds


@dataclass(frozen=True)
class Segment:
    """Where one example (or a piece of it) sits: row, [start, stop) in that row, example index."""

    row: int
    start: int
    stop: int
    example: int


# ----------------------------------------------------------------------------- validation


def check_cu_seqlens(cu_seqlens: torch.Tensor, total: int, name: str = "cu_seqlens") -> list[int]:
    """Check that ``cu_seqlens`` (S+1,) int32 describes S non-empty sequences covering ``total`` tokens.

    Raises :class:`PacksimError` if it is not a 1-D int32 tensor, has no sequence, does not start
    at 0, is not strictly increasing (names the first bad position) or does not end at ``total``.
    Returns the offsets as a Python list (handy for loops).
    """
    if not isinstance(cu_seqlens, torch.Tensor):
        raise PacksimError(
            f"{name} must be a torch.Tensor, got {type(cu_seqlens).__name__}. "
            f"Build it with torch.tensor(offsets, dtype=torch.int32)."
        )
    if cu_seqlens.dim() != 1:
        raise PacksimError(
            f"{name} must be 1-D with shape (num_seqs + 1,), got shape {tuple(cu_seqlens.shape)}. "
            f"For a batch of packs, pass one pack's offsets (or flatten the batch into one pack)."
        )
    if cu_seqlens.dtype != torch.int32:
        raise PacksimError(
            f"{name} must be int32 (what flash_attn_varlen_func requires), got {cu_seqlens.dtype}. "
            f"Call {name}.to(torch.int32)."
        )
    offsets = cu_seqlens.tolist()
    if len(offsets) < 2:
        raise PacksimError(
            f"{name} = {offsets} holds no sequence: it needs at least two entries [0, ..., total]. "
            f"Add the end offset of each sequence, e.g. torch.tensor([0, total], dtype=torch.int32)."
        )
    if offsets[0] != 0:
        raise PacksimError(
            f"{name} must start at 0 (the first sequence starts at token 0), got {offsets[0]}. "
            f"Prepend a 0, e.g. torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0)])."
        )
    for i in range(1, len(offsets)):
        if offsets[i] <= offsets[i - 1]:
            raise PacksimError(
                f"{name} must be strictly increasing, but {name}[{i}] = {offsets[i]} <= "
                f"{name}[{i - 1}] = {offsets[i - 1]} (sequence {i - 1} would have length "
                f"{offsets[i] - offsets[i - 1]}). Drop empty sequences and build it as a cumulative "
                f"sum of positive lengths."
            )
    if offsets[-1] != total:
        raise PacksimError(
            f"{name} must end at the number of tokens: it ends at {offsets[-1]} but there are "
            f"{total} tokens. Rebuild it from the same pack as the tensors (did you add padding, "
            f"or pass the offsets of a different pack?)."
        )
    return offsets


def check_int32_offsets(end: int, what: str) -> None:
    """Refuse int32 offsets whose largest value, ``end`` (tokens), is past ``2**31 - 1``.

    Call it before casting offsets to int32 (``.to(torch.int32)`` wraps silently: ``2**31`` becomes
    ``-2**31``); ``what`` names the offsets in the message, e.g. "cu_seqlens_from_lengths".
    """
    if end > INT32_MAX:
        raise PacksimError(
            f"{what}: the offsets reach {end} tokens, past 2**31 - 1, the most int32 cu_seqlens hold "
            "(flash-attn takes int32 offsets); split the batch into packs of at most 2**31 - 1 tokens."
        )


def check_seq_ids(seq_ids, name: str = "seq_ids") -> torch.Tensor:
    """``seq_ids`` as a long tensor (T,) or (B, T) of ids >= 0 (an example) or -1 (padding).

    Accepts anything ``torch.as_tensor`` takes; raises :class:`PacksimError` for another shape,
    a float or bool dtype, or an id below -1.
    """
    if not isinstance(seq_ids, torch.Tensor):
        seq_ids = torch.as_tensor(seq_ids)
    if seq_ids.dim() not in (1, 2):
        raise PacksimError(
            f"{name} must have shape (T,) or (B, T), got {tuple(seq_ids.shape)}. "
            f"Pass one id per token (-1 for padding)."
        )
    if seq_ids.dtype.is_floating_point or seq_ids.dtype == torch.bool:
        raise PacksimError(
            f"{name} must hold integer sequence ids, got dtype {seq_ids.dtype}. Call {name}.long()."
        )
    if seq_ids.numel() and int(seq_ids.min()) < -1:
        raise PacksimError(
            f"{name} holds {int(seq_ids.min())}, but ids must be >= 0 (an example) or -1 (padding). "
            f"Mark padding tokens with -1."
        )
    return seq_ids.long()


# ----------------------------------------------------------------------------- runs


def run_starts(ids: torch.Tensor, step: int = 0) -> torch.Tensor:
    """Where a new run begins: ids (T,) or (B, T) -> bool of the same shape.

    True at the first token of every row and wherever ``ids[t] - ids[t-1] != step``: ``step=0``
    for example ids (the same id continues the run), ``step=1`` for position ids (a position
    continues the run when it is the previous one + 1, the rule transformers'
    ``find_packed_sequence_indices`` uses). Padding runs (-1) are runs too.
    """
    starts = torch.ones(ids.shape, dtype=torch.bool, device=ids.device)  # (..., T)
    starts[..., 1:] = ids[..., 1:] - ids[..., :-1] != step
    return starts


def run_cu_seqlens(ids: torch.Tensor, step: int = 0) -> torch.Tensor:
    """Offsets of every run over all tokens, rows split: (T,) or (B, T) -> (S'+1,) int32 over B*T.

    Runs as :func:`run_starts` finds them (padding runs included), so the offsets cover every
    token: what a varlen kernel needs to run a whole (B, T) batch. ``[[0, 0, 1, -1, -1]]`` -> ``[0, 2, 3, 5]``.
    """
    check_int32_offsets(ids.numel(), "run_cu_seqlens")  # the last offset is every token
    bounds = torch.nonzero(run_starts(ids, step).reshape(-1)).flatten()  # (S',)
    end = torch.tensor([ids.numel()], device=ids.device)
    return torch.cat([bounds, end]).to(torch.int32)  # (S'+1,)


def example_positions(seq_ids: torch.Tensor) -> torch.Tensor:
    """Each token's index inside its run of one id: (T,) or (B, T) -> long, same shape.

    ``[0, 0, 0, 1, 1, -1]`` -> ``[0, 1, 2, 0, 1, 0]``: the position ids that restart at each
    example (a padding run counts from 0 too), as ``PackedBatch.example_positions`` holds them.
    """
    starts = run_starts(seq_ids)  # (..., T)
    idx = torch.arange(seq_ids.shape[-1], device=seq_ids.device).expand(seq_ids.shape)
    run_start = torch.where(starts, idx, torch.zeros_like(idx)).cummax(dim=-1).values
    return idx - run_start


# ----------------------------------------------------------------------------- conversions


def seq_ids_from_cu_seqlens(cu_seqlens: torch.Tensor, total: int | None = None) -> torch.Tensor:
    """Sequence id per token: (S+1,) int32 offsets -> (N,) long.

    ``[0, 3, 5]`` -> ``[0, 0, 0, 1, 1]``. With ``total`` larger than ``cu_seqlens[-1]`` the
    trailing tokens are padding and get id ``-1``.
    """
    end = int(cu_seqlens[-1]) if isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.numel() else 0
    offsets = check_cu_seqlens(cu_seqlens, end)
    total = end if total is None else int(total)
    if total < end:
        raise PacksimError(
            f"total = {total} is smaller than cu_seqlens[-1] = {end}: the offsets describe more "
            f"tokens than the pack holds. Pass total >= {end} (or leave it out)."
        )
    lengths = torch.diff(cu_seqlens.long())  # (S,)
    ids = torch.repeat_interleave(torch.arange(len(offsets) - 1, device=cu_seqlens.device), lengths)
    pad = torch.full((total - end,), -1, dtype=torch.long, device=cu_seqlens.device)
    return torch.cat([ids, pad])  # (N,)


def seq_ids_from_starts(starts: torch.Tensor, real: torch.Tensor | None = None) -> torch.Tensor:
    """Example index per token from where examples start: (B, T) bool -> (B, T) long.

    A new example begins at every True of ``starts`` and at every row's first token (rows never
    share an example); each token continues the example of the token before it. ``real`` (B, T)
    bool marks the tokens that belong to examples: the others (padding) get ``-1``, and the ids
    are renumbered 0..S-1 in token order over the real tokens, so none is empty. A start on a
    padding token still ends the example before it. ``starts`` is not changed.
    ``[[1, 0, 0, 1, 0]]`` with real ``[[1, 1, 1, 1, 0]]`` -> ``[[0, 0, 0, 1, -1]]``.
    """
    starts = starts.clone()
    starts[:, 0] = True  # rows never share an example
    seq = starts.reshape(-1).cumsum(0).reshape(starts.shape) - 1  # (B, T)
    if real is not None:
        real = real.to(seq.device)
        seq[~real] = -1
        if not bool(real.all()):  # padding took ids: renumber 0..S-1 in token order
            seq[real] = torch.unique(seq[real], return_inverse=True)[1]
    return seq


def cu_seqlens_from_lengths(lengths) -> torch.Tensor:
    """Offsets of sequences of these lengths: (S,) -> (S+1,) int32, a 0 then the running total.

    ``[3, 2, 1]`` -> ``[0, 3, 5, 6]``. Takes a list, tuple, numpy array or tensor (on its device);
    the lengths are not checked (:func:`check_cu_seqlens` checks the result where it matters), but
    a running total past ``2**31 - 1`` raises :class:`PacksimError` (:func:`check_int32_offsets`).
    """
    lengths = torch.as_tensor(lengths).reshape(-1)  # (S,)
    ends = lengths.cumsum(0)  # (S,) int64 for integer lengths (torch widens the sum)
    if ends.numel():
        check_int32_offsets(int(ends.max()), "cu_seqlens_from_lengths")
    cu = torch.zeros(lengths.numel() + 1, dtype=torch.int32, device=lengths.device)  # (S+1,)
    cu[1:] = ends
    return cu


def cu_seqlens_from_seq_ids(seq_ids: torch.Tensor) -> torch.Tensor:
    """Offsets of each example: (T,) ids -> (S+1,) int32.

    Each id must form one consecutive run (``[0, 0, 1, 1, 0]`` is rejected: example 0 is split).
    Padding (``-1``) may only come at the end, where it is left out, so ``cu_seqlens[-1]`` is the
    number of real tokens (flash-attn ignores tokens past it).
    """
    ids = check_seq_ids(seq_ids)
    if ids.dim() != 1:
        raise PacksimError(
            f"cu_seqlens_from_seq_ids takes one pack of shape (T,), got {tuple(ids.shape)}. "
            f"Call it once per row."
        )
    real = ids >= 0  # (T,)
    n_real = int(real.sum())
    if not bool(real[:n_real].all()):
        first_pad = int((~real).nonzero()[0])
        raise PacksimError(
            f"seq_ids has padding (-1) at position {first_pad} followed by real tokens: cu_seqlens "
            f"can only describe padding at the end. Move padding to the end of the pack."
        )
    check_int32_offsets(n_real, "cu_seqlens_from_seq_ids")  # the last offset is every real token
    ids = ids[:n_real]
    if n_real == 0:
        return torch.zeros(1, dtype=torch.int32, device=ids.device)
    starts = torch.nonzero(run_starts(ids)).flatten()  # (S,) run starts
    run_ids = ids[starts]  # (S,) id of each run
    if run_ids.unique().numel() != run_ids.numel():
        counts = torch.bincount(run_ids)
        split = int(torch.nonzero(counts > 1)[0])
        raise PacksimError(
            f"sequence id {split} appears in more than one run: each example must be one "
            f"consecutive run of tokens. Give each run its own id (e.g. a cumulative count of "
            f"boundaries)."
        )
    end = torch.tensor([n_real], device=ids.device)
    return torch.cat([starts, end]).to(torch.int32)  # (S+1,)


def cu_seqlens_from_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """Offsets of the runs of consecutive positions: (T,) or (B, T) -> (S+1,) int32 over B*T tokens.

    A new sequence starts wherever the position does not continue by +1 (:func:`run_starts` with
    ``step=1``, the rule of transformers' ``find_packed_sequence_indices`` and flash-attn's
    position-id path) and at every row start, so rows never share a sequence.
    ``[[0, 1, 2, 0, 1]]`` -> ``[0, 3, 5]``.
    """
    pos = torch.as_tensor(position_ids)
    if pos.dim() not in (1, 2) or pos.numel() == 0 or pos.dtype.is_floating_point:
        raise PacksimError(
            f"position_ids must be a non-empty integer tensor of shape (T,) or (B, T), got "
            f"{tuple(pos.shape)} {pos.dtype}. Pass the position ids the model would get."
        )
    check_int32_offsets(pos.numel(), "cu_seqlens_from_position_ids")  # the last offset is every token
    return run_cu_seqlens(pos.reshape(-1, pos.shape[-1]), step=1)  # (S+1,)
