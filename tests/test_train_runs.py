"""packsim.scaling.train_runs: several packsim train runs started from Python, outputs loaded back."""

from __future__ import annotations

import pytest
import torch

from packsim.core.errors import PacksimError
from packsim.scaling.train_runs import launch_runs

TINY = ["--steps", "2", "--examples-per-step", "4", "--capacity", "128", "--quiet"]


def test_one_process_runs_train_here_with_the_threads_asked_and_load(tmp_path):
    before = torch.get_num_threads()
    runs = launch_runs({"a": TINY, "b": [*TINY, "--normalise", "local"]}, tmp_path, threads=1)
    assert torch.get_num_threads() == before  # restored after the runs
    assert set(runs) == {"a", "b"} and (tmp_path / "a" / "model.pt").exists()
    assert runs["a"]["run"].extra["world_size"] == 1 and runs["b"]["run"].extra["normalise"] == "local"
    assert len(runs["a"]["losses"]["reported_loss"]) == 2


def test_launch_runs_raises_with_the_runs_error(tmp_path):
    with pytest.raises(PacksimError, match="run .bad. failed \\(unknown --normalise .median."):
        launch_runs({"bad": ["--normalise", "median", "--steps", "1", "--quiet"]}, tmp_path)
