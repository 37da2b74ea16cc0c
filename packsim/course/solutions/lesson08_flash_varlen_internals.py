"""Reference solutions for notebook 08_flash_varlen_internals (checks: packsim.course.exercises.lesson08_flash_varlen_internals)."""

from __future__ import annotations

import math

import torch


def count_tiles(lengths: list[int], tile: int) -> int:
    """(query tile, key tile) pairs a causal varlen kernel computes for a pack of ``lengths``.

    Tiles start at each sequence's own offset, so no tile straddles two sequences. A sequence of
    L tokens has n = ceil(L / tile) query tiles; causal query tile i needs key tiles 0..i.
    """
    total = 0
    for L in lengths:
        n = math.ceil(L / tile)  # the last tile may be shorter
        total += n * (n + 1) // 2  # key tiles 0..i for query tile i
    return total


def work_ratio(lengths: list[int]) -> float:
    """Share of the dense N x N score matrix that per-sequence attention computes: sum L^2 / N^2."""
    N = sum(lengths)
    return sum(L * L for L in lengths) / N**2


def classify_tiles(lengths: list[int], tile: int) -> torch.Tensor:
    """Pack-aligned causal tile map (n, n) int8: 0 skipped, 1 partial, 2 full; n = ceil(N / tile)."""
    seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))  # (N,)
    N = seq.numel()
    n = math.ceil(N / tile)
    grid = torch.zeros(n, n, dtype=torch.int8)
    for i in range(n):  # query tile
        q0, q1 = i * tile, min((i + 1) * tile, N)
        for j in range(i + 1):  # key tiles right of the diagonal hold only future keys: skipped
            k0, k1 = j * tile, min((j + 1) * tile, N)
            q_seqs, k_seqs = set(seq[q0:q1].tolist()), set(seq[k0:k1].tolist())
            if not q_seqs & k_seqs:
                continue  # different examples only: skipped
            whole = (q1 - q0) == tile and (k1 - k0) == tile
            one_seq = len(q_seqs) == 1 and q_seqs == k_seqs
            grid[i, j] = 2 if (whole and one_seq and j < i) else 1
    return grid
