"""Packing statistics: how well packs use their rows, against the lower bound and one example per row.

``packing_stats(lengths, packs, capacity) -> PackingStats``: packs as :func:`packsim.core.packing.pack`
returns them (lists of example indices or Pieces), lengths (n,), checked against each other.
``examples_cut(lengths, packs)``: how many examples are not whole in one pack.

Lessons: 01.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from packsim.core.errors import PacksimError
from packsim.core.pack_lengths import check_capacity, packable_lengths
from packsim.core.packing import Entry, as_piece


@dataclass(frozen=True)
class PackingStats:
    """How well a packing uses its rows, and what one example per row would waste (notebook 01).

    ``total_tokens`` counts the tokens in the packs (fewer than ``sum(lengths)`` only after
    ``overflow="truncate"``). The one-per-row baselines give each example's packed tokens a row of
    their own, padded to the longest example, or to ``capacity`` (an example longer than
    ``capacity``, possible with ``overflow="split"``, then takes several rows). Ratios are 0.0
    when there are no examples.
    """

    n_examples: int
    n_packs: int
    capacity: int
    total_tokens: int
    lower_bound: int  # ceil(total_tokens / capacity): no packing can use fewer rows
    fill_ratio: float  # total_tokens / (n_packs * capacity)
    gap_to_lower_bound: float  # n_packs / lower_bound - 1
    one_per_row_padding_waste: float  # 1 - total_tokens / (n_examples * longest)
    one_per_row_capacity_waste: float  # 1 - total_tokens / (rows * capacity)

    def as_dict(self) -> dict[str, int | float]:
        """The fields as a plain dict (e.g. one row of a results table)."""
        return asdict(self)

    def __str__(self) -> str:
        return (
            f"{self.n_examples} examples, {self.total_tokens} tokens -> {self.n_packs} packs of "
            f"{self.capacity} (lower bound {self.lower_bound}, gap {self.gap_to_lower_bound:.2%}); "
            f"fill {self.fill_ratio:.1%}. One example per row would waste "
            f"{self.one_per_row_padding_waste:.1%} padded to the longest, "
            f"{self.one_per_row_capacity_waste:.1%} padded to capacity."
        )


def packing_stats(
    lengths: Sequence[int] | np.ndarray, packs: Sequence[Sequence[Entry]], capacity: int
) -> PackingStats:
    """Measure ``packs`` (from :func:`pack`) built from ``lengths`` at ``capacity`` (notebook 01).

    Raises:
        PacksimError: when the packs do not match the lengths or capacity they claim to come from.
    """
    capacity = check_capacity(capacity)
    sizes = packable_lengths(lengths)
    kept = _kept_tokens(sizes, packs, capacity)
    total, n, n_packs = int(kept.sum()), len(sizes), len(packs)
    lower_bound = -(-total // capacity)
    rows = int((-(-kept // capacity)).sum())
    return PackingStats(
        n_examples=n,
        n_packs=n_packs,
        capacity=capacity,
        total_tokens=total,
        lower_bound=lower_bound,
        fill_ratio=total / (n_packs * capacity) if n_packs else 0.0,
        gap_to_lower_bound=n_packs / lower_bound - 1 if lower_bound else 0.0,
        one_per_row_padding_waste=1 - total / (n * int(kept.max())) if n else 0.0,
        one_per_row_capacity_waste=1 - total / (rows * capacity) if n else 0.0,
    )


def examples_cut(lengths: Sequence[int] | np.ndarray, packs: Sequence[Sequence[Entry]]) -> int:
    """Examples not whole in one pack: split over several packs, or truncated (notebook 01).

    An example counts once however many pieces it is in; entries are read by :func:`as_piece`.
    """
    sizes = packable_lengths(lengths).tolist()
    pieces = (as_piece(entry, sizes) for entries in packs for entry in entries)
    return len({p.index for p in pieces if p.stop - p.start < sizes[p.index]})


def _kept_tokens(sizes: np.ndarray, packs: Sequence[Sequence[Entry]], capacity: int) -> np.ndarray:
    """Tokens of each example found in ``packs``, shape ``(n_examples,)``, checking the packs fit."""
    lengths = sizes.tolist()
    kept = [0] * len(lengths)
    for p, entries in enumerate(packs):
        load = 0
        for entry in entries:
            if type(entry) is int and 0 <= entry < len(kept):  # fast path: a whole example
                index, size = entry, lengths[entry]
            else:
                index, start, stop = as_piece(entry, lengths)
                size = stop - start
            kept[index] += size
            load += size
        if load > capacity:
            raise PacksimError(
                f"pack {p} holds {load} tokens but capacity is {capacity}; "
                "pass the capacity the packs were built with."
            )
    missing = [i for i, n in enumerate(kept) if n == 0]
    if missing:
        raise PacksimError(
            f"example {missing[0]} is in no pack; pass the same lengths the packs were built "
            "from (and all the packs)."
        )
    return np.asarray(kept, dtype=np.int64)
