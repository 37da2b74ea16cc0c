"""Tiles and work: which (query tile, key tile) blocks attention computes over a pack, and how much.

A pack of ``N`` tokens holds ``S`` sequences, ``cu_seqlens`` (S+1,) int32; kernels work on
``tile x tile`` blocks of the (N, N) score matrix. :func:`tile_grid` classifies each tile of the
pack-aligned grid (a block-sparse kernel such as FlexAttention's ``BlockMask``) as ``SKIPPED``,
``PARTIAL`` (the mask applied per element) or ``FULL``: the one tile classifier, used by the work
accounting and the tile map (:mod:`packsim.viz.tiles`). :func:`varlen_tiles` lists a flash-style
kernel's tiles, which start at each sequence's own offset. :func:`score_pairs` is the one count of
attention work: ``L(L+1)/2`` causal pairs per sequence of ``L`` tokens (``L^2`` unmasked);
:func:`attention_work` adds up pairs (dense N^2, causal over the pack, varlen) and tiles.

Lessons: 03, 06, 08, 09, A7.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

import torch

from packsim.core.errors import PacksimError
from packsim.core.segments import check_cu_seqlens, seq_ids_from_cu_seqlens

__all__ = [
    "SKIPPED",
    "PARTIAL",
    "FULL",
    "TILE_KINDS",
    "tile_grid",
    "varlen_tiles",
    "AttentionWork",
    "attention_work",
    "score_pairs",
]

SKIPPED, PARTIAL, FULL = 0, 1, 2
TILE_KINDS = ("skipped", "partial", "full")  # name of each code of :func:`tile_grid`


def _check_tile(tile) -> int:
    if isinstance(tile, bool) or not isinstance(tile, int) or tile < 1:
        raise PacksimError(f"tile must be a positive int (e.g. 128), got {tile!r}.")
    return tile


def _offsets(cu_seqlens) -> list[int]:
    """cu_seqlens checked (int32, starts at 0, non-decreasing) as a list of offsets."""
    total = (
        int(cu_seqlens[-1]) if isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.numel() else 0
    )
    return check_cu_seqlens(cu_seqlens, total)


def tile_grid(cu_seqlens: torch.Tensor, tile: int, causal: bool = True) -> torch.Tensor:
    """Pack-aligned tile map (n, n) int8 of ``SKIPPED`` 0, ``PARTIAL`` 1, ``FULL`` 2.

    ``cu_seqlens`` (S+1,) int32, ``n = ceil(N / tile)``; row = query tile, column = key tile.
    A tile is computed when some query in its rows may see some key in its columns (same
    sequence, and key <= query if ``causal``); it is full when every pair in it may, which needs
    a whole tile (ragged edge tiles count as partial, as FlexAttention counts them). No (N, N)
    mask is built: each tile is described by the first and last sequence id it covers.
    """
    _offsets(cu_seqlens)
    _check_tile(tile)
    ids = seq_ids_from_cu_seqlens(cu_seqlens.cpu())  # (N,) non-decreasing
    N = ids.numel()
    n = math.ceil(N / tile)
    start = torch.arange(n) * tile  # (n,)
    stop = torch.clamp(start + tile, max=N)  # (n,)
    lo, hi = ids[start], ids[stop - 1]  # (n,) sequence ids covered by each tile (ids ascend)
    shared = (lo[:, None] <= hi[None, :]) & (lo[None, :] <= hi[:, None])  # (n, n) a common seq
    one = (lo == hi) & ((stop - start) == tile)  # (n,) a whole tile inside a single sequence
    full = one[:, None] & one[None, :] & (lo[:, None] == lo[None, :])  # (n, n)
    if causal:
        q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
        shared = shared & (k <= q)  # a key tile right of the query tile holds only future keys
        full = full & ((k < q) if tile > 1 else (k <= q))  # a diagonal tile is half masked
    grid = torch.full((n, n), SKIPPED, dtype=torch.int8)
    grid[shared] = PARTIAL
    grid[full] = FULL
    return grid


def varlen_tiles(cu_seqlens: torch.Tensor, tile: int, causal: bool = True) -> list[tuple]:
    """Tiles a flash-style varlen kernel visits: ``(q0, q1, k0, k1)`` token ranges, per sequence.

    Tiles start at each sequence's offset; ``causal`` keeps key tiles at or left of the query
    tile. Their number is ``sum_i T(ceil(L_i / tile))`` with ``T(m) = m(m+1)/2`` causal, else
    ``m^2`` (:attr:`AttentionWork.varlen_tiles`).
    """
    offs = _offsets(cu_seqlens)
    _check_tile(tile)
    out = []
    for a, b in pairwise(offs):
        n = math.ceil((b - a) / tile)
        for i in range(n):
            q0, q1 = a + i * tile, min(a + (i + 1) * tile, b)
            for j in range(i + 1 if causal else n):
                out.append((q0, q1, a + j * tile, min(a + (j + 1) * tile, b)))
    return out


@dataclass(frozen=True)
class AttentionWork:
    """How much attention work a pack needs, dense vs varlen (see :func:`attention_work`).

    Pair counts are (query, key) scores. Tile counts (when ``tile`` is set) are
    ``tile x tile`` blocks: ``tiles_*`` on the pack-aligned grid (FlexAttention's view: full,
    partial or skipped, from :func:`tile_grid`), ``varlen_tiles`` per sequence (what a
    flash-style varlen kernel visits).
    """

    tokens: int
    num_seqs: int
    causal: bool
    dense_pairs: int
    pack_pairs: int
    varlen_pairs: int
    tile: int | None = None
    tiles_total: int | None = None
    tiles_full: int | None = None
    tiles_partial: int | None = None
    tiles_skipped: int | None = None
    varlen_tiles: int | None = None

    @property
    def tiles_computed(self) -> int | None:
        """Pack-grid tiles a block-sparse kernel visits (full + partial)."""
        return None if self.tile is None else self.tiles_full + self.tiles_partial

    @property
    def saving(self) -> float:
        """dense_pairs / varlen_pairs: how many times less score work varlen does."""
        return self.dense_pairs / self.varlen_pairs


def score_pairs(length, causal: bool = True):
    """(query, key) score pairs attention computes over a sequence of ``length`` tokens.

    ``L(L+1)/2`` causal (query ``p`` sees keys ``0..p``), ``L^2`` without the mask. ``length`` is
    an int or an integer array / tensor (elementwise, same shape). The keys a causal query run
    ``[a, b)`` of a sequence scores are ``score_pairs(b) - score_pairs(a)``.
    """
    return length * (length + 1) // 2 if causal else length * length


def attention_work(
    cu_seqlens: torch.Tensor, causal: bool = True, tile: int | None = None
) -> AttentionWork:
    """Score pairs (and tiles) computed by dense-mask attention vs a varlen kernel for one pack.

    ``cu_seqlens`` (S+1,) int32. ``dense_pairs`` = N^2 (SDPA with a dense mask skips nothing);
    ``pack_pairs`` = N(N+1)/2 causal (a causal kernel over the whole pack: the leaky setup; N^2
    without ``causal``); ``varlen_pairs`` = sum L_i(L_i+1)/2 causal or sum L_i^2. With
    ``tile=128``, also counts the tiles of :func:`tile_grid` and of :func:`varlen_tiles`.
    """
    offs = _offsets(cu_seqlens)
    if tile is not None and (isinstance(tile, bool) or not isinstance(tile, int) or tile < 1):
        raise PacksimError(f"tile must be a positive int (e.g. 128) or None, got {tile!r}.")
    lengths = [b - a for a, b in pairwise(offs)]
    N = offs[-1]
    work = dict(
        tokens=N,
        num_seqs=len(lengths),
        causal=causal,
        dense_pairs=N * N,
        pack_pairs=score_pairs(N, causal),
        varlen_pairs=sum(score_pairs(L, causal) for L in lengths),
    )
    if tile is None:
        return AttentionWork(**work)
    grid = tile_grid(cu_seqlens, tile, causal)  # (n, n)
    return AttentionWork(
        **work,
        tile=tile,
        tiles_total=grid.numel(),
        tiles_full=int((grid == FULL).sum()),
        tiles_partial=int((grid == PARTIAL).sum()),
        tiles_skipped=int((grid == SKIPPED).sum()),
        varlen_tiles=sum(score_pairs(math.ceil(L / tile), causal) for L in lengths),  # tile pairs
    )
