"""packsim.scaling.context_parallel: padding to 2 x cp, the zigzag split, contiguous split, causal work."""

from __future__ import annotations

import pytest

from packsim.core.errors import PacksimError
from packsim.core.pack_result import Piece
from packsim.scaling.context_parallel import (
    causal_work,
    contiguous_split,
    dropped_tokens,
    pad_lengths,
    zigzag_split,
)


def test_pad_and_dropped():
    assert pad_lengths([7, 8, 1], 2).tolist() == [8, 8, 4]
    assert dropped_tokens([7, 8, 1], 2) == 3 + 0 + 1  # 7 = 4 chunks of 1 (+3 left), 1 = 4 chunks of 0 (+1)


def test_zigzag_pairs_first_and_last_chunks_and_balances_causal_work():
    split = zigzag_split([8, 16], 2)  # chunks of 2 and 4 tokens
    assert split == [[(0, 0, 2), (0, 6, 8), (1, 0, 4), (1, 12, 16)],
                     [(0, 2, 4), (0, 4, 6), (1, 4, 8), (1, 8, 12)]]
    work = causal_work(split)
    assert work[0] == work[1] == (8 * 9 // 2 + 16 * 17 // 2) // 2
    covered = sorted((d, a, b) for rank in split for d, a, b in rank)
    assert sum(b - a for _, a, b in covered) == 24


def test_contiguous_split_of_one_document_is_a_straggler():
    split = contiguous_split([16], 2)
    assert split == [[(0, 0, 8)], [(0, 8, 16)]]
    assert causal_work(split).tolist() == [36, 100]  # 1+..+8 vs 9+..+16


def test_contiguous_split_cuts_at_document_boundaries():
    assert contiguous_split([3, 5], 2) == [[(0, 0, 3), (1, 0, 1)], [(1, 1, 5)]]


def test_splits_are_the_packers_pieces():
    for split in (zigzag_split([8], 2), contiguous_split([3, 5], 2)):
        assert all(type(p) is Piece for rank in split for p in rank)
    assert zigzag_split([4], 1)[0][1] == Piece(index=0, start=2, stop=4)


@pytest.mark.parametrize(("lengths", "cp", "match"), [
    ([7], 2, "not a multiple of 2 x cp_size = 4"),
    ([], 2, "non-empty"),
    ([4], 0, "positive int"),
])
def test_bad_input(lengths, cp, match):
    with pytest.raises(PacksimError, match=match):
        zigzag_split(lengths, cp)
