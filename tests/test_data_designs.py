"""packsim.experiment.data_designs: each command's --data names, and packsim train's example streams."""

from __future__ import annotations

import subprocess
import sys

import pytest

from packsim.core.data import make_examples, make_long_tailed_examples
from packsim.core.errors import PacksimError
from packsim.experiment.data_designs import COMPARE_DESIGNS, TRAIN_DESIGNS, make_data


def test_the_names_each_command_takes():
    assert COMPARE_DESIGNS == ("tasks", "facts")
    assert TRAIN_DESIGNS == ("tasks", "long_tailed")


def test_make_data_builds_each_train_design():
    assert make_data("tasks", 5, seed=2, capacity=256) == make_examples(5, seed=2)
    long = make_data("long_tailed", 40, seed=1, capacity=128)
    assert long == make_long_tailed_examples(40, seed=1, median=32, max_len=128)  # median capacity // 4
    assert max(len(ex.tokens) for ex in long) <= 128
    counts = {len(ex.tokens) - ex.n_prompt for ex in long}
    assert len(counts) > 10  # response counts differ a lot between examples


def test_unknown_design_names_the_choices():
    with pytest.raises(PacksimError, match=r"unknown --data 'facts': use one of \['tasks', 'long_tailed'\]"):
        make_data("facts", 4, seed=0, capacity=256)


def test_importing_it_loads_no_torch_or_numpy():
    code = ("import sys\nimport packsim.experiment.data_designs\n"
            "print('torch' in sys.modules, 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
