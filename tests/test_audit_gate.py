"""The gate's exit codes (0 pass, 1 fault, 2 bad input or setup, 3 nothing measured) and ``--trainer``.

Every bad input ends in one line on stderr and exit 2, never a traceback; each case is built here:
non-UTF-8 data, an unreadable file, a directory that is not a checkpoint, checkpoints whose
tokenizer does not fit the model (no tokenizer files, so transformers builds a vocabulary of 1 for
Qwen3 and GPT-2; more tokens than embedding rows), factories that do not load. The ground truth of
each verdict is computed in the test: the records' token lengths for truncation, the batch's
examples for "not measured", the leak through the model's own forward for ``--trainer``.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

pytest.importorskip("trl")  # a dev dependency: CI installs it

from pipelines import PAIRS, leak_through_forward, one_thread, save_tiny_checkpoint  # noqa: E402, F401

from packsim.auditing.command import EXIT_CODES  # noqa: E402
from packsim.cli import main  # noqa: E402
from packsim.core.tokenizer import build_tokenizer  # noqa: E402


def _jsonl(path, pairs):
    path.write_text("\n".join(json.dumps({"prompt": p, "completion": c}) for p, c in pairs) + "\n")
    return path


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("gate")
    save_tiny_checkpoint(root / "ckpt")
    _jsonl(root / "data.jsonl", PAIRS)
    return root


def gate(*args) -> int:
    try:
        return main(["audit", *map(str, args)])
    except SystemExit as exit_info:
        return exit_info.code


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("packsim audit: error: "), err
    assert "Traceback" not in err[0]
    return err[0]


# ----------------------------------------------------------------------------- exit 2: bad input


def test_non_utf8_data_is_exit_2_with_the_line(root, capsys):
    bad = root / "latin1.jsonl"
    bad.write_bytes(json.dumps({"prompt": "abc=", "completion": "cba"}).encode() + b"\n"
                    + '{"prompt": "caf\xe9=", "completion": "x"}'.encode("latin-1") + b"\n")
    assert gate("--model", root / "ckpt", "--data", bad, "--collator", "packsim") == 2
    line = one_error_line(capsys)
    assert "is not UTF-8 text (byte 0xe9 on line 2)" in line and "save it as UTF-8" in line


def test_half_a_character_is_exit_2_naming_the_line(root, capsys):
    """JSON's "\\ud800" decodes to a lone surrogate, which the tokenizer then raised TypeError on (exit 4)."""
    bad = _jsonl(root / "surrogate.jsonl", PAIRS)
    with bad.open("a") as f:
        f.write('{"prompt": "a\\ud800b=", "completion": "x"}\n')
    assert gate("--model", root / "ckpt", "--data", bad, "--collator", "packsim") == 2
    line = one_error_line(capsys)
    assert f"line {len(PAIRS) + 1} of" in line and "half a character in 'prompt'" in line


def test_a_byte_order_mark_before_the_first_line_is_skipped(root, capsys):
    good = _jsonl(root / "bom.jsonl", PAIRS)
    good.write_bytes(b"\xef\xbb\xbf" + good.read_bytes())  # was: line 1 is not JSON (Unexpected UTF-8 BOM)
    assert gate("--model", root / "ckpt", "--data", good, "--collator", "packsim") == \
        gate("--model", root / "ckpt", "--data", root / "data.jsonl", "--collator", "packsim") == 0


def test_unreadable_data_is_exit_2(root, capsys, monkeypatch):
    import pathlib

    data, opened = root / "data.jsonl", pathlib.Path.open

    def denied(self, *args, **kwargs):
        if self == data:
            raise PermissionError(13, "Permission denied", str(self))
        return opened(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "open", denied)  # root reads any mode: deny the data file here
    assert gate("--model", root / "ckpt", "--data", root / "data.jsonl", "--collator", "packsim") == 2
    assert "cannot read it (Permission denied)" in one_error_line(capsys)


def _family_without_tokenizer(path, family: str):
    from transformers import AutoModelForCausalLM, GPT2Config, Qwen3Config

    config = {"qwen3": lambda: Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                           num_attention_heads=2, num_key_value_heads=1, head_dim=16),
              "gpt2": lambda: GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, bos_token_id=0,
                                         eos_token_id=0)}[family]()
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


@pytest.mark.parametrize("family", ["qwen3", "gpt2"])
def test_a_checkpoint_without_tokenizer_files_is_exit_2(root, capsys, family):
    from transformers import AutoTokenizer

    ckpt = _family_without_tokenizer(root / f"{family}-no-tokenizer", family)
    assert len(AutoTokenizer.from_pretrained(ckpt)) == 1  # ground truth: transformers' empty fallback
    capsys.readouterr()
    assert gate("--model", ckpt, "--data", root / "data.jsonl", "--collator", "packsim") == 2
    line = one_error_line(capsys)
    assert "its tokenizer has a vocabulary of 1" in line and "no tokenizer files" in line


def test_a_llama_checkpoint_without_tokenizer_files_is_exit_2(root, capsys):
    from packsim.core.model import build_model

    ckpt = root / "llama-no-tokenizer"
    build_model("tiny", attn_implementation="sdpa", seed=0).save_pretrained(ckpt)
    capsys.readouterr()
    assert gate("--model", ckpt, "--data", root / "data.jsonl", "--collator", "packsim") == 2
    line = one_error_line(capsys)
    assert "the tokenizer could not be loaded" in line and "no tokenizer files" in line


def test_a_tokenizer_larger_than_the_embedding_is_exit_2(root, capsys):
    from packsim.core.model import build_model

    ckpt = root / "small-embedding"
    tokenizer = build_tokenizer()
    rows = len(tokenizer) - 11
    build_model("tiny", vocab_size=rows, attn_implementation="sdpa", seed=0).save_pretrained(ckpt)
    tokenizer.save_pretrained(ckpt)
    capsys.readouterr()
    assert gate("--model", ckpt, "--data", root / "data.jsonl", "--collator", "packsim") == 2
    assert f"{len(tokenizer)} tokens but the model's embedding has {rows} rows" in one_error_line(capsys)


def test_directories_that_are_not_checkpoints_are_exit_2(root, capsys):
    empty = root / "empty-dir"
    empty.mkdir()
    assert gate("--model", empty, "--data", root / "data.jsonl", "--collator", "packsim") == 2
    assert "has no config.json" in one_error_line(capsys)
    no_weights = root / "no-weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((root / "ckpt" / "config.json").read_text())
    build_tokenizer().save_pretrained(no_weights)
    capsys.readouterr()
    assert gate("--model", no_weights, "--data", root / "data.jsonl", "--collator", "packsim") == 2
    assert "the model could not be loaded" in one_error_line(capsys)
    garbage = root / "garbage-config"
    garbage.mkdir()
    (garbage / "config.json").write_text("{not json")
    build_tokenizer().save_pretrained(garbage)
    capsys.readouterr()
    assert gate("--model", garbage, "--data", root / "data.jsonl", "--collator", "packsim") == 2
    one_error_line(capsys)


# ----------------------------------------------------------------------------- exit 0 / 1 / 3


def test_pass_is_0_fault_is_1_even_without_strict(root, capsys):
    assert gate("--model", root / "ckpt", "--data", root / "data.jsonl", "--collator", "packsim") == 0
    assert capsys.readouterr().out.rstrip().endswith("pre-flight PASS")
    assert gate("--model", root / "ckpt", "--data", root / "data.jsonl", "--collator", "trl-wrapped",
                "--max-length", "16") == 1
    assert "pre-flight FAIL: perturbation" in capsys.readouterr().out


def test_one_example_per_batch_is_not_measured_exit_3(root, capsys):
    # batch size 1 under PackingCollator: each batch is one row holding one example (ground truth:
    # one record per batch), so no other example can leak into it
    assert gate("--model", root / "ckpt", "--data", root / "data.jsonl", "--collator", "packsim",
                "--batch-size", "1") == 3
    out = capsys.readouterr().out
    assert out.startswith("=== pre-flight") and "NOT MEASURED:" in out and "PASS" not in out.splitlines()[1]
    assert out.rstrip().endswith("pre-flight NOT MEASURED: isolation untested, not a pass")


def test_records_longer_than_max_length_are_a_truncation_finding(root, capsys):
    from packsim.auditing.preflight import _split

    long = [(p * 3, c * 3) for p, c in PAIRS]
    data = _jsonl(root / "long.jsonl", long)
    tokenizer = build_tokenizer()
    max_length = 24
    lengths = [(len(a), len(a) + len(b)) for a, b in (_split(tokenizer, {"prompt": p, "completion": c})
                                                      for p, c in long)]
    cut = sum(n > max_length for _, n in lengths)  # ground truth from the records' own tokens
    prompt_only = sum(n > max_length and k >= max_length for k, n in lengths)
    assert 0 < cut and 0 < prompt_only < cut
    assert gate("--model", root / "ckpt", "--data", data, "--collator", "trl-bfd",
                "--max-length", max_length) == 1
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.strip().startswith("truncation "))
    assert f"{cut} of {len(long)} records are longer than max_length={max_length}" in line
    assert f"{prompt_only} of them lose the whole response" in line
    assert f"raise --max-length to at least {max(n for _, n in lengths)}" in line
    assert gate("--model", root / "ckpt", "--data", data, "--collator", "trl-bfd", "--max-length", 512) == 0
    assert "truncation              PASS" in capsys.readouterr().out


def test_help_documents_the_exit_codes(capsys):
    with pytest.raises(SystemExit):
        main(["audit", "--help"])
    out = capsys.readouterr().out
    for code, text in EXIT_CODES.items():
        assert f"  {code}  {text}" in out
    assert "--trainer FILE.py:FUNC" in out


# ----------------------------------------------------------------------------- --trainer


FACTORY = '''
import datasets
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

from packsim import PackingCollator
from packsim.core.tokenizer import BOS_ID, EOS_ID, encode

PAIRS = {pairs!r}


def make_trainer(setup="correct", bf16=False, use_cache=False):
    model = AutoModelForCausalLM.from_pretrained({ckpt!r}, attn_implementation="sdpa")
    features = [{{"prompt_ids": [BOS_ID] + encode(p), "response_ids": encode(c) + [EOS_ID]}} for p, c in PAIRS]
    args = TrainingArguments(output_dir={out!r}, per_device_train_batch_size=4, max_steps=1, report_to="none",
                             save_strategy="no", use_cpu=True, remove_unused_columns=False, seed=0,
                             bf16=bf16, use_cache=use_cache)
    return Trainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(features),
                   data_collator=PackingCollator(setup=setup))


def leaking():
    return make_trainer(use_cache=True)  # a cache in the forward lets examples see each other


def in_bf16():
    return make_trainer(bf16=True)


def broken():
    raise RuntimeError("no GPU here")


def small_embedding():
    from packsim.core.model import build_model
    from packsim.core.tokenizer import build_tokenizer

    trainer = make_trainer()
    trainer.model = build_model("tiny", vocab_size=40)  # 40 embedding rows for a 51-token tokenizer
    trainer.processing_class = build_tokenizer()
    return trainer


def not_a_trainer():
    return 42


if __name__ == "__main__":
    make_trainer().train()
'''


@pytest.fixture(scope="module")
def factory(root):
    path = root / "project" / "train.py"
    path.parent.mkdir()
    path.write_text(FACTORY.format(pairs=PAIRS, ckpt=str(root / "ckpt"), out=str(root / "out")))
    return path


def test_trainer_factory_file_passes_and_leaks_fail(factory, capsys):
    import runpy

    assert gate("--trainer", f"{factory}:make_trainer") == 0
    out = capsys.readouterr().out
    assert out.startswith(f"=== audit of the trainer from {factory}:make_trainer: Trainer")
    assert "tolerance 1e-05, from the float32 logits" in out and out.rstrip().endswith("gate PASS")
    leak = leak_through_forward(runpy.run_path(str(factory))["leaking"]())  # ground truth, not packsim
    assert leak > 1e-3
    assert gate("--trainer", f"{factory}:leaking") == 1
    out = capsys.readouterr().out
    assert "gate FAIL: perturbation" in out and "cache" in out


def test_the_tolerance_follows_the_trainers_dtype(factory, capsys):
    assert gate("--trainer", f"{factory}:in_bf16") == 0
    out = capsys.readouterr().out
    assert "tolerance 3e-02, from the bfloat16 logits this forward computes under mixed precision 'bf16'" in out


def test_trainer_as_module_function(factory, capsys, monkeypatch):
    monkeypatch.chdir(factory.parent)
    assert gate("--trainer", "train:make_trainer") == 0
    assert capsys.readouterr().out.rstrip().endswith("gate PASS")


@pytest.mark.parametrize("spec, message", [
    ("FILE", "names no function"),
    ("/no/such/train.py:make_trainer", "no such file"),
    ("FILE:nope", "defines no 'nope' (its functions: broken, in_bf16, leaking, make_trainer, not_a_trainer, "
                  "small_embedding)"),
    ("FILE:small_embedding", "has 51 tokens but the model's embedding has 40 rows"),
    ("FILE:PAIRS", "PAIRS is a list, not a function"),
    ("FILE:broken", "the factory raised RuntimeError: no GPU here"),
    ("FILE:not_a_trainer", "returned int '42', not a transformers Trainer"),
    ("no_such_module_xyz:make", "importing module 'no_such_module_xyz' raised ModuleNotFoundError"),
])
def test_bad_trainer_specs_are_exit_2(factory, capsys, spec, message):
    assert gate("--trainer", spec.replace("FILE", str(factory))) == 2
    assert message in one_error_line(capsys)


def test_a_factory_file_that_fails_to_import_is_exit_2(root, capsys):
    bad = root / "bad_train.py"
    bad.write_text("import no_such_package_abc\n")
    assert gate("--trainer", f"{bad}:make") == 2
    assert "importing" in one_error_line(capsys)
    assert gate("--trainer", f"{bad}:make", "--model", root / "ckpt") == 2
    assert "cannot go with it" in one_error_line(capsys)


# ----------------------------------------------------------------------------- the loss claim


def test_a_dropped_completion_mask_is_not_measured_not_claimed(root, tmp_path):
    import datasets
    from transformers import (
        AutoModelForCausalLM,
        DataCollatorWithFlattening,
        Trainer,
        TrainingArguments,
    )

    import packsim
    from packsim.core.tokenizer import BOS_ID, EOS_ID, encode

    features = []
    for p, c in PAIRS:
        prompt, completion = [BOS_ID] + encode(p), encode(c) + [EOS_ID]
        features.append({"input_ids": prompt + completion, "labels": [-100] * len(prompt) + completion,
                         "completion_mask": [0] * len(prompt) + [1] * len(completion)})

    def trainer(remove_unused_columns):
        args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=1,
                                 report_to="none", save_strategy="no", use_cpu=True, seed=0,
                                 remove_unused_columns=remove_unused_columns)
        return Trainer(model=AutoModelForCausalLM.from_pretrained(root / "ckpt", attn_implementation="sdpa"),
                       args=args, train_dataset=datasets.Dataset.from_list(features),
                       data_collator=DataCollatorWithFlattening())

    dropped = trainer(True)
    assert "completion_mask" not in dropped._remove_unused_columns(dropped.train_dataset).column_names  # ground truth
    report = packsim.audit_trainer(dropped)
    assert report.probes["loss_coverage"].details["counts"]["unknown"][1] > 0
    assert "the loss counts only responses" not in report.verdict
    assert "which labels are prompt and which response was not measured" in report.verdict
    assert "completion_only_loss" in report.skipped
    kept = packsim.audit_trainer(trainer(False))
    assert kept.verdict.startswith("PASS") and "the loss counts only responses" in kept.verdict, kept.table()


# ----------------------------------------------------------------------------- paths and families


def flattening_gate(root, capsys, *more) -> tuple[int, str]:
    """(exit code, stdout) of the pre-flight gate on the tiny checkpoint with the flattening collator."""
    code = gate("--model", root / "ckpt", "--data", root / "data.jsonl", "--collator", "flattening", *more)
    return code, capsys.readouterr().out


def test_the_flash_gate_runs_transformers_flash_path_on_the_reference_kernel(root, capsys):
    """Without flash-attn, --attn flash_attention_2 runs transformers' own flash path on packsim's
    reference kernel and says so; the ground truth (each example alone through that forward) agrees."""
    import torch
    from transformers.utils import is_flash_attn_2_available

    if torch.cuda.is_available() and is_flash_attn_2_available():
        pytest.skip("flash_attention_2 runs here on the real kernel")
    code, out = flattening_gate(root, capsys, "--attn", "flash_attention_2")
    assert code == 0, out
    assert "attn_implementation='packsim_reference_flash'" in out
    assert "reference kernel (packsim, pure torch), not flash-attn" in out and out.rstrip().endswith("PASS")
    # ground truth without the audit: the examples flattened into one row on that path vs each alone on sdpa
    from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorWithFlattening

    from packsim.reference.flash_emulation import emulate_flash

    tok = AutoTokenizer.from_pretrained(root / "ckpt")
    flash = AutoModelForCausalLM.from_pretrained(root / "ckpt", attn_implementation=emulate_flash().name)
    sdpa = AutoModelForCausalLM.from_pretrained(root / "ckpt", attn_implementation="sdpa")
    features = [{"input_ids": tok(p + c)["input_ids"]} for p, c in PAIRS]
    batch = DataCollatorWithFlattening()(features)
    with torch.no_grad():
        packed = flash(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits[0]
        start, worst = 0, 0.0
        for f in features:
            n = len(f["input_ids"])
            alone = sdpa(input_ids=torch.tensor([f["input_ids"]]), use_cache=False).logits[0]
            worst, start = max(worst, float((packed[start:start + n] - alone).abs().max())), start + n
    assert worst < 1e-5


def test_a_flash_path_that_cannot_run_here_is_not_measured_exit_3(root, capsys):
    """flash_attention_3 has no reference here: the probes can only run under sdpa, not the path launched."""
    code, out = flattening_gate(root, capsys, "--attn", "flash_attention_3")
    assert code == 3, out
    assert "NOT MEASURED: the attention path this pipeline launches did not run here" in out
    assert "flash_attention_3 cannot run here" in out and out.rstrip().endswith("not a pass")


FLASH_FACTORY = '''
import datasets
from transformers import AutoModelForCausalLM, DataCollatorWithFlattening, Trainer, TrainingArguments

from packsim.core.tokenizer import BOS_ID, EOS_ID, encode

PAIRS = {pairs!r}


def make_trainer():
    model = AutoModelForCausalLM.from_pretrained({ckpt!r}, attn_implementation="flash_attention_2")
    features = []
    for p, c in PAIRS:
        prompt, completion = [BOS_ID] + encode(p), encode(c) + [EOS_ID]
        features.append({{"input_ids": prompt + completion, "labels": [-100] * len(prompt) + completion,
                          "completion_mask": [0] * len(prompt) + [1] * len(completion)}})
    args = TrainingArguments(output_dir={out!r}, per_device_train_batch_size=4, max_steps=1, report_to="none",
                             save_strategy="no", use_cpu=True, remove_unused_columns=False, seed=0)
    return Trainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(features),
                   data_collator=DataCollatorWithFlattening())
'''


def test_a_trainer_factory_asking_for_flash_attention_2_runs_the_reference_kernel(root, capsys):
    """Without flash-attn, a --trainer factory that loads flash_attention_2 was exit 2 (transformers refuses
    the name); it runs transformers' own flash path on the reference kernel, as --attn does, and says so.
    Ground truth apart from the gate: the factory alone is refused here, and on the reference path each
    example of its batch agrees with the example alone on sdpa."""
    import runpy
    from itertools import pairwise

    import torch
    from transformers import AutoModelForCausalLM

    from packsim.reference.flash_emulation import real_flash_attn, reference_for_flash_requests

    if real_flash_attn() is not None:
        pytest.skip("flash_attention_2 runs here on the real kernel")
    path = root / "flash_project" / "train_flash.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(FLASH_FACTORY.format(pairs=PAIRS, ckpt=str(root / "ckpt"), out=str(root / "out_flash")))
    make = runpy.run_path(str(path))["make_trainer"]
    with pytest.raises((ImportError, ValueError), match="(?i)flash ?attention ?2"):
        make()  # transformers' own refusal: what made the gate exit 2
    assert gate("--trainer", f"{path}:make_trainer") == 0
    out = capsys.readouterr().out
    assert "flash_attention_2       NOTICE   LlamaForCausalLM asked for flash_attention_2, which cannot run here" in out
    assert ("on reference kernel (packsim, pure torch), not flash-attn as attn_implementation="
            "'packsim_reference_flash'") in out
    assert "the loss counts only responses" in out and out.rstrip().endswith("gate PASS")
    with pytest.raises((ImportError, ValueError), match="(?i)flash ?attention ?2"):
        make()  # the gate left transformers as it found it
    with reference_for_flash_requests():
        trainer = make()
        batch = next(iter(trainer.get_train_dataloader()))
        sdpa = AutoModelForCausalLM.from_pretrained(root / "ckpt", attn_implementation="sdpa")
        with torch.no_grad():
            packed = trainer.model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                                   use_cache=False).logits[0]
            starts = (batch["position_ids"][0] == 0).nonzero().flatten().tolist() + [batch["input_ids"].shape[1]]
            worst = max(float((packed[a:b] - sdpa(input_ids=batch["input_ids"][:, a:b], use_cache=False).logits[0])
                              .abs().max()) for a, b in pairwise(starts))
    assert len(starts) == 4 + 1 and worst < 1e-5  # the first batch: per_device_train_batch_size=4 examples


def _transformers_refuses_sdpa(path) -> bool:
    """Measured apart from the gate: does the installed transformers refuse ``path`` under sdpa?

    ``PreTrainedModel._sdpa_can_dispatch`` (modeling_utils.py) raises ValueError when the class's
    ``_supports_sdpa`` is False. ``Gemma2PreTrainedModel`` (models/gemma2/modeling_gemma2.py) says
    False in 5.25.0 ("sdpa does not support softcapping"; 5.24.0 refused too when this test was
    written), True in 5.16.1 (and the 5.17.0 / 5.18.0 wheels), where ``sdpa_attention_forward``
    (integrations/sdpa_attention.py) takes Gemma2's ``softcap`` into ``**kwargs``, read by nothing.
    """
    from transformers import AutoModelForCausalLM

    try:
        AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa")
    except ValueError as err:
        assert "does not support an attention implementation" in str(err), err
        return True
    return False


def test_gemma2_through_the_cli_is_audited_under_what_transformers_loads_and_says_so(root, capsys):
    """From 5.24 transformers refuses sdpa for Gemma2: the default gate loads what transformers
    would (eager) and says so, and ``--attn sdpa`` is exit 2. Up to 5.18 Gemma2 loads under sdpa:
    the gate audits it there with no notice, and ``--attn sdpa`` passes."""
    from packsim.core.tokenizer import build_tokenizer
    from packsim.core.upstream.outputs import per_version
    from packsim.exhibits.trap_cases import build_family

    path = root / "gemma2"
    build_family("gemma2").save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    args = ("--model", path, "--data", root / "data.jsonl", "--collator", "flattening")
    refuses = _transformers_refuses_sdpa(path)
    assert per_version(new=True, old=False) in (None, refuses), f"Gemma2 refuses sdpa: {refuses}"
    code = gate(*args)
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"attn_implementation='{'eager' if refuses else 'sdpa'}'" in out, out
    notice = "Gemma2ForCausalLM refuses sdpa" in out and "audited it under eager" in out
    assert notice == refuses, out
    forced = gate(*args, "--attn", "sdpa")
    if refuses:
        assert forced == 2 and "pass --attn eager" in one_error_line(capsys)
    else:
        out = capsys.readouterr().out
        assert forced == 0 and "attn_implementation='sdpa'" in out, out
        assert "refuses sdpa" not in out, out


def test_a_crash_inside_the_audit_is_exit_4_never_1(factory, capsys, monkeypatch):
    """A bug in packsim must not read as "fault found" to a launch script."""
    import packsim.auditing.trainer as trainer_module

    def broken(*args, **kwargs):
        raise TypeError("planted bug")

    monkeypatch.setattr(trainer_module, "audit_trainer", broken)
    assert gate("--trainer", f"{factory}:make_trainer") == 4
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("packsim audit: internal error (TypeError")


# ----------------------------------------------------------------------------- --objective lm (issue 30)


@pytest.mark.parametrize("collator", ["flattening", "packsim", "trl-bfd"])
def test_objective_lm_gates_a_language_modelling_pipeline(root, capsys, collator):
    """--objective lm: the gate trains each record's prompt + completion as one text, every token a target;
    the report says the loss counts every real token, exit 0."""
    from packsim.auditing.preflight import preflight

    report = preflight(root / "ckpt", root / "data.jsonl", collator, objective="lm")
    loss = report.probes["loss_coverage"]
    counts = loss.details["counts"]
    # ground truth: no token inside an example is a prompt, every response / EOS token is counted
    assert counts["prompt"] == (0, 0) and counts["response"][0] == counts["response"][1] > 0, report.table()
    assert counts["EOS"][0] == counts["EOS"][1] and loss.details["objective"] == "lm"
    assert report.ok and "every real token" in report.verdict, report.table()
    assert gate("--model", root / "ckpt", "--data", root / "data.jsonl", "--collator", collator,
                "--objective", "lm") == 0
    assert capsys.readouterr().out.rstrip().endswith("pre-flight PASS")


def test_objective_is_documented_and_needs_a_pipeline(root, capsys):
    with pytest.raises(SystemExit):
        main(["audit", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--objective {sft,lm}" in out and "every real token to be a target" in out
    assert gate("--objective", "lm") == 2
    assert "--objective need(s) --model DIR" in one_error_line(capsys)


# ----------------------------------------------------------------------------- a factory that exits, hangs, is interrupted

EXITING = '''
import sys
import time


def exit_0():
    sys.exit(0)


def exit_7():
    sys.exit(7)


def interrupted():
    raise KeyboardInterrupt  # what Ctrl-C raises in the factory


def hangs():
    time.sleep(120)
'''


@pytest.mark.parametrize("func, code", [("exit_0", "0"), ("exit_7", "7")])
def test_a_factory_calling_sys_exit_is_exit_2_never_its_own_code(root, capsys, func, code):
    path = root / "exiting.py"
    path.write_text(EXITING)
    assert gate("--trainer", f"{path}:{func}") == 2
    assert f"the trainer factory {path}:{func} called sys.exit({code}) instead of returning a Trainer" in \
        one_error_line(capsys)
    at_import = root / "argparse_at_import.py"
    at_import.write_text("import sys\nsys.exit(3)\n")
    assert gate("--trainer", f"{at_import}:make") == 2
    assert "called sys.exit(3): keep argument parsing" in one_error_line(capsys)


def test_ctrl_c_is_one_line_and_exit_130(root, capsys):
    path = root / "exiting.py"
    path.write_text(EXITING)
    assert gate("--trainer", f"{path}:interrupted") == 130 and 130 in EXIT_CODES
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("packsim audit: interrupted (Ctrl-C) while the trainer factory"), err


def test_timeout_bounds_a_hanging_factory(root, capsys):
    import time

    path = root / "exiting.py"
    path.write_text(EXITING)
    start = time.perf_counter()
    assert gate("--trainer", f"{path}:hangs", "--timeout", "1") == 3
    assert time.perf_counter() - start < 10
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--timeout 1 s ran out while the trainer factory {path}:hangs was running" in err[0], err
    assert gate("--trainer", f"{path}:hangs", "--timeout", "0") == 2
    assert "--timeout 0.0: give a positive number of seconds" in one_error_line(capsys)
    assert gate("--timeout", "5") == 2
    assert "--timeout need(s) --model DIR" in one_error_line(capsys)


def test_without_signals_the_watchdog_ends_the_gate(root):
    """Off the main thread (as on Windows) there is no SIGALRM: the watchdog answers with the same line."""
    import subprocess
    import sys

    path = root / "exiting.py"
    path.write_text(EXITING)
    code = ("import threading; from packsim.cli import main; "
            f"t = threading.Thread(target=main, args=(['audit', '--trainer', {str(path) + ':hangs'!r}, "
            "'--timeout', '1'],)); t.start(); t.join()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("packsim audit: not measured: --timeout 1 s ran out")


_TEXT = st.text(st.characters(codec="utf-8"), max_size=12) | st.sampled_from(["", " ", "=", "\n", "\x00", "a" * 40])
_VALUE = _TEXT | st.integers() | st.none() | st.lists(st.integers(), max_size=2) | st.just({"k": 1})
_RECORD = st.fixed_dictionaries({"prompt": _TEXT, "completion": _TEXT}).map(json.dumps)  # any text
_ODD = (st.fixed_dictionaries({"prompt": _VALUE, "completion": _VALUE}).map(json.dumps)
        | st.sampled_from(["", "   ", "{", "[1, 2]", '"text"', "null", '{"prompt": "a\\ud800", "completion": "b"}']))


@settings(max_examples=100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(records=st.lists(_RECORD, max_size=5), odd=st.none() | _ODD, at=st.integers(0, 5),
       keep=st.integers(0, len(PAIRS)))
def test_any_data_file_gets_an_exit_code_and_at_most_one_error_line(root, records, odd, at, keep):
    """``keep`` good records, then records of any text (empty, NUL, any Unicode), and at most one odd
    line among them (wrong types, broken JSON, a lone surrogate): exit 0, 1, 2 or 3, never 4 (a
    packsim bug) or a traceback; exit 2 is one line on stderr."""
    lines = records[:at] + ([odd] if odd is not None else []) + records[at:]
    data = root / "fuzz.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "completion": c}) + "\n" for p, c in PAIRS[:keep])
                    + "\n".join(lines) + "\n", encoding="utf-8")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = gate("--model", root / "ckpt", "--data", data, "--collator", "packsim")
    event(f"exit {code}")  # pytest --hypothesis-show-statistics counts them
    assert code in (0, 1, 2, 3), err.getvalue()[-2000:]
    assert "Traceback" not in err.getvalue()
    if code == 2:
        assert len(err.getvalue().strip().splitlines()) == 1 and "error: " in err.getvalue(), err.getvalue()
