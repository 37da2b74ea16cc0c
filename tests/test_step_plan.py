"""packsim.scaling.step_plan: a step's examples dealt to ranks and micro-batches, the same global batch."""

from __future__ import annotations

import pytest

from packsim.core.data import make_examples
from packsim.core.errors import PacksimError
from packsim.experiment.training import TrainConfig
from packsim.scaling.step_plan import plan_step, select_rows, validate


def _tokens(batch) -> list[tuple]:
    return sorted(tuple(batch.input_ids[s.row, s.start : s.stop].tolist()) for s in batch.segments)


def test_plan_keeps_the_global_batch_and_its_order():
    cfg = TrainConfig(examples_per_step=7, capacity=64)
    step = make_examples(7, seed=3)
    whole = [tuple(ex.tokens) for ex in step]
    micro, packs = plan_step(step, cfg, "correct", world_size=2, grad_accum=2)
    # 4 contiguous shards of 2, 2, 2, 1 examples; shard m*R + r is micro-batch m of rank r
    shards = [whole[0:2], whole[2:4], whole[4:6], whole[6:7]]
    for m in range(2):
        for r in range(2):
            assert _tokens(micro[r][m]) == sorted(shards[m * 2 + r])
    assert sum(len(p) for rank in packs for p in rank) == 7
    for method in ("round_robin", "tokens", "attention"):
        micro, _ = plan_step(step, cfg, "correct", 2, 2, balance=method)
        got = sorted(t for rank in micro for b in rank if b is not None for t in _tokens(b))
        assert got == sorted(whole)


def test_select_rows_rebuilds_segments_and_cu_seqlens():
    micro, _ = plan_step(make_examples(12, seed=0), TrainConfig(capacity=64), "correct", 1, 1)
    full = micro[0][0]
    part = select_rows(full, [2, 0])
    assert part.shape == (2, 64) and part.input_ids[0].tolist() == full.input_ids[2].tolist()
    lengths = [s.stop - s.start for s in part.segments]
    assert part.cu_seqlens.tolist()[-1] == sum(lengths) == part.n_real_tokens
    assert {s.row for s in part.segments} == {0, 1}


def test_validate_checks_before_anything_runs():
    cfg = TrainConfig(steps=1, examples_per_step=2, capacity=256)
    with pytest.raises(PacksimError, match="world size 3 is larger than --examples-per-step 2"):
        validate(2, cfg, 3, 1, "global", "none")
    with pytest.raises(PacksimError, match="step 1: 1 pack\\(s\\) for 2 ranks"):
        validate(2, cfg, 2, 1, "global", "tokens", make_examples(2))
    with pytest.raises(PacksimError, match="unknown --normalise 'sum'"):
        validate(2, cfg, 1, 1, "sum", "none")
    with pytest.raises(PacksimError, match="has 2[0-9] tokens but --capacity is 16"):
        validate(2, TrainConfig(steps=1, examples_per_step=2, capacity=16), 1, 1, "global", "none", make_examples(2))
    with pytest.raises(PacksimError, match="need 2 examples, got 1"):
        validate(1, cfg, 1, 1, "global", "none")


def test_validation_is_a_packsim_error():
    with pytest.raises(PacksimError, match="unknown --balance"):
        plan_step(make_examples(2), TrainConfig(), "correct", 1, 1, balance="random")
