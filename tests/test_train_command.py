"""packsim.scaling.train_command: a packsim train output written, read back exactly, and diffed; runs launched."""

from __future__ import annotations

import pytest
import torch

from packsim.core.errors import PacksimError
from packsim.core.model import build_model
from packsim.experiment.results import RunResult, StepRecord
from packsim.scaling.train_command import compare_outputs, launch_runs, load_output, save_output


def _run(losses: list[float]) -> RunResult:
    run = RunResult(setup="correct", seed=0)
    for step, loss in enumerate(losses, start=1):
        run.add(StepRecord("train", "correct", 0, step, {"reported_loss": loss, "response_loss": 2 * loss}))
    return run


def test_round_trip_keeps_full_precision(tmp_path):
    model = build_model("tiny", seed=0)
    losses = [1.0 + 1e-9, 0.5 + 3e-10]  # beyond results.json's 6 digits
    path = save_output(_run(losses), model, tmp_path / "a", {"steps": 2}, {"world_size": 1})
    assert path == tmp_path / "a" / "results.json"
    out = load_output(tmp_path / "a")
    assert out["losses"]["reported_loss"] == losses
    assert out["run"].setup == "correct" and set(out["state"]) == set(model.state_dict())
    assert all(torch.equal(out["state"][k], v) for k, v in model.state_dict().items())


def test_compare_outputs_gives_the_largest_differences(tmp_path):
    a, b = build_model("tiny", seed=0), build_model("tiny", seed=0)
    with torch.no_grad():
        next(b.parameters())[0, 0] += 0.25
    save_output(_run([1.0, 0.5]), a, tmp_path / "a", {}, {})
    save_output(_run([1.0, 0.75]), b, tmp_path / "b", {}, {})
    diff = compare_outputs(tmp_path / "a", load_output(tmp_path / "b"))  # a folder or a loaded output
    assert diff == {"steps": 2, "max_loss_diff": 0.25, "max_weight_diff": pytest.approx(0.25)}
    assert compare_outputs(tmp_path / "a", tmp_path / "b", loss="response_loss")["max_loss_diff"] == 0.5
    save_output(_run([1.0]), a, tmp_path / "short", {}, {})
    with pytest.raises(PacksimError, match="differ in steps or model"):
        compare_outputs(tmp_path / "a", tmp_path / "short")


def test_missing_output_says_how_to_make_it(tmp_path):
    with pytest.raises(PacksimError, match="run `packsim train --out"):
        load_output(tmp_path / "nothing")


# ----------------------------------------------------------------------------- launch_runs

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
