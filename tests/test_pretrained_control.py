"""packsim.experiment.pretrained_control: the pretrain-then-fine-tune run records what its models measure, and the
committed run's file agrees with its committed weights. Ground truth: forensics' measure rerun here on the
saved models, and the streams' longest examples counted here."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from packsim.core.data import make_dataset, make_long_tailed_examples
from packsim.experiment import pretrained_control as pc
from packsim.experiment.forensics import measure


@functools.cache
def _fast_run(folder: str) -> dict:
    torch.manual_seed(0)
    return pc.run_pretrained_control(pc.fast_config(), out=folder, progress=False)


@pytest.fixture(scope="module")
def fast(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pretrained-control")
    return folder, _fast_run(str(folder))


def test_a_run_writes_its_results_and_models(fast):
    folder, res = fast
    assert json.loads((folder / "results.json").read_text()) == json.loads(json.dumps(res))
    cfg = pc.fast_config()
    assert res["command"].startswith("python -m packsim.experiment.pretrained_control")
    assert {"date", "torch", "transformers", "packsim"} <= set(res["env"])
    for start in pc.STARTS:
        for setup in pc.SETUPS:
            steps = [p["step"] for p in res["runs"][start][setup]["curve"]]
            assert steps == list(range(cfg.eval_every, cfg.finetune.steps + 1, cfg.eval_every)), steps
    for name in ("base", *pc.SETUPS):
        assert (folder / f"{name}-seed0.safetensors").exists()


def test_the_recorded_pack_gaps_are_what_the_saved_models_measure(fast):
    folder, res = fast
    cfg = pc.fast_config()
    train = make_dataset(cfg.finetune.steps * cfg.finetune.examples_per_step, 0, seed=cfg.seed)[0]
    n = cfg.samples[0]
    for setup in pc.SETUPS:
        model = pc.load_finetuned(setup, folder)
        last = res["runs"]["pretrained"][setup]["curve"][-1]
        got = measure(model, train[:n], capacity=cfg.finetune.capacity)
        assert got.pack_gap == pytest.approx(last[f"pack_gap_{n}"], abs=1e-6)
        assert got.n == last[f"n_{n}"]
    base = measure(pc.load_finetuned("base", folder), train[:n], capacity=cfg.finetune.capacity)
    assert base.pack_gap == pytest.approx(res["base"][f"pack_gap_{n}"], abs=1e-6)


def test_the_longest_examples_are_counted_from_the_streams(fast):
    _, res = fast
    cfg = pc.fast_config()
    train = make_dataset(cfg.finetune.steps * cfg.finetune.examples_per_step, 0, seed=cfg.seed)[0]
    n = cfg.pretrain_steps * cfg.docs_per_step  # half task examples of another seed, half copy documents
    docs = make_dataset(n // 2, 0, seed=cfg.seed + 1000)[0] + make_long_tailed_examples(
        n - n // 2, seed=cfg.seed + 1000, median=cfg.doc_median, max_len=cfg.finetune.capacity)
    assert res["longest"] == {"finetuning_example": max(len(e.tokens) for e in train),
                              "pretraining_document": max(len(e.tokens) for e in docs)}
    assert res["capacity"] == cfg.finetune.capacity


def test_the_committed_run_is_the_full_recipe_and_its_weights_reproduce_its_numbers():
    res = pc.load_pretrained_control()
    full = pc.ControlConfig().as_dict()
    assert res["config"] == json.loads(json.dumps(full))  # 2000 pretraining steps, the committed runs' fine-tuning
    assert res["longest"]["finetuning_example"] == 25 and res["capacity"] == 256
    train = make_dataset(128, 0, seed=0)[0]  # lesson 07's fast-mode sample
    for setup in pc.SETUPS:
        got = measure(pc.load_finetuned(setup), train, capacity=256)
        want = res["runs"]["pretrained"][setup]["curve"][-1]["pack_gap_128"]
        assert got.pack_gap == pytest.approx(want, abs=1e-5), setup


def test_a_missing_run_and_an_unknown_model_are_named(tmp_path):
    from packsim.core.errors import PacksimError

    with pytest.raises(PacksimError, match="no results at"):
        pc.load_pretrained_control(tmp_path)
    with pytest.raises(PacksimError, match="choose correct, buggy or base"):
        pc.load_finetuned("padded", tmp_path)


def test_the_readme_table_is_the_committed_run():
    """The README's pretrained-control table reads results/pretrained-control/results.json."""
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    res = pc.load_pretrained_control()
    runs, gap = res["runs"], "pack_gap_256"
    pre, scr = runs["pretrained"], runs["scratch"]
    want = (f"| pretrained base | {res['base'][gap]:+.3f} ({res['base']['isolated_exact_match']:.3f}) "
            f"| {pre['correct']['curve'][0][gap]:+.2f} | **{pre['correct']['curve'][-1][gap]:+.2f}** "
            f"({pre['correct']['curve'][-1]['isolated_exact_match']:.3f}) | {pre['buggy']['curve'][-1][gap]:+.2f} "
            f"({pre['buggy']['curve'][-1]['isolated_exact_match']:.3f}) |")
    assert want in text, want
    want = (f"| scratch | - | {scr['correct']['curve'][0][gap]:+.2f} | **{scr['correct']['curve'][-1][gap]:+.2f}** "
            f"({scr['correct']['curve'][-1]['isolated_exact_match']:.3f}) | {scr['buggy']['curve'][-1][gap]:+.2f} "
            f"({scr['buggy']['curve'][-1]['isolated_exact_match']:.3f}) |")
    assert want in text, want
    assert f"{res['wall_s']:.0f} s on this machine" in text
