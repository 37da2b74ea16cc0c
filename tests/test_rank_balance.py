"""packsim.scaling.rank_balance: pack costs, round-robin vs longest-first assignment, the straggler ratio."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from packsim.core.data import long_tailed_lengths
from packsim.core.errors import PacksimError
from packsim.core.packing import pack_pieces
from packsim.scaling.rank_balance import assign, pack_costs, rank_loads, straggler_ratio

ROOT = Path(__file__).resolve().parent.parent


def _keys_seen(L: int) -> int:
    """Causal score pairs of one example, counted query by query: query p sees keys 0..p."""
    return sum(len(range(p + 1)) for p in range(L))


def test_costs():
    packs = [[3, 4], [7], [1, 1, 1]]
    costs = pack_costs(packs)
    assert costs["tokens"].tolist() == [7, 7, 3]
    assert costs["attention"].tolist() == [sum(_keys_seen(L) for L in p) for p in packs] == [16, 28, 3]


def test_round_robin_and_longest_first():
    packs = [[5], [4], [3], [3], [3]]  # tokens 5, 4, 3, 3, 3
    assert assign(packs, 2, "round_robin") == [[0, 2, 4], [1, 3]]
    # LPT: 5 -> r0, 4 -> r1, 3 -> r1 (7), 3 -> r0 (8), 3 -> r1 (10)
    assert assign(packs, 2, "tokens") == [[0, 3], [1, 2, 4]]
    loads = rank_loads(assign(packs, 2, "tokens"), pack_costs(packs)["tokens"])
    assert loads.tolist() == [8.0, 10.0] and straggler_ratio(loads) == pytest.approx(10 / 9)


def test_attention_cost_separates_one_long_example_from_many_short_ones():
    packs = [[64], [16, 16, 16, 16], [64], [16, 16, 16, 16]]  # same tokens, ~4x attention on the long ones
    rr = assign(packs, 2, "round_robin")  # both long packs on rank 0
    att = assign(packs, 2, "attention")
    cost = pack_costs(packs)["attention"]
    long, short = 2 * _keys_seen(64), 2 * 4 * _keys_seen(16)  # rank 0, rank 1 under round robin
    assert straggler_ratio(rank_loads(rr, cost)) == pytest.approx(2 * long / (long + short))
    assert straggler_ratio(rank_loads(att, cost)) == 1.0
    assert straggler_ratio(rank_loads(rr, pack_costs(packs)["tokens"])) == 1.0  # tokens can't tell


def test_every_pack_once_every_rank_some_on_the_long_tailed_mix():
    lengths = long_tailed_lengths(512, max_len=2048, seed=0)
    packs = [[p.stop - p.start for p in pk] for pk in pack_pieces(lengths, 2048, "bfd")]
    cost = pack_costs(packs)["attention"]
    for method in ("round_robin", "tokens", "attention"):
        for R in (2, 4, 8):
            ranks = assign(packs, R, method)
            assert sorted(i for r in ranks for i in r) == list(range(len(packs))) and all(ranks)
    assert straggler_ratio(rank_loads(assign(packs, 4, "attention"), cost)) < straggler_ratio(
        rank_loads(assign(packs, 4, "round_robin"), cost))


@pytest.mark.parametrize(("packs", "R", "method", "match"), [
    ([[3]], 2, "tokens", "1 pack\\(s\\) for 2 ranks: a rank would have no pack"),
    ([[3], [4]], 2, "random", "unknown assignment 'random'"),
    ([[3], []], 2, "tokens", "pack 1 has lengths \\[\\]"),
    ([[3], [4]], 0, "tokens", "world_size must be a positive int"),
])
def test_bad_input(packs, R, method, match):
    with pytest.raises(PacksimError, match=match):
        assign(packs, R, method)


def test_straggler_ratio_needs_loads():
    with pytest.raises(PacksimError, match="positive total"):
        straggler_ratio(np.zeros(3))


def test_benchmark_model_free_part_runs():
    """benchmarks/straggler.py's model-free measure, in process, on a few small steps."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("bench_straggler", ROOT / "benchmarks" / "straggler.py")
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)
        rows = bench.model_free(steps=3, per_rank=16, capacity=512, worlds=[2], seed=0)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    got = {(r["method"], r["cost"]): r for r in rows}
    assert set(got) == {(m, c) for m in bench.METHODS for c in ("tokens", "attention")}
    assert all(1.0 <= r["mean"] <= r["max"] for r in rows)
    assert got["attention", "attention"]["mean"] <= got["round_robin", "attention"]["mean"]
    print(bench.table(rows, None))
