"""The result format shared by the trainer, packsim compare and the curves widget."""

import json

import pytest

from packsim.core.errors import PacksimError
from packsim.experiment.results import Results, RunResult, StepRecord, spread


def test_records_append_aligned_columns():
    run = RunResult("buggy", 0)
    run.add(StepRecord("train", "buggy", 0, 1, {"reported_loss": 2.0, "response_loss": 3.0}))
    run.add(StepRecord("train", "buggy", 0, 2, {"reported_loss": 1.5, "response_loss_first": 0.5}))
    tr = run.curves["train"]
    assert tr["step"] == [1, 2] and tr["reported_loss"] == [2.0, 1.5]
    assert tr["response_loss"] == [3.0, None] and tr["response_loss_first"] == [None, 0.5]
    assert all(len(c) == 2 for c in tr.values())
    assert run.last("train", "response_loss") == 3.0 and run.last("eval", "x") is None


def test_save_load_round_trip_and_summary(tmp_path):
    runs = [RunResult("correct", s, final={"isolated_exact_match": v}) for s, v in ((0, 0.8), (1, 0.9))]
    res = Results(runs, {"data": "tasks"}, {"torch": "x"}, {"padded": {"real_tokens_per_s": 1.0}}, 3.5)
    path = res.save(tmp_path / "out" / "results.json")
    loaded = Results.load(tmp_path / "out")
    assert loaded.to_dict() == res.to_dict() == json.loads(path.read_text())
    s = loaded.summary("isolated_exact_match")["correct"]
    assert s["mean"] == pytest.approx(0.85) and (s["min"], s["max"], s["n"]) == (0.8, 0.9, 2)


def test_bad_results_files_say_what_to_do(tmp_path):
    with pytest.raises(PacksimError, match=f"packsim compare --out {tmp_path / 'nowhere'}`"):
        Results.load(tmp_path / "nowhere")
    with pytest.raises(PacksimError, match="'runs' list"):
        Results.from_dict({"config": {}})


def test_spread_of_one_and_none():
    assert spread([2.0]) == {"mean": 2.0, "min": 2.0, "max": 2.0, "std": 0.0, "n": 1}
    assert spread([])["n"] == 0
