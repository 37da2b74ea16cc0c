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
