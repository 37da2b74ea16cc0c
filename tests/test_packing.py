"""Tests for packsim.core.packing: exact small cases, property tests for every strategy and overflow
policy (checked against a naive reference packer), the columnar result (``pack_arrays``) against
the loop implementation, statistics, and bad input."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packsim.core.errors import PacksimError
from packsim.core.pack_result import PackArrays
from packsim.core.pack_stats import PackingStats, examples_cut, packing_stats
from packsim.core.packing import (
    OVERFLOW_POLICIES,
    STRATEGIES,
    Piece,
    _place,
    as_piece,
    pack,
    pack_arrays,
    pack_pieces,
)

PROPERTY = settings(max_examples=300, deadline=None)
DECREASING = ("ffd", "bfd")


@st.composite
def cases(draw, longest: int = 3) -> tuple[list[int], int]:
    """(lengths, capacity); lengths reach ``longest`` times the capacity (1: none overflow)."""
    capacity = draw(st.integers(1, 16))
    lengths = draw(st.lists(st.integers(1, longest * capacity), max_size=30))
    return lengths, capacity


def fitting(overflow: str) -> st.SearchStrategy:
    """Cases valid for ``overflow``: only "error" needs every example to fit."""
    return cases(longest=1 if overflow == "error" else 3)


ALL_COMBOS = [(s, o) for s in STRATEGIES for o in OVERFLOW_POLICIES]
DECREASING_COMBOS = [(s, o) for s in DECREASING for o in OVERFLOW_POLICIES]


def loads(packs: list[list[Piece]]) -> list[int]:
    return [sum(p.stop - p.start for p in pieces) for pieces in packs]


def naive_pack(lengths: list[int], capacity: int, best: bool) -> list[list[int]]:
    """Reference first/best-fit decreasing by scanning every pack (whole examples only)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # sorted() is stable
    packs: list[list[int]] = []
    room: list[int] = []
    for i in order:
        fits = [p for p in range(len(packs)) if room[p] >= lengths[i]]
        if not fits:
            packs.append([])
            room.append(capacity)
            fits = [len(packs) - 1]
        p = min(fits, key=lambda q: (room[q], q)) if best else fits[0]
        packs[p].append(i)
        room[p] -= lengths[i]
    return packs


# --- reference: the loop implementation before the numpy version (issue 16) --------------------
# A verbatim copy of packsim.core.packing's wrapped packer and item/entry building as they were
# before they were vectorised; the heap placement (_place) is unchanged and imported.


def reference_pack(lengths: list[int], capacity: int, strategy: str, overflow: str) -> list[list]:
    """pack() as it was before the numpy version, for valid input only."""
    sizes = np.asarray(lengths, dtype=np.int64)
    if strategy == "wrapped":
        return _reference_wrapped(sizes, capacity)
    index, start, stop = _reference_items(sizes, capacity, overflow)
    entries = _reference_entries(index, start, stop, sizes)
    item_sizes = stop - start
    if strategy == "sequential":
        packs: list[list] = []
        room = 0
        for entry, size in zip(entries, item_sizes.tolist(), strict=True):
            if size > room:
                packs.append([])
                room = capacity
            packs[-1].append(entry)
            room -= size
        return packs
    order = np.argsort(-item_sizes, kind="stable")
    placed = np.asarray(_place(item_sizes[order].tolist(), capacity, strategy == "bfd"), dtype=np.int64)
    by_pack = order[np.argsort(placed, kind="stable")]
    flat = [entries[k] for k in by_pack.tolist()]
    bounds = [0, *np.cumsum(np.bincount(placed)).tolist()]
    return [flat[a:b] for a, b in pairwise(bounds)]


def _reference_wrapped(sizes: np.ndarray, capacity: int) -> list[list]:
    ends = np.cumsum(sizes)
    n_packs = -(-int(ends[-1]) // capacity) if len(sizes) else 0
    packs: list[list] = [[] for _ in range(n_packs)]
    for i, (a, b) in enumerate(zip((ends - sizes).tolist(), ends.tolist(), strict=True)):
        first, last = a // capacity, (b - 1) // capacity
        if first == last:
            packs[first].append(i)
            continue
        for p in range(first, last + 1):
            lo, hi = max(a, p * capacity), min(b, (p + 1) * capacity)
            packs[p].append(Piece(i, lo - a, hi - a))
    return packs


def _reference_items(sizes: np.ndarray, capacity: int, overflow: str):
    if overflow != "split":
        return np.arange(len(sizes)), np.zeros_like(sizes), np.minimum(sizes, capacity)
    chunks = -(-sizes // capacity)
    index = np.repeat(np.arange(len(sizes)), chunks)
    first_chunk = np.repeat(np.cumsum(chunks) - chunks, chunks)
    start = (np.arange(len(index)) - first_chunk) * capacity
    return index, start, np.minimum(start + capacity, sizes[index])


def _reference_entries(index, start, stop, sizes) -> list:
    entries: list = index.tolist()
    for k in np.flatnonzero((start > 0) | (stop < sizes[index])).tolist():
        entries[k] = Piece(entries[k], int(start[k]), int(stop[k]))
    return entries


def typed(packs: list[list]) -> list[list[tuple]]:
    """Packs with each entry's exact type, so a plain tuple never passes for a Piece."""
    return [[(type(e), tuple(e) if isinstance(e, tuple) else e) for e in p] for p in packs]


# --- exact small examples -----------------------------------------------------------------------


def test_ffd_and_bfd_differ_on_hand_computed_case():
    # Longest first: 7 (ex 1) opens A (room 3); 5 (ex 3) opens B (room 5); 4 (ex 0) only fits B
    # (room 1); 1 (ex 2) fits both: first fit takes A (opened first), best fit takes B (least room).
    assert pack([4, 7, 1, 5], 10, "ffd") == [[1, 2], [3, 0]]
    assert pack([4, 7, 1, 5], 10, "bfd") == [[1], [3, 0, 2]]


def test_ffd_and_bfd_on_seven_examples():
    # 5->A(3) 4->B(4) 3->A(0) 3->B(1) 2->C(6) 2->C(4) 1->B(0): both strategies agree here.
    expected = [[0, 2], [1, 3, 6], [4, 5]]
    assert pack([5, 4, 3, 3, 2, 2, 1], 8, "ffd") == expected
    assert pack([5, 4, 3, 3, 2, 2, 1], 8, "bfd") == expected


def test_ties_keep_data_order():
    assert pack([2, 2, 2, 2], 4, "ffd") == [[0, 1], [2, 3]]
    assert pack([3, 3, 3], 4, "bfd") == [[0], [1], [2]]


def test_wrapped_cuts_every_capacity_tokens():
    assert pack([2, 2, 3], 4, "wrapped") == [[0, 1], [2]]
    assert pack([10, 3], 4, "wrapped") == [
        [Piece(0, 0, 4)],
        [Piece(0, 4, 8)],
        [Piece(0, 8, 10), Piece(1, 0, 2)],
        [Piece(1, 2, 3)],
    ]


def test_wrapped_ignores_overflow_policy():
    assert pack([10, 3], 4, "wrapped", "error") == pack([10, 3], 4, "wrapped", "split")


def test_sequential_is_next_fit_in_data_order():
    # 3 fits after 2 (room 3 of 8 left), 4 does not: new pack; 1 fits after 4; 6 opens a third.
    assert pack([2, 3, 4, 1, 6], 8, "sequential") == [[0, 1], [2, 3], [4]]
    # an earlier pack is never revisited (first fit would put the final 1 into pack 0)
    assert pack([6, 8, 1], 8, "sequential") == [[0], [1], [2]]
    lengths = np.random.default_rng(0).integers(1, 50, size=300).tolist()
    flat = [e for p in pack(lengths, 64, "sequential") for e in p]
    assert flat == list(range(300))


def test_truncate_keeps_first_capacity_tokens():
    assert pack([10, 3], 4, "bfd", "truncate") == [[Piece(0, 0, 4)], [1]]


def test_split_packs_each_chunk_as_an_item():
    # Items longest first: (0,0-4) (0,4-8) 3 (0,8-10); the last 2 tokens do not fit the room 1.
    assert pack([10, 3], 4, "bfd", "split") == [
        [Piece(0, 0, 4)],
        [Piece(0, 4, 8)],
        [1],
        [Piece(0, 8, 10)],
    ]


def test_empty_lengths_give_no_packs():
    for strategy in STRATEGIES:
        assert pack([], 8, strategy) == []


def test_pack_pieces_and_as_piece():
    assert pack_pieces([4, 7, 1, 5], 10, "bfd") == [
        [Piece(1, 0, 7)],
        [Piece(3, 0, 5), Piece(0, 0, 4), Piece(2, 0, 1)],
    ]
    assert as_piece(2, [4, 7, 1]) == Piece(2, 0, 1)
    assert as_piece(Piece(0, 1, 3), [4]) == Piece(0, 1, 3)


def test_numpy_tuple_and_list_inputs_agree():
    lengths = [5, 4, 3, 3, 2, 2, 1]
    expected = pack(lengths, 8)
    assert pack(tuple(lengths), 8) == expected
    assert pack(np.array(lengths, dtype=np.int32), np.int64(8)) == expected
    assert pack(np.array(lengths, dtype=np.uint16), 8) == expected


def test_packing_stats_exact():
    stats = packing_stats([4, 7, 1, 5], pack([4, 7, 1, 5], 10, "bfd"), 10)
    assert stats == PackingStats(
        n_examples=4,
        n_packs=2,
        capacity=10,
        total_tokens=17,
        lower_bound=2,
        fill_ratio=17 / 20,
        gap_to_lower_bound=0.0,
        one_per_row_padding_waste=1 - 17 / 28,
        one_per_row_capacity_waste=1 - 17 / 40,
    )
    assert stats.as_dict()["fill_ratio"] == 0.85
    assert "2 packs" in str(stats) and "lower bound 2" in str(stats)


def test_packing_stats_after_truncate_and_split():
    truncated = packing_stats([10, 3], pack([10, 3], 4, "ffd", "truncate"), 4)
    assert (truncated.total_tokens, truncated.n_packs, truncated.lower_bound) == (7, 2, 2)
    assert truncated.one_per_row_capacity_waste == 1 - 7 / 8
    split = packing_stats([10, 3], pack([10, 3], 4, "ffd", "split"), 4)
    assert (split.total_tokens, split.n_packs, split.lower_bound) == (13, 4, 4)
    assert split.one_per_row_capacity_waste == 1 - 13 / 16  # example 0 takes 3 rows of 4
    assert split.gap_to_lower_bound == 0.0


def _cut_by_hand(lengths, packs) -> int:
    """Examples in more than one pack, or with fewer tokens in the packs than they have."""
    where, tokens = Counter(), Counter()
    for pieces in packs:
        for i, a, b in [(e, 0, lengths[e]) if isinstance(e, int) else tuple(e) for e in pieces]:
            where[i] += 1
            tokens[i] += b - a
    return sum(1 for i, n in enumerate(lengths) if where[i] > 1 or tokens[i] < n)


@pytest.mark.parametrize(("strategy", "overflow"), [("wrapped", "error"), ("ffd", "truncate"),
                                                    ("bfd", "split"), ("sequential", "error")])
def test_examples_cut_counts_split_and_truncated_examples(strategy, overflow):
    lengths = [9, 3, 4, 2, 7, 1] if overflow != "error" else [3, 4, 2, 3, 1, 4]
    packs = pack(lengths, 5, strategy, overflow)
    assert examples_cut(lengths, packs) == _cut_by_hand(lengths, packs)
    if strategy == "sequential":
        assert examples_cut(lengths, packs) == 0
    else:
        assert examples_cut(lengths, packs) > 0


def test_packing_stats_empty():
    stats = packing_stats([], [], 8)
    assert (stats.n_packs, stats.lower_bound, stats.fill_ratio) == (0, 0, 0.0)


# --- properties ---------------------------------------------------------------------------------


def check_tokens_land_once_in_order(lengths, capacity, packs, truncates):
    """Each example's pieces, in pack order, tile [0, length) (or [0, capacity) if truncated)."""
    by_example: dict[int, list[Piece]] = {i: [] for i in range(len(lengths))}
    for pieces in packs:
        for piece in pieces:
            by_example[piece.index].append(piece)
    for i, pieces in by_example.items():
        assert pieces[0].start == 0
        assert all(a.stop == b.start for a, b in zip(pieces, pieces[1:], strict=False))
        assert all(p.start < p.stop for p in pieces)
        assert pieces[-1].stop == (min(lengths[i], capacity) if truncates else lengths[i])


def check_pack_count(capacity, packs, wrapped):
    """At least ceil(tokens / capacity) packs; wrapped hits it exactly with all but one full."""
    lower_bound = math.ceil(sum(loads(packs)) / capacity)
    assert len(packs) >= lower_bound
    if wrapped:
        assert len(packs) == lower_bound
        assert all(load == capacity for load in loads(packs)[:-1])


def check_entry_forms(lengths, raw_packs):
    """An int entry is a whole example; a Piece is never the whole example."""
    for entries in raw_packs:
        for entry in entries:
            if isinstance(entry, Piece):
                assert (entry.start, entry.stop) != (0, lengths[entry.index])
            else:
                assert type(entry) is int and 0 <= entry < len(lengths)


def check_first_fit_property(capacity, packs):
    """No two packs would fit together in one (checking the two lightest is enough)."""
    smallest = sorted(loads(packs))[:2]
    assert len(smallest) < 2 or sum(smallest) > capacity


def check_longest_first(packs):
    for pieces in packs:
        sizes = [p.stop - p.start for p in pieces]
        assert sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize(("strategy", "overflow"), ALL_COMBOS)
@PROPERTY
@given(data=st.data())
def test_packing_invariants(strategy, overflow, data):
    lengths, capacity = data.draw(fitting(overflow))
    raw_packs = pack(lengths, capacity, strategy, overflow)
    packs = pack_pieces(lengths, capacity, strategy, overflow)
    assert packs == [[as_piece(e, lengths) for e in entries] for entries in raw_packs]
    assert all(0 < load <= capacity for load in loads(packs))  # fits, never empty
    truncates = overflow == "truncate" and strategy != "wrapped"
    check_tokens_land_once_in_order(lengths, capacity, packs, truncates)
    check_pack_count(capacity, packs, wrapped=strategy == "wrapped")
    check_entry_forms(lengths, raw_packs)
    if strategy in DECREASING:
        check_first_fit_property(capacity, packs)
        check_longest_first(packs)


@pytest.mark.parametrize("overflow", OVERFLOW_POLICIES)
@PROPERTY
@given(data=st.data())
def test_ffd_and_bfd_pack_the_same_pieces_deterministically(overflow, data):
    lengths, capacity = data.draw(fitting(overflow))
    results = {}
    for strategy in DECREASING:
        first = pack_pieces(lengths, capacity, strategy, overflow)
        assert pack_pieces(lengths, capacity, strategy, overflow) == first
        results[strategy] = Counter(piece for pieces in first for piece in pieces)
    assert results["ffd"] == results["bfd"]


@pytest.mark.parametrize("strategy", DECREASING)
@settings(max_examples=500, deadline=None)
@given(case=cases(longest=1))
def test_matches_naive_reference(strategy, case):
    lengths, capacity = case
    assert pack(lengths, capacity, strategy) == naive_pack(lengths, capacity, strategy == "bfd")


def test_larger_seeded_input_matches_naive_reference():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 200, size=2000).tolist()
    for strategy in DECREASING:
        assert pack(lengths, 256, strategy) == naive_pack(lengths, 256, strategy == "bfd")


@st.composite
def wide_cases(draw) -> tuple[list[int], int]:
    """(lengths, capacity) with more examples, some many times the capacity, some exactly it."""
    capacity = draw(st.integers(1, 64))
    length = st.one_of(st.integers(1, 6 * capacity), st.just(capacity), st.integers(1, 3))
    return draw(st.lists(length, max_size=200)), capacity


@pytest.mark.parametrize(("strategy", "overflow"), ALL_COMBOS)
@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_same_packs_as_the_loop_implementation(strategy, overflow, data):
    lengths, capacity = data.draw(st.one_of(fitting(overflow), wide_cases()))
    if overflow == "error" and strategy != "wrapped":
        lengths = [min(n, capacity) for n in lengths]
    expected = typed(reference_pack(lengths, capacity, strategy, overflow))
    assert typed(pack(lengths, capacity, strategy, overflow)) == expected
    assert typed(pack(np.asarray(lengths, dtype=np.int32), capacity, strategy, overflow)) == expected


def test_same_packs_as_the_loop_implementation_on_a_large_mix():
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(np.log(90), 1.0, size=5_000).astype(np.int64), 1, 2048)
    for capacity in (64, 512, 2048):
        for strategy, overflow in ALL_COMBOS:
            if overflow == "error" and strategy != "wrapped":
                continue
            expected = typed(reference_pack(lengths.tolist(), capacity, strategy, overflow))
            assert typed(pack(lengths, capacity, strategy, overflow)) == expected, (capacity, strategy)


def test_packing_leaves_the_garbage_collector_as_it_was():
    import gc

    assert gc.isenabled()
    pack([10, 3], 4, "wrapped")
    assert gc.isenabled()
    gc.disable()
    try:
        pack([10, 3], 4, "bfd", "split")
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(PacksimError):
        pack([10, 3], 4, "bfd")
    assert gc.isenabled()


@PROPERTY
@given(case=cases(longest=3), strategy=st.sampled_from(STRATEGIES))
def test_packing_stats_agree_with_packs(case, strategy):
    lengths, capacity = case
    packs = pack(lengths, capacity, strategy, "split")
    stats = packing_stats(lengths, packs, capacity)
    assert stats.n_packs == len(packs)
    assert stats.total_tokens == sum(lengths)
    assert stats.lower_bound == math.ceil(sum(lengths) / capacity)
    if lengths:
        assert 0 < stats.fill_ratio <= 1
        assert stats.gap_to_lower_bound >= 0


# --- the columnar result (pack_arrays) ---------------------------------------------------------


def arrays_of(packs: list[list], lengths: list[int]) -> tuple[list[int], list[int], list[int], list[int]]:
    """(index, start, length, row_offsets) read off list-of-lists packs, row after row."""
    pieces = [as_piece(e, lengths) for p in packs for e in p]
    offsets = [0]
    for p in packs:
        offsets.append(offsets[-1] + len(p))
    return ([p.index for p in pieces], [p.start for p in pieces], [p.stop - p.start for p in pieces],
            offsets)


def check_pack_arrays(arrays: PackArrays, lengths: list[int], capacity: int) -> None:
    """Shapes, dtypes, read-only arrays, no empty or overfull row, pieces inside their examples."""
    fields = (arrays.index, arrays.start, arrays.length, arrays.row_offsets, arrays.example_lengths)
    assert all(a.ndim == 1 and not a.flags.writeable for a in fields)
    # small packings: int32 piece arrays (the int64 fallback: test_pack_arrays_dtype_*)
    assert [a.dtype for a in fields] == [np.int32] * 4 + [np.int64]
    assert len(arrays.index) == len(arrays.start) == len(arrays.length) == arrays.n_pieces
    assert arrays.example_lengths.tolist() == list(lengths)
    assert arrays.row_offsets[0] == 0 and arrays.row_offsets[-1] == arrays.n_pieces
    assert np.all(np.diff(arrays.row_offsets) > 0)  # no empty row
    assert np.all((arrays.length > 0) & (arrays.start >= 0))
    assert np.all(arrays.start + arrays.length <= arrays.example_lengths[arrays.index])
    row_lengths = arrays.row_lengths()
    assert row_lengths.shape == (arrays.n_rows,) and np.all((row_lengths > 0) & (row_lengths <= capacity))
    assert row_lengths.sum() == arrays.length.sum()


def test_pack_arrays_exact_wrapped_case():
    arrays = pack_arrays([10, 3], 4, "wrapped")
    assert arrays.index.tolist() == [0, 0, 0, 1, 1]
    assert arrays.start.tolist() == [0, 4, 8, 0, 2]
    assert arrays.length.tolist() == [4, 4, 2, 2, 1]
    assert arrays.row_offsets.tolist() == [0, 1, 2, 4, 5]
    assert (arrays.n_rows, arrays.n_pieces) == (4, 5)
    assert arrays.row_lengths().tolist() == [4, 4, 4, 1]
    assert arrays.whole().tolist() == [False] * 5
    assert arrays.to_lists() == pack([10, 3], 4, "wrapped")


def test_pack_arrays_exact_bfd_case():
    arrays = pack_arrays([4, 7, 1, 5], 10, "bfd")  # rows [[1], [3, 0, 2]]
    assert arrays.index.tolist() == [1, 3, 0, 2]
    assert arrays.start.tolist() == [0, 0, 0, 0]
    assert arrays.length.tolist() == [7, 5, 4, 1]
    assert arrays.row_offsets.tolist() == [0, 1, 4]
    assert arrays.whole().all()
    assert arrays.to_lists() == [[1], [3, 0, 2]]
    assert arrays.to_pieces() == pack_pieces([4, 7, 1, 5], 10, "bfd")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_pack_arrays_of_no_examples(strategy):
    arrays = pack_arrays([], 8, strategy)
    assert (arrays.n_rows, arrays.n_pieces) == (0, 0)
    assert arrays.row_offsets.tolist() == [0]
    assert arrays.row_lengths().tolist() == []
    assert arrays.to_lists() == arrays.to_pieces() == []


def test_pack_arrays_is_frozen_and_read_only():
    arrays = pack_arrays([3, 5, 2], 4, "wrapped")
    with pytest.raises(dataclasses.FrozenInstanceError):
        arrays.index = np.zeros(3, dtype=np.int64)
    with pytest.raises(ValueError, match="read-only"):
        arrays.length[0] = 1


def test_pack_arrays_leaves_the_callers_lengths_alone():
    lengths = np.array([3, 5, 2], dtype=np.int64)
    arrays = pack_arrays(lengths, 4, "wrapped")
    assert lengths.flags.writeable and not np.shares_memory(lengths, arrays.example_lengths)


@pytest.mark.parametrize(("strategy", "overflow"), ALL_COMBOS)
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_pack_arrays_gives_the_loop_implementations_packs(strategy, overflow, data):
    """The arrays read off the loop implementation's packs, piece for piece; and back to lists."""
    lengths, capacity = data.draw(st.one_of(fitting(overflow), wide_cases()))
    if overflow == "error" and strategy != "wrapped":
        lengths = [min(n, capacity) for n in lengths]
    expected = reference_pack(lengths, capacity, strategy, overflow)
    for given_lengths in (lengths, np.asarray(lengths, dtype=np.int32)):
        arrays = pack_arrays(given_lengths, capacity, strategy, overflow)
        check_pack_arrays(arrays, lengths, capacity)
        got = (arrays.index.tolist(), arrays.start.tolist(), arrays.length.tolist(), arrays.row_offsets.tolist())
        assert got == arrays_of(expected, lengths)
        assert typed(arrays.to_lists()) == typed(expected)
        assert arrays.whole().tolist() == [not isinstance(e, Piece) for p in expected for e in p]
        assert arrays.to_pieces() == [[as_piece(e, lengths) for e in p] for p in expected]


def test_pack_arrays_gives_the_loop_implementations_packs_on_a_large_mix():
    rng = np.random.default_rng(1)
    lengths = np.clip(rng.lognormal(np.log(90), 1.0, size=20_000).astype(np.int64), 1, 2048)
    for capacity in (100, 512, 8192):
        for strategy, overflow in ALL_COMBOS:
            if overflow == "error" and strategy != "wrapped" and lengths.max() > capacity:
                continue
            arrays = pack_arrays(lengths, capacity, strategy, overflow)
            check_pack_arrays(arrays, lengths.tolist(), capacity)
            expected = reference_pack(lengths.tolist(), capacity, strategy, overflow)
            got = (arrays.index.tolist(), arrays.start.tolist(), arrays.length.tolist(), arrays.row_offsets.tolist())
            assert got == arrays_of(expected, lengths.tolist()), (capacity, strategy, overflow)


def test_pack_arrays_leaves_the_garbage_collector_alone():
    import gc

    assert gc.isenabled()
    arrays = pack_arrays([10, 3], 4, "wrapped")
    assert gc.isenabled()
    arrays.to_lists()
    assert gc.isenabled()
    gc.disable()
    try:
        arrays.to_pieces()
        assert not gc.isenabled()
    finally:
        gc.enable()


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"capacity": 0}, ["capacity", "positive int", "0"]),
        ({"capacity": -4}, ["capacity", "positive int"]),
        ({"capacity": 8.0}, ["capacity", "8.0", "int("]),
        ({"capacity": True}, ["capacity", "True"]),
        ({"capacity": "8"}, ["capacity", "'8'"]),
        ({"capacity": 2**63}, ["capacity 9223372036854775808", "2**63 - 1", "int64"]),
        ({"strategy": "nfd"}, ["strategy='nfd'", "wrapped", "ffd", "bfd"]),
        ({"overflow": "drop"}, ["overflow='drop'", "error", "truncate", "split"]),
        ({"lengths": [3, 2, 5, 0]}, ["example 3 has length 0", "drop empty examples"]),
        ({"lengths": [3, -2]}, ["example 1 has length -2"]),
        ({"lengths": [3, 2.5]}, ["example 1", "2.5", "not an integer", "int("]),
        ({"lengths": [3, True]}, ["example 1", "True", "not an integer"]),
        ({"lengths": np.array([3.0, 2.0])}, ["example 0", "not an integer", "astype(int)"]),
        ({"lengths": np.ones((2, 3), dtype=int)}, ["1-D", "(2, 3)"]),
        ({"lengths": "abc"}, ["list, tuple or 1-D numpy array", "str"]),
        ({"lengths": [3, 9, 4]}, ["example 1 has length 9", "capacity is 8", "truncate", "split"]),
    ],
)
@pytest.mark.parametrize("packer", [pack, pack_arrays, pack_pieces])
def test_bad_input_names_problem_and_fix(kwargs, words, packer):
    call = {"lengths": [3, 4], "capacity": 8, "strategy": "bfd", "overflow": "error"} | kwargs
    with pytest.raises(PacksimError) as info:
        packer(**call)
    message = str(info.value)
    assert "\n" not in message  # one line
    for word in words:
        assert word in message


def test_overlong_error_lists_every_fix():
    with pytest.raises(PacksimError, match="raise capacity.*truncate.*split.*filter"):
        pack([1, 20], 8, "ffd")
    with pytest.raises(PacksimError, match="raise capacity.*truncate.*split.*filter"):
        pack_arrays([1, 20], 8, "ffd")


def test_as_piece_rejects_bad_entries():
    with pytest.raises(PacksimError, match="there are 2 examples"):
        as_piece(5, [3, 4])
    with pytest.raises(PacksimError, match="neither an example index"):
        as_piece("0", [3, 4])


def test_packing_stats_rejects_mismatched_packs():
    packs = pack([4, 7, 1, 5], 10)
    with pytest.raises(PacksimError, match="pack 1 holds 10 tokens but capacity is 8"):
        packing_stats([4, 7, 1, 5], packs, 8)
    with pytest.raises(PacksimError, match="example 4 is in no pack"):
        packing_stats([4, 7, 1, 5, 2], packs, 10)


@pytest.mark.parametrize(("strategy", "overflow"), [("wrapped", "error"), ("sequential", "truncate"),
                                                    ("bfd", "split"), ("ffd", "truncate")])
def test_pack_arrays_dtype_is_int64_past_the_int32_limit(monkeypatch, strategy, overflow):
    """int32 up to the limit (pieces and example lengths), int64 past it, same values either way.

    The limit is lowered (monkeypatched) so that small inputs cross it: with 2**31 - 1 the
    fallback would need billions of pieces or an example of 2**31 tokens.
    """
    from packsim.core import pack_result

    lengths, capacity = [10, 3, 7, 1, 4], 4
    want = pack_arrays(lengths, capacity, strategy, overflow)
    fields = ("index", "start", "length", "row_offsets")
    assert all(getattr(want, f).dtype == np.int32 for f in fields)
    fits = max(want.n_pieces, max(lengths))  # int32 up to here: both the piece count and the longest example
    for limit, dtype in ((fits, np.int32), (want.n_pieces - 1, np.int64), (max(lengths) - 1, np.int64)):
        monkeypatch.setattr(pack_result, "_INT32_MAX", limit)
        got = pack_arrays(lengths, capacity, strategy, overflow)
        assert {getattr(got, f).dtype for f in fields} == {np.dtype(dtype)}, (limit, strategy)
        assert got.example_lengths.dtype == np.int64
        for f in fields:
            assert np.array_equal(getattr(got, f), getattr(want, f)), (f, limit)
        assert got.to_lists() == want.to_lists() and got.to_pieces() == want.to_pieces()
        assert got.row_lengths().tolist() == want.row_lengths().tolist()


def test_pack_arrays_int32_result_gives_python_ints_and_int64_sums():
    arrays = pack_arrays([2**31 - 1, 2**31 - 1], 2**31 - 1, "wrapped")  # two full rows of the largest int32
    assert arrays.index.dtype == np.int32 and arrays.length.tolist() == [2**31 - 1] * 2
    assert arrays.row_lengths().tolist() == [2**31 - 1] * 2  # summed in int64
    assert int(arrays.length.sum()) == 2 * (2**31 - 1)
    assert arrays.to_lists() == [[0], [1]] and all(type(e) is int for row in arrays.to_lists() for e in row)
    piece = arrays.to_pieces()[1][0]
    assert piece == Piece(1, 0, 2**31 - 1) and all(type(v) is int for v in piece)
    longer = pack_arrays([2**31, 5], 2**31 + 5, "wrapped")  # an example past int32: int64
    assert longer.length.dtype == np.int64 and longer.length.tolist() == [2**31, 5]


# --- integer limits (issue 39): a correct packing or one PacksimError, never wrong output ---------

INT32_MAX, INT64_MAX = 2**31 - 1, 2**63 - 1


@st.composite
def near_limits(draw) -> tuple[list[int], int]:
    """(lengths, capacity) near int32's or int64's limit: capacities in its top eighth, lengths up to 8
    capacities (a few pieces each: the arrays stay small), sums on both sides of 2**63 - 1; near int64,
    often topped up to exactly 2**63 - 1 or 2**63 tokens."""
    limit = draw(st.sampled_from([INT32_MAX, INT64_MAX]))
    capacity = draw(st.integers(limit // 8, limit) | st.integers(max(1, limit - 8), limit))
    top = min(INT64_MAX, 8 * capacity)
    near = (st.integers(max(1, top - 2**8), top) | st.integers(max(1, capacity - 2**8), min(top, capacity + 2**8))
            | st.integers(1, 2**8) | st.integers(1, top))
    lengths = draw(st.lists(near, max_size=10))
    gap = draw(st.sampled_from([None, 0, 1]))  # top up to 2**63 - 1 + gap tokens
    rest = INT64_MAX + (gap or 0) - sum(lengths)
    if limit == INT64_MAX and gap is not None and 1 <= rest <= INT64_MAX:
        lengths.insert(draw(st.integers(0, len(lengths))), rest)
    return lengths, capacity


@pytest.mark.parametrize(("strategy", "overflow"), ALL_COMBOS)
@settings(max_examples=150, deadline=None)
@given(case=near_limits())
def test_near_the_integer_limits_packs_correctly_or_refuses_in_one_line(strategy, overflow, case):
    """Ground truth in Python ints: the tokens (sum past 2**63 - 1: the PacksimError), which examples
    overflow (overflow="error"), and every example's pieces tiling it, every row within capacity."""
    lengths, capacity = case
    total = sum(lengths)  # a Python int: never wraps
    overlong = overflow == "error" and strategy != "wrapped" and any(n > capacity for n in lengths)
    if total > INT64_MAX or overlong:
        with pytest.raises(PacksimError) as info:
            pack_arrays(lengths, capacity, strategy, overflow)
        message = str(info.value)
        assert "\n" not in message
        assert (f"sum to {total} tokens, past 2**63 - 1" in message) if total > INT64_MAX else ("capacity is" in message)
        return
    arrays = pack_arrays(lengths, capacity, strategy, overflow)
    packs = arrays.to_pieces()  # Python ints: a value wrapped in the int32 or int64 arrays shows below
    assert pack(lengths, capacity, strategy, overflow) == arrays.to_lists()
    assert all(0 < load <= capacity for load in loads(packs))
    truncates = overflow == "truncate" and strategy != "wrapped"
    check_tokens_land_once_in_order(lengths, capacity, packs, truncates)
    lower_bound = -(-sum(loads(packs)) // capacity)  # exact (check_pack_count's float ceil is not, here)
    assert len(packs) >= lower_bound
    if strategy == "wrapped":
        assert len(packs) == lower_bound and all(load == capacity for load in loads(packs)[:-1])
    assert arrays.row_lengths().tolist() == loads(packs)  # summed in int64 without wrapping
    if arrays.index.dtype == np.int32:
        assert max([arrays.n_pieces, *lengths]) <= INT32_MAX


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_lengths_summing_past_int64_are_refused_by_every_strategy(strategy):
    """pack([2**62] * 3, 2**62, "wrapped") returned [] (the sum wrapped to -2**62); every strategy
    refuses the same lengths, whose offsets in the packed stream wrap in int64."""
    total = 3 * 2**62  # ground truth: 13835058055282163712 > 2**63 - 1
    assert total > INT64_MAX
    for packer in (pack, pack_arrays, pack_pieces):
        with pytest.raises(PacksimError) as info:
            packer([2**62] * 3, 2**62, strategy)
        assert str(info.value).startswith(f"the 3 lengths sum to {total} tokens, past 2**63 - 1")
        assert "\n" not in str(info.value) and "shards" in str(info.value)
    fits = [2**62, 2**62 - 1]  # exactly 2**63 - 1 tokens: packed
    assert pack(fits, 2**62, strategy) == [[0], [1]]
    assert pack_arrays(fits, 2**62, strategy).row_lengths().tolist() == fits


def test_packing_stats_refuse_a_total_past_int64():
    with pytest.raises(PacksimError, match=f"sum to {3 * 2**62} tokens"):
        packing_stats([2**62] * 3, [[0], [1], [2]], 2**62)  # its total_tokens summed in int64 and wrapped
    stats = packing_stats([2**62, 2**62 - 1], [[0], [1]], 2**62)
    assert stats.total_tokens == INT64_MAX and stats.lower_bound == 2


@pytest.mark.parametrize("strategy", ["sequential", "ffd", "bfd"])
def test_split_near_int64_cuts_the_last_chunk_at_the_example_end(strategy):
    """start + capacity passed 2**63 - 1 and wrapped: the second chunk of a 2**63 - 1 token example ended at
    -2**63. Ground truth by hand: chunks [0, 2**62 + 1) and [2**62 + 1, 2**63 - 1)."""
    cut = 2**62 + 1
    assert pack([INT64_MAX], cut, strategy, "split") == [[Piece(0, 0, cut)], [Piece(0, cut, INT64_MAX)]]
    arrays = pack_arrays([INT64_MAX - 5, 5], cut, strategy, "split")  # 2**63 - 1 tokens in all
    assert sorted(arrays.length.tolist()) == sorted([cut, INT64_MAX - 5 - cut, 5])


@pytest.mark.parametrize(("lengths", "capacity", "strategy", "overflow", "pieces"), [
    ([2**62], 1, "wrapped", "error", 2**62),  # numpy's bare ValueError: "array is too big"
    ([INT64_MAX], 3, "wrapped", "error", -(-INT64_MAX // 3)),  # "Maximum allowed dimension exceeded"
    ([2**62], 1, "bfd", "split", 2**62),
    ([2**62], 2**20, "sequential", "split", 2**42),  # 32 TiB of int64: MemoryError, or a killed process
])
def test_a_packing_past_memory_is_refused_before_it_is_allocated(lengths, capacity, strategy, overflow, pieces):
    with pytest.raises(PacksimError) as info:
        pack_arrays(lengths, capacity, strategy, overflow)
    message = str(info.value)
    assert type(info.value) is PacksimError and "\n" not in message
    assert f"{pieces} pieces" in message and "more than this machine's memory" in message
    assert message.endswith("raise capacity (the tokens per row you train with, e.g. 2048).")
