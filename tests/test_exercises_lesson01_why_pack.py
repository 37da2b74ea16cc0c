"""Checks of notebook 01_why_pack: the reference solutions pass, typical mistakes fail by name."""

from __future__ import annotations

import math

import pytest

from packsim.course.exercises import show_solution, solution_source
from packsim.course.exercises.lesson01_why_pack import (
    check_ffd_pack,
    check_lower_bound,
    check_padding_waste,
)
from packsim.course.solutions import lesson01_why_pack as sol


def test_solutions_can_be_shown(capsys):
    show_solution(1, "ffd_pack")
    assert "def ffd_pack" in capsys.readouterr().out
    assert "math.ceil" in solution_source(1, "lower_bound")


# --- lower bound --------------------------------------------------------------------------------


def _total(lengths):
    return sum(int(x) for x in lengths)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (lambda lengths, cap: _total(lengths) // cap, "rounded down"),
        (lambda lengths, cap: _total(lengths) // cap + 1, "exactly"),
        (lambda lengths, cap: len(lengths), "number of examples"),
        (lambda lengths, cap: _total(lengths) / cap, "whole numbers"),
        (lambda lengths, cap: round(_total(lengths) / cap), "expected"),
        (lambda lengths, cap: str(math.ceil(_total(lengths) / cap)), "not a number"),
    ],
)
def test_lower_bound_mistakes(wrong, words):
    fb = check_lower_bound(wrong)
    assert not fb.passed and fb.attempted
    assert words in str(fb), fb


# --- padding waste ------------------------------------------------------------------------------


def _global_longest(lengths, bs):
    lengths = [int(x) for x in lengths]
    return 1 - sum(lengths) / (len(lengths) * max(lengths))


def _drop_last(lengths, bs):
    lengths = [int(x) for x in lengths]
    full = len(lengths) // bs * bs
    return sol.padding_waste(lengths[:full], bs)


def _mean_of_batches(lengths, bs):
    lengths = [int(x) for x in lengths]
    fr = [1 - sum(b) / (len(b) * max(b)) for b in (lengths[i : i + bs] for i in range(0, len(lengths), bs))]
    return sum(fr) / len(fr)


def _fill(lengths, bs):
    return 1 - sol.padding_waste(lengths, bs)


def _sorted_first(lengths, bs):
    return sol.padding_waste(sorted(int(x) for x in lengths), bs)


def _pad_over_real(lengths, bs):
    w = sol.padding_waste(lengths, bs)
    return w / (1 - w)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (_global_longest, "longest of the whole list"),
        (_drop_last, "dropped the last"),
        (_mean_of_batches, "averaged the per-batch"),
        (_fill, "share of real tokens"),
        (_sorted_first, "sorted the lengths"),
        (_pad_over_real, "divided padding by the real tokens"),
        (lambda lengths, bs: 0.0, "expected"),
    ],
)
def test_padding_waste_mistakes(wrong, words):
    fb = check_padding_waste(wrong)
    assert not fb.passed and fb.attempted
    assert words in str(fb), fb


def test_padding_waste_edge_case_mistake():
    def list_only(lengths, bs):  # breaks on numpy input: lengths + [] is not concatenation
        if not isinstance(lengths, list):
            return 0.5
        return sol.padding_waste(lengths, bs)

    fb = check_padding_waste(list_only)
    assert not fb.passed and "packsim's padded batches" in str(fb), fb


# --- first-fit decreasing -----------------------------------------------------------------------


def _no_sort(lengths, cap):
    packs, room = [], []
    for i, n in enumerate(int(x) for x in lengths):
        for p, free in enumerate(room):
            if n <= free:
                packs[p].append(i)
                room[p] -= n
                break
        else:
            packs.append([i])
            room.append(cap - n)
    return packs


def _next_fit_decreasing(lengths, cap):
    order = sorted(range(len(lengths)), key=lambda i: -int(lengths[i]))
    packs, room = [], 0
    for i in order:
        if int(lengths[i]) > room:
            packs.append([])
            room = cap
        packs[-1].append(i)
        room -= int(lengths[i])
    return packs


def _lengths_not_indices(lengths, cap):
    return [[int(lengths[i]) for i in p] for p in sol.ffd_pack(lengths, cap)]


def _overfill(lengths, cap):  # '<' vs '<=' the other way round: lets a pack go one token over
    order = sorted(range(len(lengths)), key=lambda i: -int(lengths[i]))
    packs, room = [], []
    for i in order:
        n = int(lengths[i])
        for p, free in enumerate(room):
            if n <= free + 1:
                packs[p].append(i)
                room[p] -= n
                break
        else:
            packs.append([i])
            room.append(cap - n)
    return packs


def _drop_last_example(lengths, cap):
    packs = sol.ffd_pack(lengths, cap)
    packs[-1] = packs[-1][:-1]
    return [p for p in packs if p]


def _twice(lengths, cap):
    packs = sol.ffd_pack(lengths, cap)
    return packs + [[packs[0][0]]] if len(lengths) > 1 else packs


@pytest.mark.parametrize(
    "wrong, words",
    [
        (_no_sort, "data order"),
        (_next_fit_decreasing, "only try the last pack"),
        (_lengths_not_indices, "lengths, not example indices"),
        (_overfill, "over the capacity"),
        (_drop_last_example, "in no pack"),
        (_twice, "packs"),
        (lambda lengths, cap: [list(range(len(lengths)))], "over the capacity"),
        (lambda lengths, cap: [[i] for i in range(len(lengths))], "first-fit decreasing needs"),
        (lambda lengths, cap: 3, "not a list of packs"),
    ],
)
def test_ffd_mistakes(wrong, words):
    fb = check_ffd_pack(wrong)
    assert not fb.passed and fb.attempted
    assert words in str(fb), fb


def _bfd_sorted_positions(lengths, cap):
    """A learner's best-fit decreasing (issue 40): it sorts the lengths and returns positions in the sorted list."""
    ordered = sorted((int(x) for x in lengths), reverse=True)
    packs, room = [], []
    for j, n in enumerate(ordered):
        fits = [p for p, free in enumerate(room) if n <= free]
        if fits:
            best = min(fits, key=lambda p: room[p])
            packs[best].append(j)  # j: a position in `ordered`, not the example's index in `lengths`
            room[best] -= n
        else:
            packs.append([j])
            room.append(cap - n)
    return packs


def _ffd_sorted_positions(lengths, cap):
    ordered = sorted(int(x) for x in lengths)[::-1]
    return sol.ffd_pack(ordered, cap)  # right packs of the sorted list, its positions returned


@pytest.mark.parametrize("wrong", [_bfd_sorted_positions, _ffd_sorted_positions])
def test_ffd_positions_in_the_sorted_list_name_the_index_mapping(wrong):
    # ground truth by hand: [2, 5, 4, 7, 1, 3, 8, 6] sorted is [8, 7, 6, 5, 4, 3, 2, 1]; best and first fit
    # both give [[0, 6], [1, 5], [2, 4], [3, 7]] there (8+2, 7+3, 6+4, 5+1: all fit 10), and pack 3's
    # positions 3, 7 are the examples of lengths 7 and 6 in the data: 13 tokens
    assert wrong([2, 5, 4, 7, 1, 3, 8, 6], 10) == [[0, 6], [1, 5], [2, 4], [3, 7]]
    fb = check_ffd_pack(wrong)
    text = str(fb)
    assert not fb.passed and "pack 3 holds 13 tokens, over the capacity 10" in text, fb
    assert "positions in the sorted list, not the examples' indices" in text and "[5, 1] there, but [7, 6]" in text
    assert "room check is right" in text and "check the room left" not in text
    assert "sorted(range(len(lengths))" in text


def test_ffd_over_capacity_without_a_sorted_reading_still_points_at_the_room():
    fb = check_ffd_pack(_overfill)
    assert "over the capacity" in str(fb) and "check the room left" in str(fb), fb


def test_ffd_accepts_best_fit_and_numpy_ints():
    import numpy as np

    from packsim.core.packing import pack

    def bfd(lengths, cap):  # best fit decreasing is never worse here: it passes too
        return [[np.int64(i) for i in p] for p in pack(lengths, cap, strategy="bfd")]

    assert check_ffd_pack(bfd).passed


# --- other right answers pass: the prompt fixes the value, not the formula or the number type ----


def test_lower_bound_accepts_other_right_answers():
    import numpy as np
    import torch

    answers = {
        "integer ceiling": lambda lengths, cap: -(-_total(lengths) // cap),
        "numpy ceil (a float64 that is whole)": lambda lengths, cap: np.ceil(np.sum(lengths) / cap),
        "a 0-d int tensor": lambda lengths, cap: torch.tensor(np.asarray(lengths)).sum().div(cap).ceil().long(),
    }
    for what, fn in answers.items():
        fb = check_lower_bound(fn)
        assert fb.passed, (what, fb)


def _waste_float32(lengths, bs):
    """Vectorised in float32 torch: off from the exact share by ~1e-8, a 0-d tensor."""
    import torch

    lens = torch.tensor([int(x) for x in lengths], dtype=torch.float32)
    chunks = lens.split(bs)
    slots = sum(len(c) * c.max() for c in chunks)
    return 1 - lens.sum() / slots


def test_padding_waste_accepts_other_right_answers():
    import numpy as np

    def numpy_padded(lengths, bs):  # pad each batch with numpy, count the zeros
        lens = np.asarray(lengths, dtype=np.int64)
        pads = [np.maximum(b.max() - b, 0) for b in np.array_split(lens, range(bs, len(lens), bs))]
        return np.concatenate(pads).sum() / sum(len(b) * b.max() for b in np.array_split(lens, range(bs, len(lens), bs)))

    answers = {
        "float32 tensor": _waste_float32,
        "float32, .item()": lambda lengths, bs: _waste_float32(lengths, bs).item(),
        "numpy, padding counted": numpy_padded,
        "rounded to 4 decimals": lambda lengths, bs: round(sol.padding_waste(lengths, bs), 4),
    }
    for what, fn in answers.items():
        fb = check_padding_waste(fn)
        assert fb.passed, (what, fb)


def test_padding_waste_percent_and_coarse_rounding_fail():
    fb = check_padding_waste(lambda lengths, bs: 100 * sol.padding_waste(lengths, bs))
    assert not fb.passed and "percentage" in str(fb), fb
    fb = check_padding_waste(lambda lengths, bs: round(sol.padding_waste(lengths, bs), 2))
    assert not fb.passed and "expected 0.2388" in str(fb), fb


def test_ffd_accepts_other_right_answers():
    import numpy as np
    import torch

    def argsort_tensors(lengths, cap):  # numpy's unstable argsort (ties in another order), tensor packs
        sizes = np.asarray(lengths)
        packs, room = [], []
        for i in np.argsort(-sizes, kind="quicksort"):
            for p, free in enumerate(room):
                if sizes[i] <= free:
                    packs[p].append(int(i))
                    room[p] -= sizes[i]
                    break
            else:
                packs.append([int(i)])
                room.append(cap - sizes[i])
        return [torch.tensor(p) for p in packs]

    def tuples_reversed(lengths, cap):  # tuples, each pack's indices and the packs in reverse order
        return tuple(tuple(reversed(p)) for p in reversed(sol.ffd_pack(lengths, cap)))

    for what, fn in {"argsort, tensor packs": argsort_tensors, "tuples reversed": tuples_reversed}.items():
        fb = check_ffd_pack(fn)
        assert fb.passed, (what, fb)
