"""packsim.viz.packing: the playground shows only the controls of the chosen mix, bounds them by the
capacity, and says how many lengths the capacity clipped (issue 40: "longest 512" beside a 16-256 slider)."""

from __future__ import annotations

import numpy as np

from packsim.core.data import long_tailed_lengths
from packsim.viz.packing import clipped_count, packing_playground


def test_only_the_chosen_mixs_controls_show():
    p = packing_playground(n=30, capacity=128)
    assert p.long_tailed_controls.layout.display == "" and p.uniform_controls.layout.display == "none"
    p.distribution.value = "uniform"
    assert p.long_tailed_controls.layout.display == "none" and p.uniform_controls.layout.display == ""
    assert p.median.disabled and p.sigma.disabled and not p.uniform_range.disabled
    # the sliders share one Layout object: hiding happens on their boxes, so the others stay shown
    assert p.n.layout.display in (None, "") and p.capacity.layout.display in (None, "")


def test_sliders_offer_no_length_above_the_capacity():
    p = packing_playground(n=30, capacity=512)
    assert p.median.max == 512 and p.uniform_range.max == 512
    p.capacity.value = 64
    assert p.median.max == 64 and p.uniform_range.max == 64
    assert p.median.value <= 64 and p.uniform_range.value[1] <= 64
    p.capacity.value = 2048
    assert p.median.max == 2048 and p.uniform_range.max == 2048


def test_the_numbers_say_how_many_lengths_were_clipped():
    # ground truth: the same lognormal draw, unclipped, counted here
    rng = np.random.default_rng(0)
    raw = np.clip(np.rint(rng.lognormal(np.log(90), 0.9, size=120)), 8, None)
    want = int((raw > 512).sum())
    assert want > 0 and clipped_count("long_tailed", 120, 512, seed=0) == want
    p = packing_playground(n=120, capacity=512)  # lesson 01's call
    longest = int(p.lengths().max())
    assert longest == 512 and f"longest 512 ({want} drawn longer, clipped to the capacity" in p.stats.value
    assert clipped_count("uniform", 120, 64) == 0
    p.distribution.value = "uniform"
    assert "clipped" not in p.stats.value and f"longest {int(p.lengths().max())}." in p.stats.value
    assert long_tailed_lengths(120, max_len=512, seed=0).max() == 512
