"""Where the examples of a batch are: seq ids, ``cu_seqlens`` and position ids.

A *pack* is one row of tokens holding several examples back to back. Three equivalent ways to say
where the examples are:

- ``seq_ids``      (T,) or (B, T) long: the example each token belongs to, e.g.
  ``[0, 0, 0, 1, 1, 2, -1]``; each example is one consecutive run and ``-1`` marks padding;
- ``cu_seqlens``   (S+1,) int32: where each example starts, plus the total, e.g. ``[0, 3, 5, 6]``
  (FlashAttention's ``cu_seqlens``, transformers' ``cu_seq_lens_q``; padding is left out);
- ``position_ids`` (T,) or (B, T): 0, 1, 2, ... restarting at 0 for each example, e.g.
  ``[0, 1, 2, 0, 1, 0]``; a new example starts wherever the position does not continue by +1.

This module converts between them (:func:`seq_ids_from_cu_seqlens`, :func:`cu_seqlens_from_seq_ids`,
:func:`cu_seqlens_from_position_ids`), finds where runs start (:func:`run_starts`) and each token's
position inside its run (:func:`example_positions`), and reads the boundaries of any batch, a
:class:`~packsim.core.batch.PackedBatch` or a collator dict, with one documented precedence
(:func:`find_boundaries`: ``cu_seq_lens_q`` > ``seq_idx`` > ``position_ids`` restarts).
How much attention crosses those boundaries is measured in :mod:`packsim.core.attention_share`.

Lessons: 08, 09.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from packsim.core.errors import PacksimError

__all__ = [
    "check_cu_seqlens",
    "check_seq_ids",
    "seq_ids_from_cu_seqlens",
    "cu_seqlens_from_seq_ids",
    "cu_seqlens_from_position_ids",
    "run_starts",
    "run_cu_seqlens",
    "example_positions",
    "Boundaries",
    "find_boundaries",
]


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
    return run_cu_seqlens(pos.reshape(-1, pos.shape[-1]), step=1)  # (S+1,)


# ----------------------------------------------------------------------------- any batch


@dataclass(frozen=True)
class Boundaries:
    """Where the examples of a batch are, and which field said so (see :func:`find_boundaries`).

    seq_ids (B, T) long: example index per token, -1 on padding (a PackedBatch's own example
    indices; 0..S-1 in token order for a dict). cu_seqlens (S+1,) int32: the examples' offsets
    over the real tokens in row-major order, padding left out. source: the field used, e.g.
    ``"seq_idx"`` or ``"cu_seq_lens_q; padding from attention_mask == 0"``.
    """

    seq_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    source: str

    @property
    def num_examples(self) -> int:
        return self.cu_seqlens.numel() - 1


PACKED_SOURCE = "PackedBatch.seq_ids (how the examples were packed)"
_POSITIONS_SOURCE = "position_ids (where they restart)"
ROWS_SOURCE = "rows (no boundary field: one example per row)"


def find_boundaries(batch, shape: tuple[int, int] | None = None, missing: str = "error") -> Boundaries:
    """The examples of any batch: a PackedBatch, or a collator dict of (B, T) fields.

    For a dict the first field present decides, in this order (transformers'
    ``DataCollatorWithFlattening`` can return all three, and they agree):

    1. ``cu_seq_lens_q`` (S+1,): offsets over the flattened B*T tokens; tokens past its last
       offset are padding (flash-attn ignores them);
    2. ``seq_idx`` (B, T): a new example wherever the id changes (the same id continues it);
       negative ids are padding;
    3. ``position_ids`` (B, T) or (1, T): a new example wherever the position does not continue
       by +1.

    Every row start begins a new example (rows never share one), and a 2D ``attention_mask``
    marks its zeros as padding. ``shape`` (B, T) defaults to ``batch["input_ids"].shape``. With
    none of the fields, ``missing="error"`` raises and ``missing="rows"`` gives one example per
    row (a plain causal LM batch). Tensors come back on the device of the field used.
    """
    if not isinstance(batch, Mapping):
        if hasattr(batch, "seq_ids") and hasattr(batch, "cu_seqlens"):  # a PackedBatch
            return Boundaries(batch.seq_ids, batch.cu_seqlens, PACKED_SOURCE)
        raise PacksimError(
            f"cannot find example boundaries in a {type(batch).__name__}: pass a PackedBatch or a "
            "collator dict (input_ids, position_ids, cu_seq_lens_q, seq_idx, ...)."
        )
    B, T = _batch_shape(batch, shape)
    found = _starts_and_padding(batch, B, T)
    if found is None:
        if missing != "rows":
            raise PacksimError(
                "the batch carries no example boundaries (none of cu_seq_lens_q, seq_idx, "
                "position_ids): pass cu_seq_lens_q, seq_idx, or position_ids that restart at 0 for "
                "each example (DataCollatorWithFlattening(return_flash_attn_kwargs=True, "
                "return_seq_idx=True) gives all three)."
            )
        cu = torch.arange(0, B * T + 1, T, dtype=torch.int32)
        return Boundaries(torch.arange(B)[:, None].expand(B, T).clone(), cu, ROWS_SOURCE)
    starts, pad, source = found
    starts[:, 0] = True  # rows never share an example
    seq = starts.reshape(-1).cumsum(0).reshape(B, T) - 1  # (B, T)
    seq[pad] = -1
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        if tuple(mask.shape) != (B, T):
            raise PacksimError(
                f"batch['attention_mask'] has shape {tuple(mask.shape)} but the batch holds ({B}, {T}) "
                "tokens: pass a (B, T) mask of the same batch."
            )
        seq[mask.to(seq.device) == 0] = -1
        source += "; padding from attention_mask == 0"
    real = seq >= 0
    if not bool(real.all()):  # padding took ids: renumber 0..S-1 in token order
        seq[real] = torch.unique(seq[real], return_inverse=True)[1]
    lengths = torch.bincount(seq[real])  # (S,)
    cu = torch.zeros(lengths.numel() + 1, dtype=torch.int32, device=seq.device)
    cu[1:] = lengths.cumsum(0)
    return Boundaries(seq, cu, source)


def _batch_shape(batch: Mapping, shape) -> tuple[int, int]:
    if shape is not None:
        return int(shape[0]), int(shape[1])
    ids = batch.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        got = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise PacksimError(
            f"batch['input_ids'] must be a (B, T) tensor, got {got}: pass the collator's output "
            "(e.g. DataCollatorWithFlattening returns input_ids of shape (1, total_tokens))."
        )
    return tuple(ids.shape)


def _per_token(batch: Mapping, key: str, B: int, T: int) -> torch.Tensor:
    """``batch[key]`` as a (B, T) tensor (a (T,) or (1, T) field is shared by every row)."""
    field = torch.as_tensor(batch[key])
    if field.dim() not in (1, 2) or field.shape[-1] != T or (field.dim() == 2 and field.shape[0] not in (1, B)):
        raise PacksimError(
            f"batch[{key!r}] has shape {tuple(field.shape)} but the batch holds ({B}, {T}) tokens: "
            "every per-token field needs one entry per token; rebuild it from the same examples."
        )
    return field.reshape(-1, T).expand(B, T)


def _starts_and_padding(batch: Mapping, B: int, T: int):
    """(starts (B, T) bool, padding (B, T) bool, source) from the first field present, or None."""
    if batch.get("cu_seq_lens_q") is not None:
        cu = torch.as_tensor(batch["cu_seq_lens_q"]).reshape(-1).to(torch.int32)
        end = int(cu[-1]) if cu.numel() else 0
        if end > B * T:
            raise PacksimError(
                f"cu_seq_lens_q ends at {end} but the batch holds {B}x{T}={B * T} tokens: the "
                "offsets belong to a different (longer) batch; rebuild them from the same examples."
            )
        offsets = check_cu_seqlens(cu, end, name="cu_seq_lens_q")
        starts = torch.zeros(B * T, dtype=torch.bool, device=cu.device)
        starts[torch.tensor(offsets[:-1], dtype=torch.long, device=cu.device)] = True
        pad = torch.zeros(B * T, dtype=torch.bool, device=cu.device)
        pad[end:] = True  # tokens after the last offset: padding (flash-attn ignores them)
        return starts.view(B, T), pad.view(B, T), "cu_seq_lens_q"
    if batch.get("seq_idx") is not None:
        ids = _per_token(batch, "seq_idx", B, T)
        return run_starts(ids, step=0), ids < 0, "seq_idx"
    if batch.get("position_ids") is not None:
        pos = _per_token(batch, "position_ids", B, T)
        return run_starts(pos, step=1), torch.zeros_like(pos, dtype=torch.bool), _POSITIONS_SOURCE
    return None
