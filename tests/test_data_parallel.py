"""packsim train: 1 process vs 2 gloo ranks (torchrun) vs 2 ranks x 2 micro-batches, and the Trainer (accelerate).

Two launches for the whole module (each costs two fresh Pythons): torchrun runs every packsim-engine
configuration and ``accelerate launch`` every Trainer configuration, through tests/dp_worker.py.
The one-process references run in this process. Equal means: every step's loss within 1e-5 and
every weight within 5e-4 (Adam turns float summation-order noise in near-zero gradients into
updates of up to ~1e-4 after a few steps); the wrong normalisations move weights by > 1e-3.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from packsim.cli import main
from packsim.core.data import make_examples
from packsim.core.loss import IGNORE_INDEX
from packsim.experiment.training import TrainConfig
from packsim.scaling.data_parallel import _empty_like, data_parallel_step, train_data_parallel
from packsim.scaling.step_plan import plan_step
from packsim.scaling.train_command import compare_outputs, load_output, torchrun_command

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "tests" / "dp_worker.py")
BASE = ["--steps", "4", "--examples-per-step", "12", "--quiet"]
# name -> (data, options) trained on 2 ranks by torchrun
TWO_RANKS = {
    "global": ("tasks", ["--normalise", "global"]),
    "global_accum2": ("tasks", ["--normalise", "global", "--grad-accum", "2"]),
    # 12 task examples make 2 packs of 128 tokens: dealt by tokens, each rank gets 1 pack for 2
    # micro-batches, so every rank's second micro-batch is empty (the reference packs into 256)
    "global_empty": ("tasks", ["--normalise", "global", "--grad-accum", "2", "--balance", "tokens",
                               "--capacity", "128"]),
    "global_long": ("long_tailed", ["--normalise", "global", "--grad-accum", "2"]),
    "local": ("long_tailed", ["--normalise", "local"]),
    "mean_accum2": ("long_tailed", ["--normalise", "mean", "--grad-accum", "2"]),
}
# name -> options trained on 2 ranks by accelerate launch, through the transformers Trainer
TRAINER = {
    "trainer_on": ["--engine", "trainer", "--normalise", "global"],
    "trainer_off": ["--engine", "trainer", "--normalise", "local"],
}
EQUAL_LOSS, EQUAL_WEIGHT, DRIFT = 1e-5, 5e-4, 1e-3
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _argv(out: Path, data: str, options: list[str]) -> list[str]:
    return [*BASE, "--data", data, *options, "--out", str(out)]


def _one_process(out: Path, data: str, options: list[str] = ()) -> Path:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each launched rank (torchrun sets OMP_NUM_THREADS=1)
    try:
        assert main(["train", *_argv(out, data, list(options))]) == 0
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Output folders by name: the launched runs and the one-process references."""
    tmp = tmp_path_factory.mktemp("dp")
    ranks = {name: _argv(tmp / name, data, opts) for name, (data, opts) in TWO_RANKS.items()}
    trainer = {name: _argv(tmp / name, "long_tailed", opts) for name, opts in TRAINER.items()}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                WORKER, json.dumps(list(ranks.values()))]
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                  "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                  "--main_process_port", str(_free_port()), WORKER, json.dumps(list(trainer.values()))]
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for cmd in (torchrun, accelerate)]
    out = {name: tmp / name for name in [*ranks, *trainer]}
    out["one_tasks"] = _one_process(tmp / "one_tasks", "tasks")
    out["one_long"] = _one_process(tmp / "one_long", "long_tailed")
    out["trainer_one"] = _one_process(tmp / "trainer_one", "long_tailed", ["--engine", "trainer"])
    for proc in procs:
        log, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, log[-3000:]
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(("name", "reference"), [
    ("global", "one_tasks"), ("global_accum2", "one_tasks"), ("global_empty", "one_tasks"),
    ("global_long", "one_long"),
])
def test_global_normalisation_matches_one_process(runs, name, reference):
    diff = compare_outputs(runs[name], runs[reference])
    assert diff["steps"] == 4
    assert diff["max_loss_diff"] < EQUAL_LOSS and diff["max_weight_diff"] < EQUAL_WEIGHT, diff
    run = load_output(runs[name])["run"]
    assert run.extra["world_size"] == 2 and run.extra["normalise"] == "global"


def test_empty_micro_batch_contributes_zero(runs):
    run = load_output(runs["global_empty"])["run"]
    tables = torch.tensor(run.extra["targets"])  # (steps, R, M)
    assert tables.shape == (4, 2, 2) and bool((tables[:, :, 1] == 0).all()) and bool((tables[:, :, 0] > 0).all())
    assert all(torch.isfinite(torch.tensor(run.curves["train"]["reported_loss"])))


@pytest.mark.parametrize("name", ["local", "mean_accum2"])
def test_local_and_mean_drift_when_ranks_count_differently(runs, name):
    run = load_output(runs[name])["run"]
    per_rank = torch.tensor(run.extra["targets"]).sum(dim=2)  # (steps, R)
    assert bool((per_rank[:, 0] != per_rank[:, 1]).all()), per_rank  # the data makes unequal counts
    drift = compare_outputs(runs[name], runs["one_long"])
    exact = compare_outputs(runs["global_long"], runs["one_long"])
    assert drift["max_weight_diff"] > DRIFT and drift["max_weight_diff"] > 20 * exact["max_weight_diff"], drift
    assert drift["max_loss_diff"] > DRIFT, drift


def test_trainer_across_processes(runs):
    on, off = (compare_outputs(runs[n], runs["trainer_one"]) for n in ("trainer_on", "trainer_off"))
    assert on["max_loss_diff"] < EQUAL_LOSS and on["max_weight_diff"] < EQUAL_WEIGHT, on
    assert off["max_weight_diff"] > DRIFT and off["max_weight_diff"] > 20 * on["max_weight_diff"], off
    extra = load_output(runs["trainer_on"])["run"].extra
    assert extra["world_size"] == 2 and extra["backend"] == "gloo" and extra["average_tokens_across_devices"]
    assert load_output(runs["trainer_off"])["run"].extra["average_tokens_across_devices"] is False


# ------------------------------------------------------------------------------ in one process


def test_empty_micro_batch_in_one_process_changes_nothing():
    cfg = TrainConfig(steps=2, examples_per_step=1, capacity=64, warmup_steps=1)
    examples = make_examples(2, seed=0)
    from packsim.core.model import build_model

    runs, threads = {}, torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for accum in (1, 2):  # with 2, every step's second micro-batch has no example
            model = build_model("tiny", seed=0)
            runs[accum] = (train_data_parallel(model, examples, "correct", cfg, grad_accum=accum), model.state_dict())
    finally:
        torch.set_num_threads(threads)
    (one, w1), (two, w2) = runs[1], runs[2]
    assert torch.tensor(two.extra["targets"])[:, 0, 1].eq(0).all()
    assert one.curves["train"]["reported_loss"] == pytest.approx(two.curves["train"]["reported_loss"], abs=1e-6)
    assert max(float((w1[k] - w2[k]).abs().max()) for k in w1) < 1e-6


def test_data_parallel_step_on_one_rank_is_the_token_mean_step():
    """Ground truth by hand: one loss over both micro-batches, divided by their total count."""
    from packsim.core.loss import count_targets, packed_cross_entropy
    from packsim.core.model import build_model, forward
    from packsim.experiment.training import make_optimizer, optimizer_step

    cfg = TrainConfig(capacity=64, warmup_steps=1)
    micro, _ = plan_step(make_examples(6, seed=1), cfg, "correct", 1, 2)
    mine = micro[0]
    n = sum(count_targets(b.labels) for b in mine)
    a, b = build_model("tiny", seed=0), build_model("tiny", seed=0)
    a.train(), b.train()
    opt_a, opt_b = make_optimizer(a, cfg), make_optimizer(b, cfg)
    done = data_parallel_step(a, opt_a, mine, 0, cfg, "global")
    loss = sum(packed_cross_entropy(forward(b, mb), mb.labels, num_items=n) for mb in mine)
    loss.backward()
    optimizer_step(b, opt_b, 0, cfg)
    assert done.counts.tolist() == [[float(count_targets(mb.labels)) for mb in mine]]
    assert float(done.summed.sum()) / n == pytest.approx(float(loss), rel=1e-5)
    wa, wb = a.state_dict(), b.state_dict()
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-6


def test_empty_stand_in_counts_nothing():
    micro, _ = plan_step(make_examples(4, seed=0), TrainConfig(capacity=64), "correct", 1, 1)
    empty = _empty_like(micro[0][0])
    assert empty.shape[0] == 1 and bool((empty.labels == IGNORE_INDEX).all())


def test_torchrun_command_is_the_real_launcher():
    cmd = torchrun_command(2, ["--steps", "3"])
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert cmd[-5:] == ["-m", "packsim", "train", "--steps", "3"] and "--nproc_per_node" in cmd


# ------------------------------------------------------------------------------ bad input


def _fails(argv: list[str], capsys, match: str) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["train", "--quiet", *argv])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and match in err, err


def test_world_size_larger_than_examples_per_step(capsys, monkeypatch):
    _fails(["--nproc", "3", "--examples-per-step", "2", "--steps", "1"], capsys,
           "world size 3 is larger than --examples-per-step 2")
    monkeypatch.setenv("WORLD_SIZE", "4")  # as under torchrun: checked before any process group
    monkeypatch.setenv("RANK", "0")
    _fails(["--examples-per-step", "2", "--steps", "1"], capsys, "world size 4 is larger")


def test_a_rank_with_no_pack(capsys):
    _fails(["--nproc", "2", "--balance", "tokens", "--examples-per-step", "2", "--steps", "1"], capsys,
           "step 1: 1 pack(s) for 2 ranks: a rank would have no pack")


def test_unknown_normalise_and_trainer_batch(capsys):
    _fails(["--normalise", "median", "--steps", "1"], capsys, "unknown --normalise 'median'")
    _fails(["--engine", "trainer", "--nproc", "2", "--examples-per-step", "5", "--steps", "1"], capsys,
           "divisible by processes x --grad-accum (2 x 1)")

