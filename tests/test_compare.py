"""packsim compare on a very small budget: valid results.json and a self-contained report.html
(or, without plotly, results.json and one line saying report.html was skipped)."""

import json
import re
import subprocess
import sys

import pytest
import torch

from packsim.cli import main
from packsim.core.errors import PacksimError
from packsim.experiment.comparison import experiment_config, load_model
from packsim.experiment.results import Results

TINY = ["--steps", "4", "--examples-per-step", "16", "--n-test", "12", "--throughput-steps", "1", "--quiet"]


@pytest.fixture(scope="module")
def tasks_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("cmp")
    assert main(["compare", "--fast", *TINY, "--setups", "buggy,correct,padded", "--out", str(out)]) == 0
    return out


def test_results_json_has_the_documented_schema(tasks_out):
    d = json.loads((tasks_out / "results.json").read_text())
    assert set(d) >= {"runs", "config", "env", "throughput", "wall_s"}
    assert [(r["setup"], r["seed"]) for r in d["runs"]] == [("buggy", 0), ("correct", 0), ("padded", 0)]
    for r in d["runs"]:
        assert {"isolated_exact_match", "isolated_response_loss", "real_tokens_per_s", "reported_loss",
                "outside_attention_share", "train_isolated_response_loss"} <= set(r["final"])
        assert 0 <= r["final"]["isolated_exact_match"] <= 1
        assert len(r["curves"]["train"]["reported_loss"]) == 4
        assert r["curves"]["eval"]["step"][-1] == 4
    assert d["config"]["train"]["steps"] == 4 and d["config"]["mode"] == "fast"
    assert {"torch", "transformers", "device", "packsim"} <= set(d["env"])
    assert set(d["throughput"]) == {"padded", "correct", "buggy"}
    shares = {r["setup"]: r["final"]["outside_attention_share"] for r in d["runs"]}
    assert shares["correct"] == 0 and shares["padded"] == 0 and shares["buggy"] > 0.1
    Results.load(tasks_out)  # loads back through the dataclasses


def test_report_is_self_contained_with_card_and_tables(tasks_out):
    page = (tasks_out / "report.html").read_text()
    assert "Buggy vs correct, measured" in page and "cross-example attention" in page
    assert page.count("plotly.js v") <= 2 and "Plotly.newPlot" in page  # plotly.js embedded once
    assert not re.search(r"<script[^>]+src=", page), "report must not load scripts from the network"
    assert "long-tailed mix" in page


def test_trained_models_are_saved_and_load_back(tasks_out):
    model = load_model(tasks_out, "buggy", seed=0)
    saved = torch.load(tasks_out / "models" / "buggy-seed0.pt", weights_only=True)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in saved.items())
    with pytest.raises(PacksimError, match="no trained model"):
        load_model(tasks_out, "mask_fix")


def test_facts_design_records_first_and_repeat_copies(tmp_path):
    args = ["compare", "--fast", *TINY, "--data", "facts", "--entities", "30", "--setups", "buggy"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    run = Results.load(tmp_path).runs[0]
    assert run.data == "facts" and Results.load(tmp_path).config["n_entities"] == 30
    assert {"response_loss_first", "response_loss_repeat", "heldout_exact_match"} <= set(run.final)


def test_facts_copies_reach_the_training_stream():
    from packsim.experiment.comparison import design_data

    cfg = experiment_config("facts", fast=True, steps=2, examples_per_step=12, n_entities=5, copies=3)
    data = design_data(cfg, seed=0)
    assert data.groups[:6] == ["first", "repeat", "repeat"] * 2
    assert data.train[0] is data.train[2] and data.train[2] is not data.train[3]
    with pytest.raises(PacksimError, match="copies >= 1, got 225 and 0"):
        experiment_config("facts", fast=True, steps=1, copies=0)  # before training


def test_budgets_and_bad_options():
    fast, full = experiment_config("tasks", fast=True), experiment_config("tasks", fast=False)
    assert fast.setups == ["buggy", "correct"] and len(fast.seeds) == 1
    assert full.setups == ["buggy", "correct", "mask_fix", "loss_fix", "padded"] and len(full.seeds) == 3
    assert experiment_config("facts", fast=False).train.strategy == "sequential"
    assert experiment_config("tasks", fast=True, steps=7).train.steps == 7
    with pytest.raises(PacksimError, match="unknown data design 'fact'"):
        experiment_config("fact")
    with pytest.raises(PacksimError, match="unknown setup 'corect'"):
        experiment_config("tasks", setups=["corect"])
    with pytest.raises(PacksimError, match="unknown experiment option 'stepz'"):
        experiment_config("tasks", stepz=3)


def test_parallel_runs_stream_records_and_match_in_process_runs():
    from packsim.experiment.comparison import run_comparison

    cfg = experiment_config("tasks", fast=True, steps=2, examples_per_step=8, n_test=8, throughput_steps=0)
    records = []
    parallel = run_comparison(cfg, device="cpu", callback=records.append, progress=False, jobs=2)
    inline = run_comparison(cfg, device="cpu", progress=False, jobs=1)
    assert sorted((r.setup, r.kind, r.step) for r in records) == sorted(
        (s, k, step) for s in ("buggy", "correct") for k, step in (("train", 1), ("train", 2), ("eval", 2)))
    assert [r.setup for r in parallel.runs] == ["buggy", "correct"] and parallel.env["parallel_runs"] == 2
    for a, b in zip(parallel.runs, inline.runs, strict=True):
        assert a.curves["train"]["reported_loss"] == pytest.approx(b.curves["train"]["reported_loss"], abs=1e-5)


def test_report_subcommand_rebuilds_the_html(tasks_out, tmp_path, capsys):
    assert main(["report", str(tasks_out), "--out", str(tmp_path / "r.html")]) == 0
    assert "Buggy vs correct, measured" in (tmp_path / "r.html").read_text()
    assert "isolated exact match" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:  # the CLI: one line, exit 2 (tests/test_cli.py has the rest)
        main(["report", str(tmp_path / "missing")])
    assert exc.value.code == 2 and "no results at" in capsys.readouterr().err


def test_compare_without_plotly_writes_results_and_says_report_html_was_skipped(tmp_path):
    """A machine without plotly (a GPU box): any plotly import fails in this process, and compare
    still trains, prints its summary, writes results.json and says in one line why no report.html."""
    no_plotly = ("import sys; sys.modules['plotly'] = None  # import plotly -> ImportError\n"
                 "from packsim.cli import main; sys.exit(main(sys.argv[1:]))")
    args = ["compare", "--fast", *TINY, "--setups", "correct", "--throughput-steps", "0", "--jobs", "1",
            "--out", str(tmp_path)]
    proc = subprocess.run([sys.executable, "-c", no_plotly, *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    skipped = "report.html skipped: plotly is not installed; pip install plotly to get it"
    assert proc.stdout.count(skipped) == 1, proc.stdout
    assert "[tasks] mean [min, max] over seeds" in proc.stdout  # the summary needs no plotly
    assert f"wrote {tmp_path / 'results.json'} in " in proc.stdout and "report.html in" not in proc.stdout
    assert (tmp_path / "results.json").exists() and not (tmp_path / "report.html").exists()
    assert [r.setup for r in Results.load(tmp_path).runs] == ["correct"]
