"""Which rank trains which pack: round-robin vs balanced by cost, and the straggler ratio (lesson 10).

In data-parallel training every rank waits for the slowest one at the gradient all-reduce, so
a step takes as long as its most loaded rank. A pack is a list of segment lengths (one per
example piece, e.g. ``batch.row_lengths()[i]``). Two costs:

- ``tokens``: ``sum(lengths)``: what the MLPs, norms and projections cost (linear in tokens);
- ``attention``: ``sum(L(L+1)/2 for L in lengths)``, the causal score pairs of
  :func:`packsim.core.tiles.score_pairs`: what block-diagonal attention costs (each example
  attends to itself only, so the work is quadratic per example, not per pack).

Packs of the same capacity hold about the same tokens, but not the same attention work: a pack
with one long example costs far more attention than a pack of many short ones.

:func:`assign` distributes a step's ``P`` packs over ``R`` ranks: ``round_robin`` (pack ``i`` to
rank ``i % R``, what an order-preserving sampler does) or greedy longest-first by a cost
(``tokens`` or ``attention``: each pack, most expensive first, goes to the currently least loaded
rank; the classic LPT rule, within 4/3 of the best possible maximum). :func:`straggler_ratio` is
``max(loads) / mean(loads)``: 1.0 means no rank waits. ``benchmarks/straggler.py`` measures it.

Lessons: 10.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from packsim.core.errors import PacksimError
from packsim.core.tiles import score_pairs

__all__ = ["COSTS", "METHODS", "pack_costs", "assign", "rank_loads", "straggler_ratio"]

COSTS = ("tokens", "attention")
METHODS = ("round_robin", *COSTS)


def pack_costs(packs: Sequence[Sequence[int]]) -> dict[str, np.ndarray]:
    """``{"tokens": (P,), "attention": (P,)}`` int64 costs of packs given as segment lengths."""
    out = {"tokens": np.zeros(len(packs), dtype=np.int64), "attention": np.zeros(len(packs), dtype=np.int64)}
    for i, pack in enumerate(packs):
        lengths = np.asarray(pack, dtype=np.int64).reshape(-1)
        if lengths.size == 0 or bool((lengths <= 0).any()):
            raise PacksimError(f"pack {i} has lengths {lengths.tolist()}: every pack needs at least one "
                               "segment and every segment a positive length.")
        out["tokens"][i] = lengths.sum()
        out["attention"][i] = score_pairs(lengths).sum()
    return out


def _check_world(n_packs: int, world_size: int) -> None:
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise PacksimError(f"world_size must be a positive int, got {world_size!r}.")
    if n_packs < world_size:
        raise PacksimError(
            f"{n_packs} pack(s) for {world_size} ranks: a rank would have no pack to train on; "
            "raise the examples per step or lower the number of processes."
        )


def assign(packs: Sequence[Sequence[int]], world_size: int, method: str = "round_robin") -> list[list[int]]:
    """Pack indices per rank (R lists, each in increasing order); every rank gets at least one.

    ``method``: ``round_robin``, ``tokens`` or ``attention`` (see the module doc). Deterministic:
    ties go to the lower pack index and the lower rank.
    """
    if method not in METHODS:
        raise PacksimError(f"unknown assignment {method!r}: use one of {list(METHODS)}.")
    costs = pack_costs(packs)
    _check_world(len(packs), world_size)
    if method == "round_robin":
        return [list(range(r, len(packs), world_size)) for r in range(world_size)]
    cost = costs[method]
    order = sorted(range(len(packs)), key=lambda i: (-int(cost[i]), i))  # most expensive first
    heap = [(0, r) for r in range(world_size)]  # (load, rank): least loaded on top
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    for i in order:
        load, r = heapq.heappop(heap)
        ranks[r].append(i)
        heapq.heappush(heap, (load + int(cost[i]), r))
    return [sorted(idx) for idx in ranks]


def rank_loads(assignment: Sequence[Sequence[int]], cost: Sequence[float] | np.ndarray) -> np.ndarray:
    """Total cost per rank (R,) float64 of an assignment (pack indices per rank)."""
    cost = np.asarray(cost, dtype=np.float64)
    return np.array([cost[list(idx)].sum() if len(idx) else 0.0 for idx in assignment])


def straggler_ratio(loads: Sequence[float] | np.ndarray) -> float:
    """``max(loads) / mean(loads)``: how long the step takes relative to a perfect split (>= 1)."""
    loads = np.asarray(loads, dtype=np.float64)
    if loads.size == 0 or not loads.sum() > 0:
        raise PacksimError("loads must be a non-empty list with a positive total (one per rank).")
    return float(loads.max() / loads.mean())
