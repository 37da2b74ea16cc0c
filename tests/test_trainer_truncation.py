"""Examples cut by truncation, counted from the trainer's own dataset and batches (issue 21 item 3).

``audit_trainer`` (so ``packsim audit --trainer`` and ``packsim.AuditCallback``) reports a
``truncated_examples`` finding with the counts: TRL's SFTTrainer cuts while it prepares its dataset
(an example exactly ``max_length`` long that does not end with EOS), a collator cuts while it
collates (an example the collator was given found in the batch only as a prefix). Pipelines are
built here: TRL SFTTrainers on the local tokenizer's tiny Llama (packing off and BFD), and a
transformers Trainer whose collator cuts each example at ``max_len`` (flat or padded rows) on
tests/test_evidence.py's two families (qwen3: eos == pad, no BOS; mistral: BOS + pad). Ground truth
is computed here from the records and features: a record is cut when its tokens (one EOS kept at
the end) do not fit, prompt-only when its prompt alone fills the length.
"""

from __future__ import annotations

import warnings

import pytest
import torch

pytest.importorskip("trl")

import datasets  # noqa: E402
import transformers  # noqa: E402
from pipelines import PAIRS, one_thread, save_tiny_checkpoint  # noqa: E402, F401
from test_evidence import FAMILIES, build_model, features  # noqa: E402
from test_upstream_trl_trainers import trl_prompt_length  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

import packsim  # noqa: E402
from packsim.auditing import AuditFailed  # noqa: E402
from packsim.cli import main  # noqa: E402
from packsim.core.tokenizer import EOS_ID, PAD_ID  # noqa: E402

transformers.logging.set_verbosity_error()
datasets.disable_progress_bars()
IGNORE = -100


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("trunc-llama"))


def finding(report, name="truncated_examples"):
    return next(f for f in report.findings if f.name == name)


# ----------------------------------------------------------------------------- TRL SFTTrainer


def sft(path, tmp_path, max_length, packing, callbacks=()):
    data = datasets.Dataset.from_dict({"prompt": [p for p, _ in PAIRS], "completion": [c for _, c in PAIRS]})
    args = SFTConfig(output_dir=str(tmp_path / "out"), max_length=max_length, per_device_train_batch_size=4,
                     max_steps=1, report_to="none", save_strategy="no", bf16=False, use_cpu=True, seed=0,
                     packing=packing, learning_rate=1e-2)
    return SFTTrainer(model=AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa"), args=args,
                      train_dataset=data, processing_class=AutoTokenizer.from_pretrained(path),
                      callbacks=list(callbacks))


def record_truth(path, max_length: int) -> tuple[list[int], list[int]]:
    """(records cut, records prompt-only) from the tokenizer and the records, without TRL or packsim.

    Tokens of a record: the tokenizer's ids of prompt + completion + EOS text; the prompt's: those
    TRL marks as the prompt, per version (:func:`test_upstream_trl_trainers.trl_prompt_length`: TRL 1.9 one
    more than 1.16 on this tokenizer). Cut: its content (trailing EOS collapsed to one) does not fit
    max_length; prompt-only: the prompt alone fills it.
    """
    tok = AutoTokenizer.from_pretrained(path)
    cut, prompt_only = [], []
    for k, (p, c) in enumerate(PAIRS):
        full, shared = tok(p + c + tok.eos_token)["input_ids"], trl_prompt_length(tok, p, c + tok.eos_token)
        content = len(full)
        while content > 1 and full[content - 1] == tok.eos_token_id and full[content - 2] == tok.eos_token_id:
            content -= 1
        if content > max_length:
            cut.append(k)
            if shared >= max_length:
                prompt_only.append(k)
    return cut, prompt_only


@pytest.mark.parametrize("packing", [False, True], ids=["no_packing", "bfd"])
def test_sft_max_length_cutting_responses_is_counted(checkpoint, tmp_path, packing):
    L = 10
    cut, prompt_only = record_truth(checkpoint, L)
    assert len(cut) >= 2 and prompt_only  # the case under test: responses cut, some cut away
    report = packsim.audit_trainer(sft(checkpoint, tmp_path, L, packing))
    found = finding(report)
    assert found.status == "fail" and "truncated_examples" in report.failed, report.table()
    if packing:  # BFD keeps the prompt-only rows
        expect = f"{len(cut)} of {len(PAIRS)} examples are cut at max_length={L}"
        assert expect in found.evidence and f"{len(prompt_only)} of them keep no counted label" in found.evidence
    else:  # TRL drops the rows its truncation left without a label, and says nothing
        kept = len(PAIRS) - len(prompt_only)
        assert f"{len(cut) - len(prompt_only)} of {kept} examples are cut at max_length={L}" in found.evidence
        assert "TRL drops the examples its truncation left without a label" in found.evidence
    assert "raise max_length" in found.fix


def test_sft_max_length_that_fits_passes(checkpoint, tmp_path):
    cut, _ = record_truth(checkpoint, 48)
    assert cut == []
    report = packsim.audit_trainer(sft(checkpoint, tmp_path, 48, True))
    assert finding(report).status == "pass" and report.ok, report.table()
    assert f"none of its {len(PAIRS)} examples is cut at max_length=48" in finding(report).evidence


# ----------------------------------------------------------------------------- a collator that cuts


class CutCollator:
    """Cuts each example to ``max_len`` tokens, then flattens (position_ids restart) or pads rows."""

    def __init__(self, max_len: int, layout: str, pad_id: int):
        self.max_len, self.layout, self.pad_id = max_len, layout, pad_id

    def __call__(self, feats):
        rows = []
        for f in feats:
            ids = (list(f["prompt_ids"]) + list(f["response_ids"]))[:self.max_len]
            lab = ([IGNORE] * len(f["prompt_ids"]) + list(f["response_ids"]))[:self.max_len]
            rows.append((ids, lab))
        if self.layout == "flat":
            ids = sum((r for r, _ in rows), [])
            labels = sum(([IGNORE] + lab[1:] for _, lab in rows), [])
            pos = sum((list(range(len(r))) for r, _ in rows), [])
            return {"input_ids": torch.tensor([ids]), "labels": torch.tensor([labels]),
                    "position_ids": torch.tensor([pos])}
        T = max(len(r) for r, _ in rows)
        pad = [T - len(r) for r, _ in rows]
        return {"input_ids": torch.tensor([r + [self.pad_id] * n for (r, _), n in zip(rows, pad, strict=True)]),
                "labels": torch.tensor([lab + [IGNORE] * n for (_, lab), n in zip(rows, pad, strict=True)]),
                "attention_mask": torch.tensor([[1] * len(r) + [0] * n for (r, _), n in zip(rows, pad, strict=True)])}


def feature_truth(family: str, max_len: int) -> tuple[int, int]:
    """(examples cut, examples prompt-only) of the features at max_len, from their lengths."""
    feats = features(family)
    n = [len(f["prompt_ids"]) + len(f["response_ids"]) for f in feats]
    return sum(x > max_len for x in n), sum(len(f["prompt_ids"]) >= max_len for f in feats)


def cutting_trainer(family, tmp_path, max_len, layout, callbacks=()):
    pad = EOS_ID if family == "qwen3" else PAD_ID
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=len(PAIRS), max_steps=1,
                             report_to="none", save_strategy="no", use_cpu=True, remove_unused_columns=False,
                             seed=0, learning_rate=1e-2)
    return Trainer(model=build_model(family), args=args, data_collator=CutCollator(max_len, layout, pad),
                   train_dataset=datasets.Dataset.from_list(features(family)), callbacks=list(callbacks))


@pytest.mark.parametrize("layout", ["flat", "padded"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_collator_that_cuts_responses_is_counted(family, layout, tmp_path):
    max_len = 9
    n_cut, n_prompt_only = feature_truth(family, max_len)
    assert n_cut >= 2 and n_prompt_only >= 1
    report = packsim.audit_trainer(cutting_trainer(family, tmp_path, max_len, layout))
    found = finding(report)
    assert found.status == "fail", report.table()
    assert (f"the collator: {n_cut} of the {len(PAIRS)} examples it was given are cut short in the batch"
            in found.evidence), found.evidence
    assert f"{n_prompt_only} of them keep no counted label (prompt-only)" in found.evidence
    assert report.boundaries.startswith("the trainer's dataset examples")  # cut ones located by their prefix
    assert f"{n_cut} of them cut short by the collator" in report.boundaries
    assert finding(report, "boundary_fields").status == "pass", report.table()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_collator_whose_length_fits_passes(family, tmp_path):
    longest = max(len(f["prompt_ids"]) + len(f["response_ids"]) for f in features(family))
    assert feature_truth(family, longest) == (0, 0)
    report = packsim.audit_trainer(cutting_trainer(family, tmp_path, longest, "flat"))
    assert finding(report).status == "pass" and report.ok, report.table()
    assert f"each of the {len(PAIRS)} examples it was given is whole in the batch" in finding(report).evidence


# ----------------------------------------------------------------------------- the gate and the callback


FACTORY = '''
import datasets
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

PAIRS = {pairs!r}


def make_trainer(max_length=48):
    data = datasets.Dataset.from_dict({{"prompt": [p for p, _ in PAIRS], "completion": [c for _, c in PAIRS]}})
    args = SFTConfig(output_dir={out!r}, max_length=max_length, per_device_train_batch_size=4, max_steps=1,
                     report_to="none", save_strategy="no", bf16=False, use_cpu=True, seed=0, packing=True)
    return SFTTrainer(model=AutoModelForCausalLM.from_pretrained({ckpt!r}, attn_implementation="sdpa"),
                      args=args, train_dataset=data, processing_class=AutoTokenizer.from_pretrained({ckpt!r}))


def short():
    return make_trainer(max_length=10)
'''


def test_the_gate_counts_cut_examples_of_the_users_trainer(checkpoint, tmp_path, capsys):
    path = tmp_path / "train.py"
    path.write_text(FACTORY.format(pairs=PAIRS, ckpt=str(checkpoint), out=str(tmp_path / "out")))
    cut, prompt_only = record_truth(checkpoint, 10)

    def gate(spec):
        try:
            return main(["audit", "--trainer", f"{path}:{spec}"])
        except SystemExit as exit_info:
            return exit_info.code

    assert gate("make_trainer") == 0
    assert "truncated_examples" in capsys.readouterr().out
    assert gate("short") == 1
    out = capsys.readouterr().out
    assert "gate FAIL" in out and "truncated_examples" in out.splitlines()[-1]
    line = next(x for x in out.splitlines() if x.strip().startswith("truncated_examples"))
    assert f"{len(cut)} of {len(PAIRS)} examples are cut at max_length=10" in line
    assert f"{len(prompt_only)} of them keep no counted label" in line


def test_the_callback_stops_a_run_whose_responses_are_cut(tmp_path):
    n_cut, _ = feature_truth("qwen3", 9)
    assert n_cut
    trainer = cutting_trainer("qwen3", tmp_path, 9, "flat", callbacks=[packsim.AuditCallback()])
    before = [w.detach().clone() for w in trainer.model.parameters()]
    with pytest.raises(AuditFailed) as info:
        trainer.train()
    assert "truncated_examples" in info.value.report.failed
    assert f"{n_cut} of the {len(PAIRS)} examples it was given are cut short" in finding(info.value.report).evidence
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))  # no step
    assert max(len(x) for x in str(info.value).splitlines()) <= 100  # the report as printed fits the screen
    warned = cutting_trainer("qwen3", tmp_path, 9, "flat", callbacks=[packsim.AuditCallback(warn_only=True)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warned.train()
    assert any("truncated_examples" in str(w.message) for w in caught)
    assert warned.state.global_step == 1
