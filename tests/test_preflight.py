"""``packsim audit --model DIR --data FILE --collator NAME``: the pre-flight gate (exit codes and
``--trainer``: tests/test_audit_gate.py)."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

pytest.importorskip("trl")  # a dev dependency: CI installs it

from installed import trl_padding_free_emits_seq_idx
from pipelines import PAIRS, one_thread, save_tiny_checkpoint  # noqa: E402, F401

from packsim.auditing.preflight import COLLATORS, available_attn  # noqa: E402
from packsim.auditing.records import load_records  # noqa: E402
from packsim.cli import main  # noqa: E402
from packsim.core.errors import PacksimError  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A saved tiny Llama + tokenizer directory, a good JSONL file and one with a bad line 3."""
    root = tmp_path_factory.mktemp("preflight")
    save_tiny_checkpoint(root / "ckpt")
    lines = [json.dumps({"prompt": p, "completion": c}) for p, c in PAIRS]
    (root / "data.jsonl").write_text("\n".join(lines) + "\n")
    (root / "bad.jsonl").write_text("\n".join(lines[:2] + [json.dumps({"prompt": "abc="})]) + "\n")
    return root


def audit_cli(files, collator, *extra):
    return main(["audit", "--model", str(files / "ckpt"), "--data", str(files / "data.jsonl"),
                 "--collator", collator, *extra])


def test_a_correct_pipeline_passes_the_strict_gate(files, capsys):
    assert audit_cli(files, "packsim", "--strict") == 0
    out = capsys.readouterr().out
    assert out.startswith("=== pre-flight: model") and out.rstrip().endswith("pre-flight PASS")
    assert "findings (configuration checks):" in out


def test_a_failing_pipeline_exits_1_with_or_without_strict(files, capsys):
    assert audit_cli(files, "trl-wrapped", "--max-length", "16") == 1  # the exit code follows the verdict
    out = capsys.readouterr().out
    assert "pre-flight FAIL: perturbation" in out and "wrapped_packing" in out
    assert audit_cli(files, "trl-wrapped", "--max-length", "16", "--strict") == 1  # older scripts' flag


@pytest.mark.parametrize("args, message", [
    (["--model", "/no/such/dir", "--data", "DATA", "--collator", "packsim"], "--model /no/such/dir: no such directory"),
    (["--model", "CKPT", "--data", "BAD", "--collator", "packsim"], "line 3 of"),
    (["--model", "CKPT", "--data", "DATA", "--collator", "nope"], "unknown collator 'nope'"),
    (["--data", "DATA"], "need(s) --model DIR"),
])
def test_bad_input_is_one_line_and_exit_2(files, capsys, args, message):
    paths = {"CKPT": str(files / "ckpt"), "DATA": str(files / "data.jsonl"), "BAD": str(files / "bad.jsonl")}
    with pytest.raises(SystemExit) as exit_info:
        main(["audit", *[paths.get(a, a) for a in args]])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("packsim audit: error: ") and message in err[0], err


def test_records_and_attention_implementations(files):
    assert len(load_records(files / "data.jsonl")) == len(PAIRS)
    with pytest.raises(PacksimError, match="line 3 of .* has no 'completion'"):
        load_records(files / "bad.jsonl")
    assert {"eager", "sdpa"} <= set(available_attn())
    assert COLLATORS == ("packsim", "flattening", "trl-bfd", "trl-wrapped", "trl-padding-free")


def test_without_model_the_demo_runs(capsys):
    assert main(["audit", "--setups", "correct", "--examples", "3"]) == 0
    assert "=== setup 'correct'" in capsys.readouterr().out


# ----------------------------------------------------------------------------- a hybrid checkpoint (issue 31)


@pytest.fixture(scope="module")
def bamba_files(files):
    """A saved tiny Bamba (BambaMixer + attention) with the local tokenizer, and the good JSONL file."""
    from packsim.core.tokenizer import build_tokenizer
    from packsim.exhibits.hybrid_traps import build_frontier

    build_frontier("bamba").save_pretrained(files / "bamba")
    build_tokenizer().save_pretrained(files / "bamba")
    return files


def _bamba_gate(files, collator, capsys, name="bamba") -> tuple[int, str]:
    code = main(["audit", "--model", str(files / name), "--data", str(files / "data.jsonl"), "--collator", collator])
    return code, capsys.readouterr().out


def _flattened_leak(files, return_seq_idx: bool, name="bamba", flash_kwargs=False) -> float:
    """Ground truth without the gate: the records flattened into one row (DataCollatorWithFlattening) through
    the checkpoint on the reference kernels, each example's logits packed vs alone."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorWithFlattening

    from packsim.reference.hybrid_emulation import emulate_hybrid_kernels

    tok = AutoTokenizer.from_pretrained(files / name)
    model = AutoModelForCausalLM.from_pretrained(files / name).eval()
    features = [{"input_ids": tok(p + c)["input_ids"]} for p, c in PAIRS[:4]]
    batch = DataCollatorWithFlattening(return_seq_idx=return_seq_idx, return_flash_attn_kwargs=flash_kwargs)(features)
    fields = {k: v for k, v in batch.items() if k != "labels"}
    assert ("seq_idx" in fields) == return_seq_idx
    worst, start = 0.0, 0
    with emulate_hybrid_kernels(), torch.no_grad():
        packed = model(**fields, use_cache=False).logits[0]
        for f in features:
            n = len(f["input_ids"])
            alone = model(input_ids=torch.tensor([f["input_ids"]]), use_cache=False).logits[0]
            worst, start = max(worst, float((packed[start:start + n] - alone).abs().max())), start + n
    return worst


def test_which_collator_passes_seq_idx():
    """`flattening` is DataCollatorWithFlattening() (return_seq_idx=False: no seq_idx); TRL's padding-free
    collator (trl-padding-free, trl-bfd) emits seq_idx and cu_seq_lens_* from TRL 1.16 on (1.9: position_ids
    only; measured on TRL's collator itself, tests/installed.py)."""
    import tempfile

    from packsim.auditing.preflight import build_trainer
    from packsim.core.tokenizer import build_tokenizer
    from packsim.exhibits.hybrid_traps import build_frontier

    records = [{"prompt": p, "completion": c} for p, c in PAIRS[:4]]
    tok, model = build_tokenizer(), build_frontier("bamba")
    for collator, has in (("flattening", False), ("trl-padding-free", trl_padding_free_emits_seq_idx())):
        with tempfile.TemporaryDirectory() as out:
            trainer = build_trainer(model, tok, records, collator, out)
            batch = next(iter(trainer.get_train_dataloader()))
        assert ("seq_idx" in batch) == has, (collator, sorted(batch))


def test_the_gate_measures_a_qwen3_next_checkpoint_on_the_reference_kernels(files, capsys):
    """Qwen3-Next (gated DeltaNet + attention) without fla / causal_conv1d: the gate audits on the reference
    kernels. TRL 1.16's padding-free collator gives seq_idx and cu_seq_lens_*: PASS, exit 0 (TRL 1.9: no
    seq_idx, FAIL, exit 1); flattening gives none: FAIL with the hybrid cause, exit 1. Ground truth here."""
    if torch.cuda.is_available() and importlib.util.find_spec("fla"):
        pytest.skip("the real kernels are installed: the gate runs them")
    from packsim.core.tokenizer import build_tokenizer
    from packsim.exhibits.hybrid_traps import build_frontier

    build_frontier("qwen3_next").save_pretrained(files / "qwen3_next")
    build_tokenizer().save_pretrained(files / "qwen3_next")
    assert _flattened_leak(files, True, "qwen3_next", flash_kwargs=True) <= 1e-5
    assert _flattened_leak(files, False, "qwen3_next") > 1e-3
    code, out = _bamba_gate(files, "trl-padding-free", capsys, "qwen3_next")
    if trl_padding_free_emits_seq_idx():
        assert code == 0 and out.rstrip().endswith("pre-flight PASS"), out
        assert "Qwen3NextGatedDeltaNet ran on the reference kernel (packsim, pure torch)" in out
    else:
        assert code == 1 and "hybrid_state" in out and "no seq_idx" in out, out
    code, out = _bamba_gate(files, "flattening", capsys, "qwen3_next")
    assert code == 1 and "hybrid_state" in out and "no seq_idx" in out, out


def test_the_gate_measures_a_hybrid_checkpoint_on_the_reference_kernel(bamba_files, capsys):
    """Bamba without causal_conv1d / mamba_ssm: the gate audits inside emulate_hybrid_kernels() and names the
    kernel. trl-padding-free gives seq_idx: PASS, exit 0; flattening gives none: FAIL with the hybrid
    cause, exit 1. Ground truth computed here (each example alone); the process's transformers is left as is."""
    if torch.cuda.is_available() and importlib.util.find_spec("causal_conv1d"):
        pytest.skip("the real kernels are installed: the gate runs them")
    from packsim.reference.hybrid_emulation import kernels_in_use

    assert _flattened_leak(bamba_files, True) <= 1e-5 and _flattened_leak(bamba_files, False) > 1e-3
    before = kernels_in_use()
    code, out = _bamba_gate(bamba_files, "trl-padding-free", capsys)
    if not trl_padding_free_emits_seq_idx():  # TRL 1.9: position_ids only, so the state crosses: FAIL, exit 1
        assert code == 1 and "pre-flight FAIL: perturbation, gradient, hybrid_state" in out and "no seq_idx" in out, out
        assert "BambaMixer ran on the reference kernel (packsim, pure torch)" in out
        return
    assert code == 0 and out.rstrip().endswith("pre-flight PASS"), out
    assert "hybrid_kernels          NOTICE   BambaMixer ran on the reference kernel (packsim, pure torch)" in out
    assert "seq_idx reaches the reference kernel (packsim, pure torch)" in out
    code, out = _bamba_gate(bamba_files, "flattening", capsys)
    assert code == 1 and "pre-flight FAIL: perturbation, gradient, hybrid_state" in out, out
    assert "no seq_idx" in out and "BambaMixer ran on the reference kernel (packsim, pure torch)" in out
    assert kernels_in_use() == before  # the gate's wiring is undone when it returns


@pytest.mark.parametrize("megabytes", [2, 50])
def test_a_record_longer_than_the_model_holds_is_refused_before_tokenizing(files, tmp_path, capsys, megabytes):
    import time

    from packsim.auditing.records import record_bound
    from packsim.core.model import build_model
    from packsim.core.tokenizer import build_tokenizer

    data = tmp_path / "huge.jsonl"
    with data.open("w") as f:
        f.write(json.dumps({"prompt": PAIRS[0][0], "completion": PAIRS[0][1]}) + "\n")
        f.write(json.dumps({"prompt": "a" * (megabytes << 20), "completion": "b"}) + "\n")
    tokenizer = build_tokenizer()  # the bound: longest vocabulary entry x the model's positions
    limit, _ = record_bound(build_model("tiny"), tokenizer, 256)
    assert limit == max(map(len, tokenizer.get_vocab())) * build_model("tiny").config.max_position_embeddings
    start = time.perf_counter()
    with pytest.raises(SystemExit) as exit_info:
        main(["audit", "--model", str(files / "ckpt"), "--data", str(data), "--collator", "packsim"])
    assert exit_info.value.code == 2 and time.perf_counter() - start < 20
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"line 2 of {data} holds more than" in err[0] and f"bytes, so a record of more " \
        f"than the {limit:,} characters" in err[0] and "split it into shorter records" in err[0], err


def test_the_data_file_is_read_a_line_at_a_time_and_a_long_line_no_further_than_the_bound(tmp_path):
    """A 20 MB line: refused after reading at most the bound's bytes (tracemalloc's peak, measured here, stays
    under 2 MB); a line of more characters than the bound but fewer bytes than its cap is parsed and named
    with its exact size; a file of many records is all read."""
    import tracemalloc

    limit = 20_480
    data = tmp_path / "long.jsonl"
    short = json.dumps({"prompt": "p", "completion": "c"}) + "\n"
    data.write_text(short + json.dumps({"prompt": "a" * (20 << 20), "completion": "b"}) + "\n")
    tracemalloc.start()
    with pytest.raises(PacksimError, match="line 2 of .* holds more than"):
        load_records(data, limit, "characters")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2 << 20, f"peak {peak:,} bytes: the long line was read whole"
    data.write_text(short + json.dumps({"prompt": "a" * (limit + 5), "completion": "b"}) + "\n")
    with pytest.raises(PacksimError, match=f"holds a record of {limit + 6:,} characters, more than the {limit:,}"):
        load_records(data, limit, "characters")
    data.write_text(short * 1000 + "\n")  # a trailing empty line is skipped
    assert len(load_records(data, limit, "characters")) == 1000


@pytest.fixture(scope="module")
def odd_checkpoints(files):
    """A Llama config of 3 layers saved with 2 layers' weights, and a BERT encoder (not a causal LM)."""
    from transformers import BertConfig, BertModel

    from packsim.core.model import build_model
    from packsim.core.tokenizer import build_tokenizer

    model = build_model("tiny", attn_implementation="sdpa", seed=0)
    assert model.config.num_hidden_layers == 2
    model.config.num_hidden_layers = 3  # the config says 3, the weights are the 2 layers'
    model.save_pretrained(files / "three_layers")
    bert = BertModel(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=64))
    bert.save_pretrained(files / "bert")
    for name in ("three_layers", "bert"):
        build_tokenizer().save_pretrained(files / name)
    return files


@pytest.mark.parametrize("name, findings", [
    ("three_layers", {"checkpoint_weights": "9 weight(s) not in the checkpoint, so randomly initialised "
                                            "(model.layers.2."}),
    ("bert", {"checkpoint_weights": "in the checkpoint but not in the model, so unused (pooler.dense.bias",
              "causal_lm": "it was saved as BertModel, not a causal LM"}),
])
def test_a_checkpoint_that_is_not_what_it_says_is_a_notice_and_fails_strict(odd_checkpoints, capsys, name, findings):
    args = ["audit", "--model", str(odd_checkpoints / name), "--data", str(odd_checkpoints / "data.jsonl"),
            "--collator", "packsim"]
    # the encoder's own isolation differs by version (5.16.1's BertLMHeadModel lets packed examples meet: exit 1)
    assert main(args) == 0 or name == "bert"
    out = capsys.readouterr().out
    for finding, evidence in findings.items():
        line = next(x for x in out.splitlines() if x.strip().startswith(finding))
        assert "NOTICE" in line and evidence in line, line
    assert main([*args, "--strict"]) == 1
    assert capsys.readouterr().out.rstrip().endswith(", ".join(findings))  # pre-flight FAIL: ..., the findings
    assert audit_cli(odd_checkpoints, "packsim") == 0  # the saved tiny checkpoint: every weight loaded, a causal LM
    out = capsys.readouterr().out
    assert "checkpoint_weights" not in out and "causal_lm" not in out


def test_a_transformers_the_hybrid_wiring_does_not_fit_is_not_measured_naming_the_version(bamba_files, capsys,
                                                                                         monkeypatch):
    """Outside the window (the kernel wrappers moved): the gate cannot wire the reference kernels, so it
    answers NOT MEASURED (exit 3) with a finding that names the installed transformers, or FAILs where
    this transformers runs the packed row on its fallback and it leaks (5.16.1); never a crash."""
    if torch.cuda.is_available() and importlib.util.find_spec("causal_conv1d"):
        pytest.skip("the real kernels are installed: nothing to wire")
    import transformers

    import packsim.core.upstream.hub_kernels as hk

    monkeypatch.setattr(hk, "CELLS", (*hk.CELLS, "a_name_transformers_never_had"))
    code, out = _bamba_gate(bamba_files, "flattening", capsys)
    assert code in (1, 3), out
    assert f"packsim's reference kernels could not be wired: transformers {transformers.__version__} moved" in out
