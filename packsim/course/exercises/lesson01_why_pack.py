"""Checks for the exercises of notebook 01_why_pack (solutions: packsim.course.solutions.lesson01_why_pack).

- :func:`check_lower_bound`: ``lower_bound(lengths, capacity) -> int``;
- :func:`check_padding_waste`: ``padding_waste(lengths, batch_size) -> float``;
- :func:`check_ffd_pack`: ``ffd_pack(lengths, capacity) -> list[list[int]]``.

Each check has its own oracle (hand-computed cases, packsim's packers, packing statistics and
padded batches), and recognises the usual mistakes by name. What the prompt does not fix is free:
a number may be an int, a float, a 0-d tensor or a numpy scalar; a waste share passes within 5e-5
(float32 arithmetic, 4 decimals); packs may be lists, tuples, numpy arrays or 1-D tensors of
indices, and any valid packing with no more rows than FFD passes (best fit, other tie orders).
"""

from __future__ import annotations

import numbers
from collections import Counter

import numpy as np
import torch

from packsim.core.data import examples_with_lengths, long_tailed_lengths
from packsim.core.pack_stats import packing_stats
from packsim.core.packing import pack
from packsim.course.exercises import Feedback, check, fail, ok
from packsim.experiment.training import make_batches

__all__ = ["check_lower_bound", "check_padding_waste", "check_ffd_pack"]


_TOL = 5e-5  # a share: float32 arithmetic and 4 decimals pass; every named mistake is further away


def _is_number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _scalar(x):
    """``x`` as a Python number when it holds one value (a 0-d or one-element tensor / numpy array)."""
    size = x.numel() if callable(getattr(x, "numel", None)) else getattr(x, "size", None)
    return x.item() if size == 1 and callable(getattr(x, "item", None)) else x


# --- lower bound ----------------------------------------------------------------------------------


@check("lower bound on the number of rows")
def check_lower_bound(lower_bound) -> Feedback:
    """``lower_bound(lengths, capacity)``: hand cases, then packsim's ``packing_stats``."""
    cases = [  # (lengths, capacity, expected)
        ([5, 5, 5], 10, 2),  # 1.5 rows: floor says 1
        ([4, 4, 4], 10, 2),  # 1.2 rows: floor and round say 1
        ([10, 10], 10, 2),  # exactly 2: "floor + 1" says 3
        ([1], 512, 1),
        ([100] * 9, 256, 4),  # 3.5 rows
    ]
    lengths = long_tailed_lengths(300, max_len=512, seed=3)  # numpy int64 array (300,)
    cases.append((lengths, 512, packing_stats(lengths, pack(lengths, 512, "ffd"), 512).lower_bound))
    for lens, cap, want in cases:
        got = _scalar(lower_bound(lens, cap))
        shown = f"lower_bound({_short(lens)}, capacity={cap})"
        if not _is_number(got):
            return fail(f"{shown} returned {got!r} ({type(got).__name__}), not a number.",
                        "return one int: the number of rows.")
        if got == want:
            continue
        total = int(np.sum(lens))
        if got == total // cap:
            return fail(f"{shown} returned {got}, expected {want}: you rounded down.",
                        f"{total} tokens need {total / cap:.2f} rows: a partly filled row is still "
                        "a row, so round up (math.ceil, or -(-total // capacity)).")
        if got == total // cap + 1:
            return fail(f"{shown} returned {got}, expected {want}: you added one row even though "
                        f"{total} tokens fill exactly {total // cap} rows.",
                        "use a ceiling, not floor + 1.")
        if got == len(lens):
            return fail(f"{shown} returned {got}, expected {want}: that is the number of examples "
                        "(one per row), not the bound.", "divide the total number of tokens by capacity.")
        if abs(got - total / cap) < 1e-9:
            return fail(f"{shown} returned {got}, expected {want}: rows come in whole numbers.",
                        "round the ratio up to an int.")
        return fail(f"{shown} returned {got}, expected {want} ({total} tokens, capacity {cap}).",
                    "the bound is ceil(sum(lengths) / capacity).")
    return ok("ceil(total tokens / capacity) on every case: no packer can use fewer rows.")


def _short(lens) -> str:
    lens = [int(x) for x in lens]
    return str(lens) if len(lens) <= 10 else f"<{len(lens)} lengths>"


# --- padding waste --------------------------------------------------------------------------------


def _waste_by_packsim(lengths, batch_size: int) -> float:
    """Padding share of packsim's ``padded`` batches (one example per row) of consecutive chunks."""
    examples = examples_with_lengths(lengths)
    batches = make_batches(examples, int(max(lengths)), "padded", batch_size)
    slots = sum(b.input_ids.numel() for b in batches)
    real = sum(b.n_real_tokens for b in batches)
    return (slots - real) / slots


@check("padding waste")
def check_padding_waste(padding_waste) -> Feedback:
    """``padding_waste(lengths, batch_size)``: a hand case with its usual mistakes, then packsim."""
    # hand case: batches [6, 10] [8, 20] [7] -> slots 20 + 40 + 7 = 67, real 51, padding 16
    lens, bs = [6, 10, 8, 20, 7], 2
    want = 16 / 67
    mistakes = {
        16: "you returned the number of padding tokens; divide by all token slots (real + padding).",
        16 / 51: "you divided padding by the real tokens; divide by all slots (real + padding).",
        51 / 67: "you returned the share of real tokens (the fill); padding waste is 1 minus that.",
        49 / 100: "you padded every example to the longest of the whole list (20); pad each batch "
                  "only to its own longest.",
        16 / 60: "you dropped the last, smaller batch ([7]); it is trained on too, so keep it.",
        (4 / 20 + 12 / 40 + 0 / 7) / 3: "you averaged the per-batch fractions; a batch of long rows "
                                        "weighs more: sum padding and slots over all batches first.",
        3 / 54: "you sorted the lengths before batching; keep the "
                                                 "data order (sorting by length is a real trick, "
                                                 "'group by length', but not what this asks).",
        100 * want: "you returned a percentage; return the fraction, a float in [0, 1).",
    }
    got = _scalar(padding_waste(lens, bs))
    shown = f"padding_waste({lens}, batch_size={bs})"
    if not _is_number(got):
        return fail(f"{shown} returned {got!r}, not a number.", "return one float in [0, 1).")
    if abs(got - want) > _TOL:
        for value, why in mistakes.items():
            if abs(got - value) <= _TOL * max(1, abs(value)):
                return fail(f"{shown} returned {got:.4f}, expected {want:.4f}: {why}")
        return fail(f"{shown} returned {got:.4f}, expected {want:.4f}.",
                    "batches [6, 10] [8, 20] [7] are padded to 10, 20 and 7: 16 padding tokens "
                    "out of 67 slots.")
    for lengths, batch_size in [
        ([12, 12, 12], 2),  # nothing to pad
        (long_tailed_lengths(200, max_len=1024, seed=5).tolist(), 16),
        (long_tailed_lengths(37, max_len=512, seed=6), 8),  # numpy input, a partial last batch
        (long_tailed_lengths(50, max_len=512, seed=7).tolist(), 1),
    ]:
        want = _waste_by_packsim(lengths, batch_size)
        got = _scalar(padding_waste(lengths, batch_size))
        if not _is_number(got) or abs(got - want) > _TOL:
            shown = f"padding_waste({_short(lengths)}, batch_size={batch_size})"
            return fail(f"{shown} returned {got!r}, packsim's padded batches give {want:.4f}.",
                        "the hand case passed, so look at the edges: numpy input, a last batch "
                        "smaller than batch_size, batch_size=1 (no padding at all).")
    return ok("padding per batch, weighted by tokens, matches packsim's padded batches.")


# --- first-fit decreasing -------------------------------------------------------------------------


def _first_fit(sizes: list[int], order: list[int], capacity: int) -> list[list[int]]:
    """First fit in the given order (the oracle of a mistake: no sort)."""
    packs, room = [], []
    for i in order:
        for p, free in enumerate(room):
            if sizes[i] <= free:
                packs[p].append(i)
                room[p] -= sizes[i]
                break
        else:
            packs.append([i])
            room.append(capacity - sizes[i])
    return packs


def _next_fit(sizes: list[int], order: list[int], capacity: int) -> list[list[int]]:
    """Next fit in the given order: only the last pack is ever tried (a mistake's oracle)."""
    packs, room = [], 0
    for i in order:
        if sizes[i] > room:
            packs.append([])
            room = capacity
        packs[-1].append(i)
        room -= sizes[i]
    return packs


def _over_capacity(shown: str, packs, sizes: list[int], capacity: int, p: int, load: int) -> Feedback:
    """Pack ``p`` is over capacity: say why, naming a packing of positions in the sorted lengths
    (it fits there, so the room check was right and the index mapping wrong)."""
    for name, ordered in (("longest first", sorted(sizes, reverse=True)), ("shortest first", sorted(sizes))):
        if ordered != sizes and all(sum(ordered[i] for i in q) <= capacity for q in packs):
            entries = list(packs[p])
            return fail(
                f"{shown}: pack {p} holds {load} tokens, over the capacity {capacity}; yet every pack fits when "
                f"its entries are read as positions in the lengths sorted {name}: pack {p}'s {entries} are lengths "
                f"{[ordered[i] for i in entries]} there, but {[sizes[i] for i in entries]} in `lengths`. Your room "
                "check is right; your packs hold positions in the sorted list, not the examples' indices.",
                "sort the indices, not the lengths: order = sorted(range(len(lengths)), key=lambda i: "
                "-lengths[i]), then place and append each i (or sort (length, index) pairs and keep the index).")
    return fail(f"{shown}: pack {p} holds {load} tokens, over the capacity {capacity}.",
                "check the room left (capacity - load) before placing; a fit is length <= room.")


def _canon(packs) -> list[tuple[int, ...]]:
    return sorted(tuple(sorted(p)) for p in packs)


@check("first-fit decreasing packer")
def check_ffd_pack(ffd_pack) -> Feedback:
    """``ffd_pack(lengths, capacity)``: a valid packing with no more rows than FFD on each input."""
    cases = [
        ([3, 3, 3, 7, 7, 7], 10),  # FFD: 3 packs; unsorted first fit or next fit: 4
        ([10, 10, 10], 10),  # every example fills a row
        ([5], 8),
        ([2, 5, 4, 7, 1, 3, 8, 6], 10),
        (long_tailed_lengths(300, max_len=512, seed=11), 512),  # numpy array input
        (long_tailed_lengths(500, median=200, sigma=1.2, max_len=1024, seed=12).tolist(), 1024),
    ]
    for lengths, capacity in cases:
        feedback = _check_one_packing(ffd_pack, lengths, capacity)
        if feedback is not None:
            return feedback
    return ok("every example exactly once, no row over capacity, and as few rows as FFD "
              "on every input (long-tailed ones included).")


def _check_one_packing(ffd_pack, lengths, capacity: int) -> Feedback | None:
    sizes = [int(x) for x in lengths]
    n = len(sizes)
    shown = f"ffd_pack({_short(sizes)}, capacity={capacity})"
    packs = ffd_pack(lengths, capacity)
    if isinstance(packs, np.ndarray):
        packs = packs.tolist()
    if isinstance(packs, (list, tuple)):  # a pack may be a 1-D tensor of indices too
        packs = [p.tolist() if isinstance(p, torch.Tensor) and p.dim() == 1 else p for p in packs]
    if not isinstance(packs, (list, tuple)) or not all(isinstance(p, (list, tuple, np.ndarray))
                                                       for p in packs):
        return fail(f"{shown} returned {type(packs).__name__}, not a list of packs.",
                    "return a list with one list of example indices per pack, e.g. [[3, 0], [1, 2]].")
    packs = [[x.item() if isinstance(x, np.generic) else x for x in p] for p in packs]
    flat = [x for p in packs for x in p]
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in flat):
        bad = next(x for x in flat if not (isinstance(x, int) and not isinstance(x, bool)))
        return fail(f"{shown}: a pack holds {bad!r} ({type(bad).__name__}); packs hold example "
                    "indices (ints).", "append the index i of the example, not the example itself.")
    if Counter(flat) == Counter(sizes) and Counter(flat) != Counter(range(n)):
        return fail(f"{shown}: your packs hold lengths, not example indices.",
                    "put i (the example's index) into the pack, not lengths[i]; the indices are "
                    "what tells the collator which examples share a row.")
    outside = [x for x in flat if not 0 <= x < n]
    if outside:
        return fail(f"{shown}: {outside[0]} is not an example index (there are {n} examples).",
                    "pack indices 0..n-1 into the packs.")
    counts = Counter(flat)
    twice = [i for i, c in counts.items() if c > 1]
    if twice:
        return fail(f"{shown}: example {twice[0]} is in {counts[twice[0]]} packs.",
                    "place each example exactly once: stop looking after the first pack it fits.")
    missing = [i for i in range(n) if i not in counts]
    if missing:
        return fail(f"{shown}: example {missing[0]} (length {sizes[missing[0]]}) is in no pack: "
                    f"{len(missing)} example(s) dropped.",
                    "when no open pack has room, open a new pack for the example.")
    for p, entries in enumerate(packs):
        if not entries:
            return fail(f"{shown}: pack {p} is empty.", "open a pack only for an example that needs it.")
        load = sum(sizes[i] for i in entries)
        if load > capacity:
            return _over_capacity(shown, packs, sizes, capacity, p, load)
    target = len(pack(sizes, capacity, strategy="ffd"))
    if len(packs) <= target:
        return None
    order = list(range(n))
    decreasing = sorted(order, key=lambda i: -sizes[i])
    ascending = sorted(order, key=lambda i: sizes[i])
    mine = _canon(packs)
    if mine == _canon(_first_fit(sizes, order, capacity)):
        why = "you placed the examples in data order: sort them longest first."
    elif mine == _canon(_first_fit(sizes, ascending, capacity)):
        why = "you sorted shortest first: sort longest first (reverse=True)."
    elif mine in (_canon(_next_fit(sizes, decreasing, capacity)), _canon(_next_fit(sizes, order, capacity))):
        why = ("you only try the last pack (next fit): try every open pack from the first, "
               "and place the example in the first one with room.")
    else:
        why = "a valid packing, but it uses more rows than FFD."
    return fail(f"{shown} used {len(packs)} packs; first-fit decreasing needs {target}: {why}",
                "sort indices by length, longest first; for each, scan the open packs in order "
                "and use the first with enough room, else open a new pack.")
