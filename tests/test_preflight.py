"""``packsim audit --model DIR --data FILE --collator NAME``: the pre-flight gate (exit codes and
``--trainer``: tests/test_audit_gate.py)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl")  # a dev dependency: CI installs it

from pipelines import PAIRS, one_thread, save_tiny_checkpoint  # noqa: E402, F401

from packsim.auditing.preflight import COLLATORS, available_attn, load_records  # noqa: E402
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
