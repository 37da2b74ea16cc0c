"""The examples of any batch: a PackedBatch, or a collator dict, read with one documented precedence.

:func:`find_boundaries` returns :class:`Boundaries`: seq_ids (B, T) long, -1 on padding;
cu_seqlens (S+1,) int32 over the real tokens in row-major order; and the field that said so. A
collator dict of (B, T) fields (``input_ids``, ``position_ids``, ``cu_seq_lens_q`` (S+1,),
``seq_idx``, ``attention_mask``) is read in the order ``cu_seq_lens_q`` > ``seq_idx`` >
``position_ids`` restarts, the fields transformers' ``DataCollatorWithFlattening`` returns; the
three forms themselves and their conversions are in :mod:`packsim.core.segments`.
:func:`field_starts` is the one tolerant reader of every boundary field (the audit's evidence
compares each with independent evidence); ``find_boundaries`` checks the field it takes, then reads
it there.

Lessons: none directly (the audit, the model and PackedBatch.from_flattening read batches with it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from packsim.core.errors import PacksimError
from packsim.core.segments import (
    check_cu_seqlens,
    cu_seqlens_from_lengths,
    run_starts,
    seq_ids_from_starts,
)

__all__ = ["Boundaries", "field_starts", "find_boundaries", "text_positions"]


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


def find_boundaries(batch, shape: tuple[int, int] | None = None, missing: str = "error",
                    pad_token_id: int | None = None) -> Boundaries:
    """The examples of any batch: a PackedBatch, or a collator dict of (B, T) fields.

    For a dict the first field present decides, in this order (transformers'
    ``DataCollatorWithFlattening`` can return all three, and they agree):

    1. ``cu_seq_lens_q`` (S+1,): offsets over the flattened B*T tokens; tokens past its last
       offset are padding (flash-attn ignores them);
    2. ``seq_idx`` (B, T): a new example wherever the id changes (the same id continues it);
       negative ids are padding;
    3. ``position_ids`` (B, T) or (1, T) (a multimodal-RoPE model's (3, B, T) / (4, B, T) rope rows
       by their first, :func:`text_positions`): a new example wherever the position does not continue
       by +1.

    Every row start begins a new example (rows never share one), and a 2D ``attention_mask``
    marks its zeros as padding. ``shape`` (B, T) defaults to ``batch["input_ids"].shape``. With
    none of the fields, ``missing="error"`` raises and ``missing="rows"`` gives one example per
    row (a plain causal LM batch). Tensors come back on the device of the field used.

    ``pad_token_id``: where the batch has no 2D ``attention_mask``, the run of that token ending
    each row is padding when no label in it counts (``labels`` == -100 there, or no labels): the
    layout of Axolotl's ``pad_to_sequence_len`` (its collator drops the mask and gives the pad run
    positions 0, 1, 2, ... of its own, so position_ids alone read it as one more example).
    """
    if not isinstance(batch, Mapping):
        if hasattr(batch, "seq_ids") and hasattr(batch, "cu_seqlens"):  # a PackedBatch
            return Boundaries(batch.seq_ids, batch.cu_seqlens, PACKED_SOURCE)
        raise PacksimError(
            f"cannot find example boundaries in a {type(batch).__name__}: pass a PackedBatch or a "
            "collator dict (input_ids, position_ids, cu_seq_lens_q, seq_idx, ...)."
        )
    B, T = _batch_shape(batch, shape)
    _check_index_dtypes(batch)
    found = _starts_and_padding(batch, B, T)
    if found is None:
        if missing != "rows":
            raise PacksimError(
                "the batch carries no example boundaries (none of cu_seq_lens_q, seq_idx, "
                "position_ids): pass cu_seq_lens_q, seq_idx, or position_ids that restart at 0 for "
                "each example (DataCollatorWithFlattening(return_flash_attn_kwargs=True, "
                "return_seq_idx=True) gives all three)."
            )
        mask = batch.get("attention_mask")
        if not (isinstance(mask, torch.Tensor) and mask.dim() == 2 and bool((mask == 0).any())):
            cu = torch.arange(0, B * T + 1, T, dtype=torch.int32)
            return Boundaries(torch.arange(B)[:, None].expand(B, T).clone(), cu, ROWS_SOURCE)
        found = (torch.zeros(B, T, dtype=torch.bool, device=mask.device),
                 torch.zeros(B, T, dtype=torch.bool, device=mask.device), ROWS_SOURCE)  # padding below
    starts, pad, source = found
    real = ~pad  # (B, T)
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        if tuple(mask.shape) != (B, T):
            raise PacksimError(
                f"batch['attention_mask'] has shape {tuple(mask.shape)} but the batch holds ({B}, {T}) "
                "tokens: pass a (B, T) mask of the same batch."
            )
        real &= mask.to(real.device) != 0
        source += "; padding from attention_mask == 0"
    elif pad_token_id is not None and isinstance(batch.get("input_ids"), torch.Tensor):
        tail = _pad_tail(batch, int(pad_token_id), B, T).to(real.device)
        if bool(tail.any()):
            real &= ~tail
            source += f"; padding: the run of pad token {int(pad_token_id)} ending each row, no label counted"
    seq = seq_ids_from_starts(starts, real)  # (B, T), -1 on padding, 0..S-1 in token order
    lengths = torch.bincount(seq[seq >= 0])  # (S,)
    cu = cu_seqlens_from_lengths(lengths)  # (S+1,)
    return Boundaries(seq, cu, source)


def _pad_tail(batch: Mapping, pad: int, B: int, T: int) -> torch.Tensor:
    """(B, T) bool: the run of ``pad`` ending each row, where no label in it counts."""
    ids = batch["input_ids"].reshape(B, T)
    is_pad = ids == pad  # (B, T)
    labels = batch.get("labels")
    if isinstance(labels, torch.Tensor) and labels.numel() == B * T:
        is_pad &= labels.reshape(B, T).to(ids.device) == -100
    # a token is in the tail when it and every token after it in its row are pad: a reversed cumulative AND
    return is_pad.flip(-1).cumprod(-1).flip(-1).bool()


# the fields a batch holds token ids, labels or indices in: integers, never bool or floating point
INDEX_FIELDS = ("input_ids", "labels", "position_ids", "seq_idx", "cu_seq_lens_q", "cu_seq_lens_k")


def _check_index_dtypes(batch: Mapping) -> None:
    for key in INDEX_FIELDS:
        x = batch.get(key)
        if isinstance(x, torch.Tensor) and (x.dtype == torch.bool or x.is_floating_point() or x.is_complex()):
            raise PacksimError(
                f"batch[{key!r}] holds {x.dtype}, but the audit reads it as integers (token ids, labels, "
                "positions, offsets): pass the collator's integer tensor (torch.long), not a cast copy."
            )


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
    if ids.numel() == 0:
        raise PacksimError(f"batch['input_ids'] has shape {tuple(ids.shape)}: it holds no token; pass a batch "
                           "with at least one example in it.")
    return tuple(ids.shape)


def text_positions(position_ids, B: int, T: int) -> torch.Tensor:
    """``position_ids`` as (B, T): (T,) or (1, T) is shared by every row; a multimodal-RoPE model's
    (3, B, T) (t, h, w) or (4, B, T) (text positions first) rope rows are read by their first row,
    which holds the text positions of text tokens. PacksimError for any other shape."""
    pos = torch.as_tensor(position_ids)
    if pos.dim() == 3 and pos.shape[0] in (3, 4) and pos.shape[1] in (1, B):
        pos = pos[0]
    if pos.dim() not in (1, 2) or pos.shape[-1] != T or (pos.dim() == 2 and pos.shape[0] not in (1, B)):
        raise PacksimError(
            f"batch['position_ids'] has shape {tuple(pos.shape)} but the batch holds ({B}, {T}) tokens: pass "
            "(B, T) position ids, or a multimodal-RoPE model's (3, B, T) / (4, B, T) rope rows."
        )
    return pos.reshape(-1, T).expand(B, T)


def _per_token(batch: Mapping, key: str, B: int, T: int) -> torch.Tensor:
    """``batch[key]`` as a (B, T) tensor (a (T,) or (1, T) field is shared by every row)."""
    if key == "position_ids":
        return text_positions(batch[key], B, T)
    field = torch.as_tensor(batch[key])
    if field.dim() not in (1, 2) or field.shape[-1] != T or (field.dim() == 2 and field.shape[0] not in (1, B)):
        raise PacksimError(
            f"batch[{key!r}] has shape {tuple(field.shape)} but the batch holds ({B}, {T}) tokens: "
            "every per-token field needs one entry per token; rebuild it from the same examples."
        )
    return field.reshape(-1, T).expand(B, T)


def _mask_allows(mask: torch.Tensor) -> torch.Tensor:
    """A 4D attention mask as bool "may attend": bool as is, additive float above half its minimum, else != 0."""
    if mask.dtype == torch.bool:
        return mask
    if mask.is_floating_point():
        return mask > torch.finfo(mask.dtype).min / 2
    return mask != 0


def field_starts(fields: Mapping, B: int, T: int) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """Every boundary field the batch carries, read tolerantly: field -> ((B, T) bool "an example starts
    here", (B, T) bool padding or None).

    The one reader of the boundary fields: :func:`find_boundaries` checks the field it takes first and
    reads it here; the audit's evidence (:mod:`packsim.auditing.evidence`) reads every field here and
    compares each with independent evidence. Tolerant: a field of the wrong shape is left out, and
    ``cu_seq_lens_q/k`` offsets are clamped to the batch (offsets over B*T tokens in row-major order;
    tokens after the last offset are padding). ``position_ids`` restart where they do not rise by 1,
    ``seq_idx`` starts where it changes (padding where < 0), and a 4D ``attention_mask`` (B, 1, T, T)
    starts where a token may not see the token before it.
    """
    out = {}
    pos = fields.get("position_ids")
    if isinstance(pos, torch.Tensor):
        try:
            out["position_ids"] = (run_starts(text_positions(pos, B, T), step=1), None)
        except PacksimError:
            pass  # a field of the wrong shape is left out (the strict reader says why)
    for key in ("cu_seq_lens_q", "cu_seq_lens_k"):
        cu = fields.get(key)
        if isinstance(cu, torch.Tensor) and cu.numel() >= 2:
            offsets = cu.reshape(-1).long().clamp(0, B * T)
            starts = torch.zeros(B * T, dtype=torch.bool, device=cu.device)
            starts[offsets[:-1][offsets[:-1] < B * T]] = True
            pad = torch.zeros(B * T, dtype=torch.bool, device=cu.device)
            pad[int(offsets[-1]):] = True  # tokens after the last offset: padding (flash-attn ignores them)
            out[key] = (starts.view(B, T), pad.view(B, T))
    idx = fields.get("seq_idx")
    if isinstance(idx, torch.Tensor) and idx.shape[-1] == T and idx.numel() in (T, B * T):
        idx = idx.reshape(-1, T).expand(B, T)
        out["seq_idx"] = (run_starts(idx, step=0), idx < 0)
    mask = fields.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 4 and tuple(mask.shape[-2:]) == (T, T):
        allowed = _mask_allows(mask[:, 0]).expand(B, T, T)  # (B, T, T)
        starts = torch.ones(B, T, dtype=torch.bool, device=mask.device)
        starts[:, 1:] = ~torch.diagonal(allowed, offset=-1, dim1=1, dim2=2)  # t may not see t-1
        out["attention_mask (4D)"] = (starts, None)
    return out


def _starts_and_padding(batch: Mapping, B: int, T: int):
    """(starts (B, T) bool, padding (B, T) bool, source) from the first field present, or None; the
    field is checked (shape, offsets within the batch and rising) before :func:`field_starts` reads it."""
    if batch.get("cu_seq_lens_q") is not None:
        cu = torch.as_tensor(batch["cu_seq_lens_q"]).reshape(-1).to(torch.int32)
        end = int(cu[-1]) if cu.numel() else 0
        if end > B * T:
            raise PacksimError(
                f"cu_seq_lens_q ends at {end} but the batch holds {B}x{T}={B * T} tokens: the "
                "offsets belong to a different (longer) batch; rebuild them from the same examples."
            )
        check_cu_seqlens(cu, end, name="cu_seq_lens_q")
        starts, pad = field_starts({"cu_seq_lens_q": cu}, B, T)["cu_seq_lens_q"]
        return starts, pad, "cu_seq_lens_q"
    for key, source in (("seq_idx", "seq_idx"), ("position_ids", _POSITIONS_SOURCE)):
        if batch.get(key) is not None:
            starts, pad = field_starts({key: _per_token(batch, key, B, T)}, B, T)[key]
            return starts, torch.zeros_like(starts) if pad is None else pad, source
    return None
