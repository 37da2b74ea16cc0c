"""Checks of notebook 08_flash_varlen_internals: the reference passes, typical mistakes are named."""

from __future__ import annotations

import math

import torch

from packsim.course.exercises.lesson08_flash_varlen_internals import (
    check_classify_tiles,
    check_count_tiles,
    check_work_ratio,
)
from packsim.course.solutions import lesson08_flash_varlen_internals as sol


def _stub(*_args):
    raise NotImplementedError


def _text(fb) -> str:
    return (fb.message + " " + fb.hint).lower()


def _tri(n: int) -> int:
    return n * (n + 1) // 2


# ----------------------------------------------------------------------------- count_tiles


def test_count_tiles_reference_passes():
    fb = check_count_tiles(sol.count_tiles)
    assert fb.passed and fb.attempted, fb


def test_count_tiles_matches_packsim_tile_enumeration():
    from packsim.core.tiles import varlen_tiles
    from packsim.viz.tiles import as_cu_seqlens

    for lengths, tile in [([100, 300, 28, 340, 256], 128), ([5, 3, 9], 4), ([1], 16)]:
        assert sol.count_tiles(lengths, tile) == len(varlen_tiles(as_cu_seqlens(lengths), tile))


def test_count_tiles_above_diagonal_named():
    fb = check_count_tiles(lambda L, t: sum(math.ceil(x / t) ** 2 for x in L))
    assert not fb.passed and fb.attempted
    assert "above the diagonal" in _text(fb)


def test_count_tiles_ignoring_boundaries_named():
    fb = check_count_tiles(lambda L, t: _tri(math.ceil(sum(L) / t)))
    assert not fb.passed and "boundaries" in _text(fb)


def test_count_tiles_floor_and_plus_one_named():
    fb = check_count_tiles(lambda L, t: sum(_tri(x // t) for x in L))
    assert not fb.passed and "floor" in _text(fb)
    fb = check_count_tiles(lambda L, t: sum(_tri(x // t + 1) for x in L))
    assert not fb.passed and "exact multiple" in _text(fb)


def test_count_tiles_pack_aligned_grid_named():
    from packsim.core.tiles import attention_work
    from packsim.viz.tiles import as_cu_seqlens

    fb = check_count_tiles(lambda L, t: attention_work(as_cu_seqlens(L), tile=t).tiles_computed)
    assert not fb.passed and "pack-aligned" in _text(fb)


def test_count_tiles_wrong_type_and_stub():
    fb = check_count_tiles(lambda L, t: "17")
    assert not fb.passed and fb.attempted and "int" in _text(fb)
    assert check_count_tiles(_stub).attempted is False
    assert check_count_tiles(...).attempted is False


# ----------------------------------------------------------------------------- work_ratio


def test_work_ratio_reference_passes():
    fb = check_work_ratio(sol.work_ratio)
    assert fb.passed, fb
    assert sol.work_ratio([64] * 16) == 1 / 16


def test_work_ratio_causal_vs_causal_also_accepted():
    fb = check_work_ratio(lambda L: sum(_tri(x) for x in L) / _tri(sum(L)))
    assert fb.passed, fb


def test_work_ratio_mistakes_named():
    fb = check_work_ratio(lambda L: sum(L) ** 2 / sum(L) ** 2)
    assert not fb.passed and "square the total" in _text(fb)
    fb = check_work_ratio(lambda L: sum(L) ** 2 / sum(x * x for x in L))
    assert not fb.passed and "inverse" in _text(fb)
    fb = check_work_ratio(lambda L: sum(_tri(x) for x in L) / sum(L) ** 2)
    assert not fb.passed and "like with like" in _text(fb)
    assert check_work_ratio(_stub).attempted is False


# ----------------------------------------------------------------------------- classify_tiles


def test_classify_tiles_reference_passes():
    fb = check_classify_tiles(sol.classify_tiles)
    assert fb.passed, fb


def test_classify_tiles_reference_equals_tile_grid():
    from packsim.core.tiles import tile_grid
    from packsim.viz.tiles import as_cu_seqlens

    for lengths, tile in [([5, 3, 9], 4), ([50], 16), ([129, 127, 256, 40], 64)]:
        assert torch.equal(sol.classify_tiles(lengths, tile), tile_grid(as_cu_seqlens(lengths), tile))


def test_classify_tiles_full_diagonal_named():
    def diag_full(L, t):
        g = sol.classify_tiles(L, t)
        g[torch.arange(len(g)), torch.arange(len(g))] = 2
        return g

    fb = check_classify_tiles(diag_full)
    assert not fb.passed and "diagonal tile" in _text(fb)


def test_classify_tiles_not_causal_named():
    def no_causal(L, t):
        g = sol.classify_tiles(L, t)
        return torch.maximum(g, g.T)

    fb = check_classify_tiles(no_causal)
    assert not fb.passed and "above the diagonal" in _text(fb)


def test_classify_tiles_plain_causal_named():
    def causal_only(L, t):
        n = math.ceil(sum(L) / t)
        return torch.ones(n, n, dtype=torch.int8).tril()

    fb = check_classify_tiles(causal_only)
    assert not fb.passed and "different examples" in _text(fb)


def test_classify_tiles_boundary_full_named():
    def boundary_full(L, t):
        g = sol.classify_tiles(L, t)
        off = ~torch.eye(len(g), dtype=torch.bool)
        g[(g == 1) & off] = 2
        return g

    fb = check_classify_tiles(boundary_full)
    assert not fb.passed and "boundary" in _text(fb)


def test_classify_tiles_wrong_shape_and_stub():
    fb = check_classify_tiles(lambda L, t: torch.zeros(2, 2))
    assert not fb.passed and "shape" in _text(fb)
    assert check_classify_tiles(_stub).attempted is False


def test_work_ratio_unknown_slip_gets_numbers_not_a_generic_line():
    fb = check_work_ratio(lambda L: sum(x * x for x in L) / sum(L))
    assert not fb.passed and "by n, not by n^2" in _text(fb)
    fb = check_work_ratio(lambda L: 0.5 * sum(x * x for x in L) / sum(L) ** 2 + 0.01)
    assert not fb.passed and "usual slips" not in _text(fb) and "sum l^2 =" in _text(fb)


# ----------------------------------------------------------------------------- other right answers


def test_count_tiles_other_right_answers_pass():
    import numpy as np

    answers = {
        "integer ceiling, numpy int64": lambda L, t: np.sum([(-(-x // t)) * (-(-x // t) + 1) // 2 for x in L]),
        "a 0-d int tensor": lambda L, t: (lambda n: (n * (n + 1) // 2).sum())(torch.tensor(L).add(t - 1).div(t, rounding_mode="floor")),
        "a whole float from a loop over tiles": lambda L, t: float(sum(i + 1 for x in L for i in range(math.ceil(x / t)))),
    }
    for what, fn in answers.items():
        fb = check_count_tiles(fn)
        assert fb.passed, (what, fb)


def test_work_ratio_other_right_answers_pass():
    from fractions import Fraction

    import numpy as np

    answers = {
        "numpy float32": lambda L: (np.asarray(L, dtype=np.float32) ** 2).sum() / np.float32(sum(L)) ** 2,
        "an exact Fraction": lambda L: Fraction(sum(x * x for x in L), sum(L) ** 2),
        "rounded to 4 decimals": lambda L: round(sol.work_ratio(L), 4),
        "shares squared": lambda L: sum((x / sum(L)) ** 2 for x in L),
    }
    for what, fn in answers.items():
        fb = check_work_ratio(fn)
        assert fb.passed, (what, fb)


def _classify_by_elements(lengths, tile):
    """A right map from the element mask: pad the (N, N) allowed pairs to whole tiles, then a tile is
    skipped if no pair is allowed, full if all are (a ragged tile's padding is never allowed), else
    partial. Returned as a nested list of Python ints."""
    seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))  # (N,)
    N = len(seq)
    n = -(-N // tile)
    allowed = torch.zeros(n * tile, n * tile, dtype=torch.bool)
    allowed[:N, :N] = (seq[:, None] == seq[None, :]) & torch.ones(N, N, dtype=torch.bool).tril()
    tiles = allowed.reshape(n, tile, n, tile).transpose(1, 2)  # (n, n, tile, tile)
    grid = torch.where(tiles.all(-1).all(-1), 2, torch.where(tiles.any(-1).any(-1), 1, 0))
    return grid.tolist()


def test_classify_tiles_other_right_answers_pass():
    import numpy as np

    for fn in (_classify_by_elements, lambda L, t: np.asarray(sol.classify_tiles(L, t), dtype=np.int64),
               lambda L, t: sol.classify_tiles(L, t).float()):
        fb = check_classify_tiles(fn)
        assert fb.passed, fb


def test_work_ratio_coarse_rounding_fails():
    fb = check_work_ratio(lambda L: round(sol.work_ratio(L), 2))
    assert not fb.passed and "expected" in _text(fb)
