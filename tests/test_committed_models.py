"""packsim.experiment.committed_models: the committed trained models load and score as their run recorded."""

import pytest
import torch

from packsim.core.attention_share import mean_outside_share
from packsim.core.batch import PackedBatch
from packsim.core.data import make_dataset, make_examples
from packsim.core.errors import PacksimError
from packsim.core.model import attention_maps, build_model
from packsim.experiment.committed_models import (
    COMMITTED_SETUPS,
    committed_metadata,
    committed_path,
    export_committed,
    load_committed_model,
)
from packsim.experiment.comparison import save_model
from packsim.experiment.evaluation import evaluate_isolated
from packsim.experiment.results import Results, RunResult

# Scores are recomputed on the CPU in float32; another CPU or thread count may sum in another order
# and flip an argmax on a near-tie, so exact match may differ by a token decision or two.
EXACT_MATCH_SLACK = 2


@pytest.mark.parametrize("setup", COMMITTED_SETUPS)
def test_committed_model_scores_as_recorded(setup):
    meta = committed_metadata(setup)
    assert (meta["data"], meta["mode"], meta["setup"], meta["seed"]) == ("tasks", "full", setup, 0)
    assert committed_path(setup).stat().st_size < 4_000_000  # a few MB, fit for git
    model = load_committed_model(setup, device="cpu")
    assert not model.training
    test = make_dataset(1, meta["n_test"], seed=meta["seed"])[1]  # the run's held-out set
    scores = evaluate_isolated(model, test)
    assert abs(scores["exact_match"] - meta["isolated_exact_match"]) <= EXACT_MATCH_SLACK / meta["n_test"], scores
    rows = PackedBatch.from_examples(test[:64], meta["capacity"], setup=setup, strategy="sequential")
    with torch.no_grad():
        share = mean_outside_share(attention_maps(model, rows), rows.seq_ids)
    assert share == pytest.approx(meta["outside_attention_share"], abs=1e-4)


def test_committed_buggy_model_reads_its_neighbours_and_correct_does_not():
    buggy, correct = (committed_metadata(s) for s in ("buggy", "correct"))
    assert buggy["outside_attention_share"] > 0.1
    assert correct["outside_attention_share"] == 0.0
    assert correct["isolated_exact_match"] > buggy["isolated_exact_match"]


def test_unknown_setup_is_refused_with_the_ones_committed():
    with pytest.raises(PacksimError, match="commits"):
        load_committed_model("mask_fix")


def _fake_run(tmp_path, data="tasks", mode="full"):
    train_cfg = {"steps": 3, "examples_per_step": 4, "capacity": 64}
    final = {"isolated_exact_match": 0.25, "outside_attention_share": 0.5, "reported_loss": 1.5,
             "response_loss": 1.25}
    runs = [RunResult(setup=s, seed=0, data=data, final=dict(final)) for s in COMMITTED_SETUPS]
    config = {"data": data, "mode": mode, "model_size": "tiny", "n_test": 8, "train": train_cfg}
    Results(runs=runs, config=config, env={"torch": torch.__version__}).save(tmp_path / "results.json")
    for s in COMMITTED_SETUPS:
        save_model(build_model(seed=1 if s == "buggy" else 2), tmp_path, s, 0)
    return tmp_path


def test_export_then_load_round_trips_weights_and_metadata(tmp_path):
    run = _fake_run(tmp_path / "run")
    written = export_committed(run, dest=tmp_path / "out")
    assert [p.name for p in written] == [f"{s}-seed0.safetensors" for s in COMMITTED_SETUPS]
    loaded = load_committed_model("buggy", device="cpu", folder=tmp_path / "out")
    reference = build_model(seed=1)
    batch = PackedBatch.from_examples(make_examples(3, seed=0), 64, setup="buggy")
    with torch.no_grad():
        assert torch.equal(loaded(batch.input_ids).logits, reference(batch.input_ids).logits)
    meta = committed_metadata("buggy", folder=tmp_path / "out")
    assert (meta["steps"], meta["capacity"], meta["isolated_exact_match"]) == (3, 64, 0.25)


def test_export_refuses_a_run_that_is_not_the_full_tasks_design(tmp_path):
    run = _fake_run(tmp_path, data="facts")
    with pytest.raises(PacksimError, match="tasks design in full mode"):
        export_committed(run, dest=tmp_path / "out")


def test_missing_folder_file_says_how_to_write_it(tmp_path):
    with pytest.raises(PacksimError, match="export_committed"):
        load_committed_model("correct", folder=tmp_path)
