"""forensics.by_position: the run's natural control (the first example of a row is never contaminated)."""

from __future__ import annotations

import pytest

from packsim.core.data import make_dataset
from packsim.core.errors import PacksimError
from packsim.core.model import build_model
from packsim.experiment.committed_models import load_committed_model
from packsim.experiment.forensics import by_position


def _places_next_fit(lengths: list[int], capacity: int) -> dict[int, int]:
    """Ground truth, written here: sequential packing opens a new row when the next example does not fit."""
    counts: dict[int, int] = {}
    used, place = capacity + 1, 0
    for n in lengths:
        if used + n > capacity:
            used, place = 0, 0
        used += n
        place += 1
        counts[place] = counts.get(place, 0) + 1
    return counts


def test_places_follow_sequential_packing_and_the_first_place_is_exactly_alone():
    sample = make_dataset(40, 0, seed=3)[0]
    capacity = 96
    places = by_position(build_model("tiny", seed=0), sample, capacity=capacity)
    assert {k: v["n"] for k, v in places.items()} == _places_next_fit([len(ex.tokens) for ex in sample], capacity)
    assert places[1]["gap"] == pytest.approx(0.0, abs=1e-5)  # nothing before it: in-pack == alone
    assert places[1]["packed"] == pytest.approx(places[1]["alone"], abs=1e-5)
    later = [v["gap"] for k, v in places.items() if k >= 2]
    assert max(abs(g) for g in later) > 1e-3  # a random model is disturbed by neighbours


def test_the_leaky_committed_model_barely_moves_where_the_control_jumps():
    # the case it must catch: buggy (trained on leaky packs) vs correct (never saw a neighbour)
    sample = make_dataset(64, 0, seed=0)[0]
    later = {}
    for setup in ("buggy", "correct"):
        places = by_position(load_committed_model(setup), sample, capacity=256)
        assert places[1]["gap"] == pytest.approx(0.0, abs=1e-5)
        rest = [v for k, v in places.items() if k >= 2]
        later[setup] = sum(v["gap"] * v["n"] for v in rest) / sum(v["n"] for v in rest)
    assert later["buggy"] < 0.5 * later["correct"]
    assert later["correct"] > 1.0  # nats: the control is thrown off by foreign neighbours


def test_bad_input_is_one_line():
    with pytest.raises(PacksimError, match="at least 4"):
        by_position(build_model("tiny", seed=0), make_dataset(2, 0, seed=0)[0])
