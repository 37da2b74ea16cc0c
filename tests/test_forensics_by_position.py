"""forensics.by_position: the run's natural control (the first example of a row is never contaminated)."""

from __future__ import annotations

import pytest

from packsim.core.data import make_dataset
from packsim.core.errors import PacksimError
from packsim.core.model import build_model
from packsim.experiment.committed_models import load_committed_model
from packsim.experiment.forensics import by_position, length_by_place


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


# ----------------------------------------------------------------------------- in the run's own packer


def _alone_loss(model, ex) -> float:
    """Ground truth, one example at a time: its response loss in a row of its own."""
    from packsim.core.batch import PackedBatch
    from packsim.experiment.evaluation import example_scores

    loss, _ = example_scores(model, PackedBatch.from_examples([ex], len(ex.tokens), setup="padded"))
    return float(loss[0])


def test_rescored_in_the_runs_packer_the_places_are_the_training_loops():
    # ground truth: the places in the batches the training loop itself builds (make_batches), and
    # each example's loss alone scored one at a time
    from packsim.experiment.training import make_batches

    sample, capacity, per_step = make_dataset(30, 0, seed=5)[0], 96, 12  # 3 steps: 12, 12, 6
    model = build_model("tiny", seed=0)
    places = by_position(model, sample, capacity, strategy="bfd", examples_per_step=per_step)
    where: dict[int, int] = {}
    for step, batch in enumerate(make_batches(sample, capacity, "loss_fix", per_step, "bfd")):
        seen: dict[int, int] = {}
        for seg in batch.segments:
            seen[seg.row] = seen.get(seg.row, 0) + 1
            where[step * per_step + seg.example] = seen[seg.row]
    assert {k: v["n"] for k, v in places.items()} == {k: list(where.values()).count(k) for k in set(where.values())}
    for k, v in places.items():
        want = sum(_alone_loss(model, sample[i]) for i, p in where.items() if p == k) / v["n"]
        assert v["alone"] == pytest.approx(want, abs=1e-5)
    assert places[1]["gap"] == pytest.approx(0.0, abs=1e-5)  # nothing before it under BFD either
    # the layout is not sequential's: bfd opens each row with a long example
    assert {k: v["n"] for k, v in places.items()} != {k: v["n"] for k, v in by_position(model, sample, capacity).items()}


def test_wrapped_and_a_bad_step_size_are_one_line():
    model, sample = build_model("tiny", seed=0), make_dataset(8, 0, seed=0)[0]
    with pytest.raises(PacksimError, match="cuts examples"):
        by_position(model, sample, strategy="wrapped")
    with pytest.raises(PacksimError, match="examples_per_step"):
        by_position(model, sample, examples_per_step=0)


@pytest.mark.parametrize(("lengths", "capacity", "strategy", "per_step", "want"), [
    # hand-packed: sequential next fit keeps order; bfd puts the longest first in each row
    ([3, 5, 4, 2, 6], 8, "sequential", None, {1: (3, (3 + 4 + 6) / 3), 2: (2, (5 + 2) / 2)}),
    ([3, 5, 4, 2, 6], 8, "bfd", None, {1: (3, (6 + 5 + 4) / 3), 2: (2, (2 + 3) / 2)}),
    # per step: [3, 5] -> [5, 3]; [4, 2] -> [4, 2]; [6]
    ([3, 5, 4, 2, 6], 8, "bfd", 2, {1: (3, (5 + 4 + 6) / 3), 2: (2, (3 + 2) / 2)}),
    # wrapped cuts: rows [3 5] [4 2 6(2 of 6)] [6 (4 more)]: a cut piece counts its whole example's length
    ([3, 5, 4, 2, 6], 8, "wrapped", None, {1: (3, (3 + 4 + 6) / 3), 2: (2, (5 + 2) / 2), 3: (1, 6)}),
])
def test_length_by_place_against_hand_packing(lengths, capacity, strategy, per_step, want):
    got = length_by_place(lengths, capacity, strategy, per_step)
    assert sorted(got) == sorted(want)
    for k, (n, mean_length) in want.items():
        assert got[k]["n"] == n and got[k]["mean_length"] == pytest.approx(mean_length)


def test_the_committed_runs_place_is_not_independent_of_the_example():
    # the committed runs' packer (results/tasks-full: bfd, 224 examples a step, rows of 256), on its
    # first 20 steps: the first places hold longer examples than the last, and sequential's first place
    # holds the example that straddled a row's end, longer than the mean (E[L^2] / E[L])
    import numpy as np

    lengths = np.array([len(ex.tokens) for ex in make_dataset(20 * 224, 0, seed=0)[0]])
    bfd = length_by_place(lengths, 256, "bfd", 224)
    assert bfd[1]["mean_length"] > bfd[max(bfd)]["mean_length"] + 3
    seq = length_by_place(lengths, 256, "sequential", 224)
    assert seq[1]["mean_length"] > seq[2]["mean_length"] + 0.3 and seq[1]["mean_length"] > lengths.mean() + 0.3
