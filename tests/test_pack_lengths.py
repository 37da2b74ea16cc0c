"""Tests for packsim.core.pack_lengths: every input kind (list, tuple, numpy arrays of each integer
dtype, torch tensors, pyarrow arrays, datasets columns, pandas) gives the packs of the same lengths
as a list; each bad input gives its one-line error, word for word; ints are read without a Python
call per element."""

from __future__ import annotations

from collections.abc import Sequence

import datasets
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from packsim.core import pack_lengths
from packsim.core.errors import PacksimError
from packsim.core.pack_lengths import check_lengths
from packsim.core.packing import STRATEGIES, pack, pack_arrays, pack_pieces

datasets.disable_progress_bars()

# input kind -> (the lengths in that kind, the largest length it holds)
KINDS = {
    "list": (list, 2**63 - 1),
    "tuple": (tuple, 2**63 - 1),
    "range-like": (lambda v: _Seq(v), 2**63 - 1),
    **{f"numpy {d}": (lambda v, d=d: np.asarray(v, dtype=d), min(np.iinfo(d).max, 2**63 - 1))
       for d in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")},
    "numpy object": (lambda v: np.asarray(v, dtype=object), 2**63 - 1),
    "numpy strided": (lambda v: np.repeat(np.asarray(v, dtype=np.int64), 2)[::2], 2**63 - 1),
    **{f"torch {d}": (lambda v, d=d: torch.tensor(v, dtype=getattr(torch, d)), torch.iinfo(getattr(torch, d)).max)
       for d in ("int16", "int32", "int64", "uint8")},
    "pyarrow int32": (lambda v: pa.array(v, type=pa.int32()), 2**31 - 1),
    "pyarrow int64": (lambda v: pa.array(v, type=pa.int64()), 2**63 - 1),
    "pyarrow uint64": (lambda v: pa.array(v, type=pa.uint64()), 2**63 - 1),
    "pyarrow chunked": (lambda v: pa.chunked_array([v[: len(v) // 2], v[len(v) // 2 :]], type=pa.int64()), 2**63 - 1),
    "datasets column": (lambda v: _dataset(v)["n"], 2**63 - 1),
    "datasets numpy": (lambda v: _dataset(v).with_format("numpy")["n"], 2**63 - 1),
    "datasets torch": (lambda v: _dataset(v).with_format("torch")["n"], 2**63 - 1),
    "pandas": (lambda v: pd.Series(v, dtype="int64"), 2**63 - 1),
}


class _Seq:
    """A sequence that is neither a list nor a tuple (like ``range`` or a user's class)."""

    def __init__(self, values):
        self.values = list(values)

    def __len__(self):
        return len(self.values)

    def __getitem__(self, i):
        return self.values[i]


Sequence.register(_Seq)  # a Sequence by registration, as user classes often are


def _dataset(values):
    return datasets.Dataset.from_dict({"n": pa.array(values, type=pa.int64())})


def _fields(arrays):
    return [a.tolist() for a in (arrays.index, arrays.start, arrays.length, arrays.row_offsets, arrays.example_lengths)]


@settings(max_examples=300, deadline=None)
@given(data=st.data(), kind=st.sampled_from(sorted(KINDS)), strategy=st.sampled_from(STRATEGIES))
def test_every_input_kind_packs_as_the_list(data, kind, strategy):
    make, largest = KINDS[kind]
    capacity = data.draw(st.integers(1, 64))
    top = min(largest, 4 * capacity)
    lengths = data.draw(st.lists(st.integers(1, top), max_size=40))
    given_lengths = make(lengths)
    assert _fields(pack_arrays(given_lengths, capacity, strategy, "split")) == _fields(
        pack_arrays(lengths, capacity, strategy, "split"))
    assert pack(given_lengths, capacity, strategy, "split") == pack(lengths, capacity, strategy, "split")
    assert check_lengths(given_lengths).dtype == np.int64 and check_lengths(given_lengths).tolist() == lengths


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_input_kind_reads_its_extremes(kind):
    make, largest = KINDS[kind]
    lengths = [1, largest, 2, largest - 1]
    got = check_lengths(make(lengths))
    assert got.dtype == np.int64 and got.tolist() == lengths


def test_the_result_is_a_new_array_whatever_the_input():
    values = np.array([3, 5, 2], dtype=np.int64)
    tensor = torch.tensor([3, 5, 2])
    for given_lengths, shared in ((values, values), (tensor, tensor.numpy())):
        got = check_lengths(given_lengths)
        got[0] = 99
        assert not np.shares_memory(got, shared) and int(shared[0]) == 3


def test_datasets_columns_read_in_the_datasets_order_and_format():
    ds = _dataset([3, 4, 5, 6])
    assert check_lengths(ds.select([3, 1])["n"]).tolist() == [6, 4]  # an indices mapping
    assert check_lengths(ds.shuffle(seed=0)["n"]).tolist() == list(ds.shuffle(seed=0)["n"])
    doubled = ds.with_transform(lambda batch: {"n": [2 * n for n in batch["n"]]})  # a custom format
    assert check_lengths(doubled["n"]).tolist() == [6, 8, 10, 12]


# --- bad input: the messages word for word (as before issue 33 for the kinds accepted then) ----

NOT_INT = "not an integer; lengths are token counts: pass ints (e.g. int(n), or lengths.astype(int))."
EMPTY = "every example needs at least 1 token; drop empty examples before packing."
PAST = ("past 2**63 - 1, the most tokens packsim's int64 offsets hold; lengths are token counts: pass the real "
        "ones (e.g. [len(ids) for ids in tokenized]).")
NOT_1D = "pass a flat list or lengths.ravel()."
KIND = "pass e.g. [len(ids) for ids in tokenized]."

BAD = [
    ([3, 3.0], f"example 1 has length 3.0 (float), {NOT_INT}"),
    ([3, 3.5], f"example 1 has length 3.5 (float), {NOT_INT}"),
    ([3, True], f"example 1 has length True (bool), {NOT_INT}"),
    ([3, np.bool_(True)], f"example 1 has length np.True_ (bool), {NOT_INT}"),
    ([3, np.float64(3.0)], f"example 1 has length np.float64(3.0) (float64), {NOT_INT}"),
    ([3, "4"], f"example 1 has length '4' (str), {NOT_INT}"),
    ([3, None], f"example 1 has length None (NoneType), {NOT_INT}"),
    ([[1, 2], [3, 4]], f"example 0 has length [1, 2] (list), {NOT_INT}"),
    ([[1, 2], [3]], f"example 0 has length [1, 2] (list), {NOT_INT}"),
    ([np.array([3]), 4], f"example 0 has length array([3]) (ndarray), {NOT_INT}"),
    ([torch.tensor(3), 4], f"example 0 has length tensor(3) (Tensor), {NOT_INT}"),
    ([0, 2.5], f"example 1 has length 2.5 (float), {NOT_INT}"),  # every type checked before any value
    ([3, 2, 5, 0], f"example 3 has length 0: {EMPTY}"),
    ([3, -2], f"example 1 has length -2: {EMPTY}"),
    ([3, 2**63], f"example 1 has length 9223372036854775808, {PAST}"),
    ([3, 2**64], f"example 1 has length 18446744073709551616, {PAST}"),
    ([3, -(2**70)], f"example 1 has length -1180591620717411303424: {EMPTY}"),
    ([0, 2**64], f"example 0 has length 0: {EMPTY}"),  # the first bad example, whichever kind
    ([3, np.uint64(2**64 - 1)], f"example 1 has length 18446744073709551615, {PAST}"),
    (np.array([3.0, 2.0]), f"example 0 has length 3.0 (float), {NOT_INT}"),
    (np.array([True, False]), f"example 0 has length True (bool), {NOT_INT}"),
    (np.array([3, 4.0], dtype=object), f"example 1 has length 4.0 (float), {NOT_INT}"),
    (np.array(["3", "4"]), f"example 0 has length '3' (str), {NOT_INT}"),
    (np.array([3, -1], dtype=np.int8), f"example 1 has length -1: {EMPTY}"),
    (np.array([3, 2**64 - 1], dtype=np.uint64), f"example 1 has length 18446744073709551615, {PAST}"),
    (np.array([0, 2**64 - 1], dtype=np.uint64), f"example 0 has length 0: {EMPTY}"),
    (np.ones((2, 3), dtype=int), f"lengths must be 1-D (one length per example), got shape (2, 3); {NOT_1D}"),
    (np.array(5), f"lengths must be 1-D (one length per example), got shape (); {NOT_1D}"),
    (torch.tensor([3.0, 4.0]), f"example 0 has length 3.0 (float), {NOT_INT}"),
    (torch.tensor([3.0, 4.0], dtype=torch.bfloat16), f"example 0 has length 3.0 (float), {NOT_INT}"),
    (torch.tensor([True, False]), f"example 0 has length True (bool), {NOT_INT}"),
    (torch.tensor([3, 0]), f"example 1 has length 0: {EMPTY}"),
    (torch.ones(2, 3, dtype=torch.long), f"lengths must be 1-D (one length per example), got shape (2, 3); {NOT_1D}"),
    (torch.tensor(5), f"lengths must be 1-D (one length per example), got shape (); {NOT_1D}"),
    (pa.array([3.0, 4.0]), f"example 0 has length 3.0 (float), {NOT_INT}"),
    (pa.array([True, False]), f"example 0 has length True (bool), {NOT_INT}"),
    (pa.array([3, 0]), f"example 1 has length 0: {EMPTY}"),
    (pa.array([3, 2**64 - 1], type=pa.uint64()), f"example 1 has length 18446744073709551615, {PAST}"),
    (pa.array([3, None, 4]), "example 1 has no length (a null in the Arrow column); drop or fill the missing "
                             "lengths before packing."),
    (pa.chunked_array([[3, 4], [None]]), "example 2 has no length (a null in the Arrow column); drop or fill "
                                         "the missing lengths before packing."),
    ("abc", f"lengths must be a list, tuple or 1-D numpy array of ints, got str; {KIND}"),
    (b"ab", f"lengths must be a list, tuple or 1-D numpy array of ints, got bytes; {KIND}"),
    (None, f"lengths must be a list, tuple or 1-D numpy array of ints, got NoneType; {KIND}"),
    (5, f"lengths must be a list, tuple or 1-D numpy array of ints, got int; {KIND}"),
    (np.int64(5), f"lengths must be a list, tuple or 1-D numpy array of ints, got int64; {KIND}"),
    ({3, 4}, f"lengths must be a list, tuple or 1-D numpy array of ints, got set; {KIND}"),
    ((n for n in [3, 4]), f"lengths must be a list, tuple or 1-D numpy array of ints, got generator; {KIND}"),
]


@pytest.mark.parametrize(("lengths", "message"), BAD, ids=[f"{i}:{type(b[0]).__name__}" for i, b in enumerate(BAD)])
@pytest.mark.parametrize("packer", [pack, pack_arrays, pack_pieces, check_lengths])
def test_bad_input_gives_its_one_line_error(lengths, message, packer):
    call = (lambda: packer(lengths)) if packer is check_lengths else (lambda: packer(lengths, 8, "bfd", "split"))
    with pytest.raises(PacksimError) as info:
        call()
    assert str(info.value) == message and "\n" not in message


@pytest.mark.parametrize("kind", ["numpy int64", "torch int64", "pyarrow int64", "datasets column", "list"])
def test_bad_values_in_any_kind_give_the_lists_error(kind):
    make, _ = KINDS[kind]
    for lengths in ([3, 0, 4], [3, 4, -1], [3, 9, 4]):  # 9 > capacity: the overflow error
        with pytest.raises(PacksimError) as want:
            pack(lengths, 8)
        with pytest.raises(PacksimError) as got:
            pack(make(lengths), 8)
        assert str(got.value) == str(want.value)


def test_empty_inputs_of_every_kind_give_no_packs():
    empties = [[], (), np.array([]), np.array([], dtype=np.uint8), torch.tensor([], dtype=torch.long),
               torch.tensor([]), pa.array([], type=pa.int64()), _dataset([])["n"]]
    for empty in empties:
        assert pack(empty, 8) == [] and check_lengths(empty).dtype == np.int64


# --- array speed: no Python call per element for integers ----------------------------------------


def test_integers_are_read_without_a_python_call_per_element(monkeypatch):
    """The per-element check (and ``is_int``) must not run for integers of any kind; it still runs,
    and names the example, when one is not an integer (so the patch below is live)."""

    def refuse(*args):
        raise AssertionError("a per-element Python check ran")

    monkeypatch.setattr(pack_lengths, "_check_each", refuse)
    monkeypatch.setattr(pack_lengths, "is_int", refuse)
    lengths = np.random.default_rng(33).integers(1, 500, 10_000)
    as_list = lengths.tolist()
    kinds = [as_list, tuple(as_list), [np.int32(n) for n in as_list[:100]], lengths, lengths.astype(np.uint16),
             np.asarray(as_list, dtype=object), torch.from_numpy(lengths), pa.array(lengths), _dataset(lengths)["n"]]
    for given_lengths in kinds:
        assert check_lengths(given_lengths).tolist() == as_list[: len(given_lengths)]
    assert pack(as_list, 512, "wrapped") == pack(lengths, 512, "wrapped")
    with pytest.raises(AssertionError, match="per-element"):
        check_lengths([*as_list, 2.0])


# --- the total (issue 39): exact, refused past int64 -------------------------------------------


@settings(max_examples=300, deadline=None)
@given(lengths=st.lists(st.integers(1, 2**63 - 1) | st.integers(2**62, 2**63 - 1) | st.integers(1, 2**32), max_size=12))
def test_total_tokens_is_the_exact_sum_or_the_error(lengths):
    """Ground truth: Python's sum (no wrap). np.sum wraps past 2**63 - 1; total_tokens never does."""
    from packsim.core.pack_lengths import total_tokens

    sizes, want = np.asarray(lengths, dtype=np.int64), sum(lengths)
    if want > 2**63 - 1:
        with pytest.raises(PacksimError) as info:
            total_tokens(sizes)
        assert str(info.value).startswith(f"the {len(lengths)} lengths sum to {want} tokens, past 2**63 - 1")
    else:
        assert total_tokens(sizes) == want
    assert check_lengths(lengths).tolist() == lengths  # reading the lengths never checks their sum


def test_check_room_refuses_arrays_past_memory(monkeypatch):
    from packsim.core.pack_lengths import check_room

    monkeypatch.setattr(pack_lengths, "_memory_bytes", lambda: 1000)
    check_room(125, 8, "the pieces", "raise capacity")  # 1000 bytes: fits
    with pytest.raises(PacksimError) as info:
        check_room(126, 8, "the pieces", "raise capacity")
    assert str(info.value) == ("the pieces would take 1008 bytes of arrays, more than this machine's memory "
                               "(1000 bytes); raise capacity.")
    monkeypatch.undo()
    assert 0 < pack_lengths._memory_bytes() <= 2**63 - 1
