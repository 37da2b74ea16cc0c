"""Attention masks for packed batches: causal, block-diagonal, additive 4D, and Flex BlockMasks.

A *pack* is one row of tokens holding several examples back to back; where they are is said by
``seq_ids`` (T,) or (B, T) long, the example of each token with ``-1`` on padding (conversions to
and from ``cu_seqlens`` and position ids live in :mod:`packsim.core.segments`). A mask here is
boolean (T, T) or (B, T, T): ``True`` where query row ``i`` may attend to key column ``j``.

The correct mask for a pack is *block-diagonal causal*: causal inside each example and nothing
across examples. The buggy default is a plain causal mask over the whole pack, which lets every
example read the ones packed before it. ``packsim.core.attention``'s dense backend uses these.

Lessons: 02, 03, 04, 08, 09, A2, A7.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from packsim.core.errors import PacksimError
from packsim.core.segments import check_seq_ids, seq_ids_from_cu_seqlens

__all__ = [
    "causal_mask",
    "block_diagonal_mask",
    "block_diagonal_mask_from_cu_seqlens",
    "to_additive_4d",
    "flex_block_mask",
    "BlockSparsity",
    "block_sparsity",
]


# ----------------------------------------------------------------------------- boolean masks


def causal_mask(T: int, device=None) -> torch.Tensor:
    """Plain causal mask (T, T) bool, True = may attend (key j <= query i).

    Over a whole pack this is the *buggy* mask: example 2 can read example 1.
    Used by notebooks 02_the_leak, 03_block_diagonal and 04_transformers_traps.
    """
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()  # (T, T)


def block_diagonal_mask(seq_ids, causal: bool = True) -> torch.Tensor:
    """Block-diagonal (causal) mask from sequence ids: (T,) -> (T, T) or (B, T) -> (B, T, T) bool.

    ``mask[..., i, j]`` is True when token ``i`` may attend to token ``j``: same sequence id, and
    ``j <= i`` when ``causal``. Padding (id ``-1``) attends to nothing and nobody attends to it;
    its rows are all False (SDPA returns 0 for such rows). Used by notebooks 03_block_diagonal and
    04_transformers_traps.
    """
    ids = check_seq_ids(seq_ids)  # (..., T)
    T = ids.shape[-1]
    same = ids[..., :, None] == ids[..., None, :]  # (..., T, T)
    real = ids >= 0  # (..., T)
    mask = same & real[..., :, None] & real[..., None, :]
    if causal:
        mask = mask & causal_mask(T, device=ids.device)
    return mask


def block_diagonal_mask_from_cu_seqlens(
    cu_seqlens: torch.Tensor, causal: bool = True, total: int | None = None
) -> torch.Tensor:
    """Block-diagonal (causal) mask from offsets: (S+1,) int32 -> (N, N) bool.

    ``total`` > ``cu_seqlens[-1]`` adds trailing padding rows/columns (all False).
    This is the O(N^2) mask the ``dense`` attention backend uses. Used by notebook 03.
    """
    return block_diagonal_mask(seq_ids_from_cu_seqlens(cu_seqlens, total), causal=causal)


def to_additive_4d(mask_bool: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Boolean mask (T, T), (B, T, T) or (B, 1, T, T) -> additive float mask (B, 1, T, T).

    The result is 0 where attention is allowed and ``torch.finfo(dtype).min`` where it is not.
    This is the form a transformers model accepts as a 4D ``attention_mask`` for *both* the
    ``eager`` and the ``sdpa`` implementations. A *boolean* 4D mask only works for sdpa: eager
    attention computes ``scores + attention_mask``, so a bool mask is added as 0/1 and masks
    nothing at all (not even causality). Use the model's dtype (e.g. ``torch.bfloat16``) so the
    minimum stays finite in that dtype. Fully masked rows (padding) become uniform attention in
    eager rather than NaN; their labels must be ignored anyway. Used by notebooks 03_block_diagonal
    and 04_transformers_traps.
    """
    if not isinstance(mask_bool, torch.Tensor) or mask_bool.dtype != torch.bool:
        got = mask_bool.dtype if isinstance(mask_bool, torch.Tensor) else type(mask_bool).__name__
        raise PacksimError(
            f"to_additive_4d takes a boolean mask (True = may attend), got {got}. "
            f"Build one with block_diagonal_mask(seq_ids), or compare your mask with == 0."
        )
    if not dtype.is_floating_point:
        raise PacksimError(
            f"to_additive_4d needs a floating dtype for the additive mask, got {dtype}. "
            f"Pass the model's dtype, e.g. torch.float32 or torch.bfloat16."
        )
    if mask_bool.dim() == 2:
        mask_bool = mask_bool[None, None]  # (1, 1, T, T)
    elif mask_bool.dim() == 3:
        mask_bool = mask_bool[:, None]  # (B, 1, T, T)
    elif mask_bool.dim() != 4 or mask_bool.shape[1] != 1:
        raise PacksimError(
            f"to_additive_4d takes a mask of shape (T, T), (B, T, T) or (B, 1, T, T), got "
            f"{tuple(mask_bool.shape)}."
        )
    out = torch.zeros(mask_bool.shape, dtype=dtype, device=mask_bool.device)
    return out.masked_fill(~mask_bool, torch.finfo(dtype).min)  # (B, 1, T, T)


# ----------------------------------------------------------------------------- FlexAttention


def _flex_module():
    """Import ``torch.nn.attention.flex_attention`` lazily, with a clear error if missing."""
    try:
        import torch.nn.attention.flex_attention as flex
    except ImportError as err:  # pragma: no cover - torch < 2.5
        raise PacksimError(
            f"FlexAttention is not available in torch {torch.__version__} ({err}). "
            f"Upgrade to torch >= 2.5, or use the dense mask (block_diagonal_mask) instead."
        ) from err
    return flex


def flex_block_mask(seq_ids, causal: bool = True, block_size: int = 128, device=None):
    """FlexAttention ``BlockMask`` for a document (block-diagonal) mask.

    ``seq_ids`` (T,) gives a mask shared by every batch row and head (B=None, H=None);
    (B, T) gives one mask per row. Padding (-1) attends to nothing. The BlockMask stores, per
    (query block, key block) of ``block_size`` tokens, whether it is *full* (compute, no mask
    needed), *partial* (compute, apply ``mask_mod`` per element) or *skipped* (never touched):
    see :func:`block_sparsity`. Used by notebook 03_block_diagonal.
    """
    flex = _flex_module()
    ids = check_seq_ids(seq_ids)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise PacksimError(
            f"block_size must be a positive int, got {block_size!r}. FlexAttention uses 128 by "
            f"default; use a multiple of 16 on GPU."
        )
    device = torch.device(device) if device is not None else ids.device
    ids = ids.to(device)
    T = ids.shape[-1]
    batched = ids.dim() == 2

    def mask_mod(b, h, q_idx, kv_idx):
        row = ids[b] if batched else ids
        same = (row[q_idx] == row[kv_idx]) & (row[q_idx] >= 0)
        return same & (q_idx >= kv_idx) if causal else same

    B = ids.shape[0] if batched else None
    return flex.create_block_mask(mask_mod, B, None, T, T, device=device, BLOCK_SIZE=block_size)


@dataclass(frozen=True)
class BlockSparsity:
    """Block counts of a FlexAttention BlockMask, summed over batch rows and heads.

    ``grid`` (B, H, nq, nk) int8: 0 = skipped, 1 = partial, 2 = full (for the tile map).
    """

    full: int
    partial: int
    skipped: int
    total: int
    block_size: tuple[int, int]
    grid: torch.Tensor

    @property
    def computed(self) -> int:
        """Blocks the kernel visits (full + partial)."""
        return self.full + self.partial

    @property
    def skipped_fraction(self) -> float:
        """Share of blocks never touched (what ``BlockMask.sparsity()`` reports, as a fraction)."""
        return self.skipped / self.total if self.total else 0.0


def _block_codes(num, indices, nk: int, code: int, grid: torch.Tensor) -> None:
    """Write ``code`` into ``grid`` (B, H, nq, nk) for the first ``num`` entries of ``indices``."""
    slots = torch.arange(indices.shape[-1], device=indices.device)  # (K,)
    used = slots < num[..., None]  # (B, H, nq, K)
    idx = indices.long().clamp(max=nk - 1)
    grid.scatter_(-1, torch.where(used, idx, nk), torch.full_like(idx, code, dtype=grid.dtype))


def block_sparsity(block_mask) -> BlockSparsity:
    """Count full / partial / skipped blocks of a FlexAttention ``BlockMask``.

    ``full + partial + skipped == total == B * H * ceil(Q/bq) * ceil(KV/bk)``. Notebook
    03_block_diagonal shows which blocks of a pack are skipped (cross-example and above-diagonal).
    ``skipped_fraction`` equals ``block_mask.sparsity() / 100`` when the length is a multiple of
    the block size; otherwise torch's figure counts edge blocks as if they were whole and differs.
    """
    for attr in ("kv_num_blocks", "kv_indices", "BLOCK_SIZE", "shape"):
        if not hasattr(block_mask, attr):
            raise PacksimError(
                f"block_sparsity takes a FlexAttention BlockMask, got {type(block_mask).__name__} "
                f"(no {attr!r}). Build one with flex_block_mask(seq_ids)."
            )
    _, _, q_len, kv_len = block_mask.shape
    bq, bk = block_mask.BLOCK_SIZE
    nk = -(-kv_len // bk)
    B, H, nq = block_mask.kv_num_blocks.shape
    grid = torch.zeros(B, H, nq, nk + 1, dtype=torch.int8, device=block_mask.kv_num_blocks.device)
    _block_codes(block_mask.kv_num_blocks, block_mask.kv_indices, nk, 1, grid)
    if block_mask.full_kv_num_blocks is not None:
        _block_codes(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, nk, 2, grid)
    grid = grid[..., :nk].cpu()  # (B, H, nq, nk); column nk was the bin for unused slots
    full, partial = int((grid == 2).sum()), int((grid == 1).sum())
    return BlockSparsity(
        full=full,
        partial=partial,
        skipped=grid.numel() - full - partial,
        total=grid.numel(),
        block_size=(int(bq), int(bk)),
        grid=grid,
    )
