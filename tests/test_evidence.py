"""Boundaries from independent evidence and labels checked by value (issue 21 items 1 and 2).

Pipelines are built here: a transformers ``Trainer`` with a padding-free collator written in this
file, on two model families with different special-token conventions, tiny from configs with
random weights: ``qwen3`` (eos == pad, no BOS, like Qwen3) and ``mistral`` (BOS + a separate pad,
like Llama / Mistral). Each faulty collator is one documented fault; the audit must catch it with
the right finding, and the fixed collator must pass. Every verdict is checked against a ground
truth computed here without packsim: the leak by perturbing one example's tokens and reading
another example's loss through the trainer's own ``compute_loss``; the fields against the example
lengths the test knows; the labels by role and value.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")

import datasets  # noqa: E402
import transformers  # noqa: E402
from pipelines import PAIRS, one_thread  # noqa: E402, F401
from transformers import Trainer, TrainingArguments  # noqa: E402

import packsim  # noqa: E402
from packsim.auditing.evidence import boundary_fields  # noqa: E402
from packsim.auditing.locate import feature_examples, locate  # noqa: E402
from packsim.core.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, encode  # noqa: E402

transformers.logging.set_verbosity_error()
datasets.disable_progress_bars()

IGNORE = -100
_TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, vocab_size=VOCAB_SIZE)
# family -> (config class, special ids, whether examples start with BOS)
FAMILIES = {
    "qwen3": ("Qwen3Config", dict(head_dim=8, bos_token_id=None, eos_token_id=EOS_ID, pad_token_id=EOS_ID), False),
    "mistral": ("MistralConfig", dict(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID), True),
}


def build_model(family: str):
    cls, ids, _ = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, cls)(**_TINY, **ids)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def features(family: str) -> list[dict]:
    bos = [BOS_ID] if FAMILIES[family][2] else []
    return [{"prompt_ids": bos + encode(p), "response_ids": encode(c) + [EOS_ID]} for p, c in PAIRS]


class Flatten:
    """A padding-free collator (one row, position_ids restarting, cu_seq_lens_*, seq_idx), with one fault.

    ``fault``: None (right), "late" / "early" (position_ids restart one token after / before the
    example's first token), "cu_q" (cu_seq_lens_q offsets one token late), "cu_k" (only
    cu_seq_lens_k off: the fields disagree with each other), "seq_idx" (seq_idx changes one token
    late), "shift" (labels shifted by one: labels[t] = input_ids[t+1]), "across" (each example's
    last label is the next example's first token).
    """

    def __init__(self, fault=None, fields=("position_ids",)):
        self.fault, self.fields = fault, fields

    def __call__(self, feats):
        ids, labels, pos, idx, lengths = [], [], [], [], []
        for k, f in enumerate(feats):
            x = list(f["prompt_ids"]) + list(f["response_ids"])
            lab = [IGNORE] * len(f["prompt_ids"]) + list(f["response_ids"])
            if self.fault == "shift":
                lab = lab[1:] + [IGNORE]
            ids += x
            labels += lab
            pos += list(range(len(x)))
            idx += [k] * len(x)
            lengths.append(len(x))
        self.last = [(len(f["prompt_ids"]), len(f["prompt_ids"]) + len(f["response_ids"])) for f in feats]
        starts = [sum(lengths[:k]) for k in range(len(lengths))]
        if self.fault == "across":
            for s in starts[1:]:
                labels[s - 1] = ids[s]
        if self.fault in ("late", "early"):
            for s in starts[1:]:
                if self.fault == "late":  # the first token continues the previous example
                    pos[s] = pos[s - 1] + 1
                    pos[s + 1:s + lengths[starts.index(s)]] = range(lengths[starts.index(s)] - 1)
                else:  # the previous example's last token already restarts
                    pos[s - 1] = 0
                    pos[s:s + lengths[starts.index(s)]] = range(1, lengths[starts.index(s)] + 1)
        cu = [0] + [sum(lengths[:k + 1]) for k in range(len(lengths))]
        cu_q = [c + (1 if self.fault == "cu_q" and 0 < i < len(cu) - 1 else 0) for i, c in enumerate(cu)]
        cu_k = [c + (1 if self.fault == "cu_k" and 0 < i < len(cu) - 1 else 0) for i, c in enumerate(cu)]
        if self.fault == "seq_idx":
            for s in starts[1:]:
                idx[s] = idx[s - 1]
        out = {"input_ids": torch.tensor([ids]), "labels": torch.tensor([labels])}
        if "position_ids" in self.fields:
            out["position_ids"] = torch.tensor([pos])
        if "cu_seq_lens" in self.fields:
            out.update(cu_seq_lens_q=torch.tensor(cu_q, dtype=torch.int32),
                       cu_seq_lens_k=torch.tensor(cu_k, dtype=torch.int32),
                       max_length_q=max(lengths), max_length_k=max(lengths))
        if "seq_idx" in self.fields:
            out["seq_idx"] = torch.tensor([idx], dtype=torch.int32)
        return out


def trainer_for(family: str, collator, tmp_path) -> Trainer:
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=len(PAIRS),
                             max_steps=1, report_to="none", save_strategy="no", use_cpu=True,
                             remove_unused_columns=False, seed=0)
    return Trainer(model=build_model(family), args=args, data_collator=collator,
                   train_dataset=datasets.Dataset.from_list(features(family)))


# ----------------------------------------------------------------------------- ground truth


def draw(trainer) -> tuple[dict, list[tuple[int, int]]]:
    """One training batch and the (prompt length, length) of its examples, as the collator got them."""
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    return batch, trainer.data_collator.last


def true_leak(trainer, batch: dict, shapes) -> float:
    """Largest change of example j's loss through trainer.compute_loss when example i's tokens change.

    Example j's loss: labels = j's own tokens (aligned, first token left out), everything else
    -100, so the collator's labels (possibly wrong) play no part. Boundaries from the test's lengths.
    """
    ids = batch["input_ids"]
    lengths = [n for _, n in shapes]
    seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[None]  # (1, N)
    model = trainer.model.eval()

    def loss_of(j, x):
        labels = torch.where(seq == j, x, torch.full_like(x, IGNORE))
        labels[0, int((seq[0] == j).nonzero()[0])] = IGNORE  # j's first token is not predicted from j
        with torch.no_grad():
            return float(trainer.compute_loss(model, {**batch, "input_ids": x, "labels": labels}))

    base = [loss_of(j, ids) for j in range(len(lengths))]
    worst = 0.0
    for i in range(len(lengths)):
        x = torch.where(seq == i, (ids + 7) % VOCAB_SIZE, ids)
        for j in range(len(lengths)):
            if j != i:
                worst = max(worst, abs(loss_of(j, x) - base[j]))
    return worst


def true_field_faults(batch: dict, shapes) -> set[str]:
    """The boundary fields that differ from the example lengths."""
    lengths = [n for _, n in shapes]
    pos = torch.cat([torch.arange(n) for n in lengths])
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist())
    idx = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    truth = {"position_ids": pos, "cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "seq_idx": idx}
    return {k for k, v in truth.items() if k in batch and not torch.equal(batch[k].reshape(-1).long(), v)}


def true_label_faults(batch: dict, shapes) -> set[str]:
    """'shifted' / 'across' / 'prompt' from the labels by value and role, with the test's own boundaries."""
    ids, labels = batch["input_ids"][0].tolist(), batch["labels"][0].tolist()
    faults, t = set(), 0
    for n_p, n in shapes:
        for k in range(t, t + n):
            if labels[k] == IGNORE or labels[k] == ids[k]:
                if labels[k] == ids[k] and k - t < n_p:
                    faults.add("prompt")
                continue
            if k + 1 < len(ids) and labels[k] == ids[k + 1]:
                faults.add("across" if k == t + n - 1 else "shifted")
            else:
                faults.add("wrong")
        t += n
    return faults


# ----------------------------------------------------------------------------- the cases

ALL = ("position_ids", "cu_seq_lens", "seq_idx")
# case -> (collator, the findings/probes the audit must fail, a phrase the failing evidence must hold)
CASES = {
    "fixed": (Flatten(), set(), None),
    "fixed_all_fields": (Flatten(fields=ALL), set(), None),
    "late": (Flatten("late"), {"perturbation", "gradient", "boundary_fields"},
             "position_ids restart at token {s1}, the example starts at token {s}"),
    "early": (Flatten("early"), {"perturbation", "gradient", "boundary_fields"},
              "position_ids restart at token {s_1}, the example starts at token {s}"),
    # an offset moved off the position restarts: flash_fields (the fields against each other) fails too
    "cu_q": (Flatten("cu_q", fields=ALL), {"boundary_fields", "flash_fields"},
             "cu_seq_lens_q has an offset at token {s1}, the example starts at token {s}"),
    "cu_k": (Flatten("cu_k", fields=ALL), {"boundary_fields", "flash_fields"}, "cu_seq_lens_k has an offset"),
    "seq_idx": (Flatten("seq_idx", fields=ALL), {"boundary_fields"},
                "seq_idx changes at token {s1}, the example starts at token {s}"),
    "shift": (Flatten("shift"), {"loss_coverage"}, "labels[t] = input_ids[t+1]"),
    "across": (Flatten("across"), {"loss_coverage"}, "next example's first token"),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_faulty_collator_is_caught_and_the_fix_passes(family, case, tmp_path):
    collator, expected, phrase = CASES[case]
    trainer = trainer_for(family, collator, tmp_path)
    report = packsim.audit_trainer(trainer)
    s = collator.last[0][1]  # where the second example of the audited batch starts
    # ground truth, computed here (on a fresh draw: the sampler shuffles, the collator records the order)
    batch, shapes = draw(trainer)
    leak = true_leak(trainer, batch, shapes) > 1e-6
    fields = true_field_faults(batch, shapes)
    labels = true_label_faults(batch, shapes)
    failed = set(report.failed) - {"completion_only_loss"}
    assert ("perturbation" in failed) == leak, report.table()
    assert ("boundary_fields" in failed) == bool(fields), (fields, report.table())
    assert ("loss_coverage" in failed) == bool(labels), (labels, report.table())
    assert failed == expected, report.table()
    assert report.boundaries.startswith("the trainer's dataset examples"), report.boundaries
    assert len(report.example_ids) == len(PAIRS)
    if phrase:
        text = report.table()
        assert phrase.format(s=s, s1=s + 1, s_1=s - 1) in text, text
    if case == "shift":  # its own cause, not "mask the prompt"
        assert report.probes["loss_coverage"].details["problems"] == ["shifted"], report.table()
        assert any("shifted by one in the collator" in c for c in report.causes)
        assert not any("prompt tokens to -100" in c for c in report.causes), report.causes
    if case == "across":
        assert report.probes["loss_coverage"].details["problems"] == ["across"], report.table()
    if case.startswith("fixed"):
        assert report.ok, report.table()
        eos = next(f for f in report.findings if f.name == "special_tokens")
        assert f"{len(PAIRS)} of {len(PAIRS)} examples end with EOS" in eos.evidence


def test_audit_without_dataset_evidence_says_what_the_verdict_rests_on(tmp_path):
    """packsim.audit on the batch alone: the tokens corroborate the fields; without special ids, skipped."""
    trainer = trainer_for("mistral", Flatten(fields=ALL), tmp_path)
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    tokens = packsim.audit(trainer.model, batch, use_cache=False)
    finding = next(f for f in tokens.findings if f.name == "boundary_fields")
    assert finding.status == "pass" and "confirmed by the special tokens" in tokens.boundaries, tokens.table()
    trainer.model.config.bos_token_id = trainer.model.config.eos_token_id = None  # nothing in the tokens
    report = packsim.audit(trainer.model, batch, use_cache=False)
    finding = next(f for f in report.findings if f.name == "boundary_fields")
    assert finding.status == "skipped" and "rests on the batch's own metadata" in finding.evidence
    assert "rests on the batch's own metadata" in report.boundaries
    given = packsim.audit(trainer.model, batch, examples=feature_examples(features("mistral")), use_cache=False)
    assert next(f for f in given.findings if f.name == "boundary_fields").status == "pass", given.table()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_special_tokens_catch_a_late_restart_without_the_dataset(family, tmp_path):
    """No examples given: the BOS (mistral) or the EOS (qwen3) shows the fields merge examples."""
    trainer = trainer_for(family, Flatten("late"), tmp_path)
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    report = packsim.audit(trainer.model, batch, use_cache=False)
    tokens = next(f for f in report.findings if f.name == "special_tokens")
    assert tokens.status == "fail", report.table()
    assert ("BOS token(s) do not start" if family == "mistral" else "EOS token(s) sit inside") in tokens.evidence
    assert {"perturbation", "boundary_fields"} <= set(report.failed), report.table()
    assert report.boundaries.startswith("the special tokens")


def test_fields_that_disagree_with_each_other_fail_without_evidence():
    ids = torch.arange(4, 16)[None]  # (1, 12): no BOS/EOS for a model without special ids
    batch = {"input_ids": ids, "position_ids": torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 0, 1, 2]]),
             "cu_seq_lens_q": torch.tensor([0, 4, 10, 12], dtype=torch.int32)}
    finding = boundary_fields(batch, None, "no examples given")
    assert finding.status == "fail"
    assert "cu_seq_lens_q has an offset at token 10, the example starts at token 9" in finding.evidence


def test_locate_finds_examples_in_padded_and_flat_batches():
    examples = [[1, 5, 6, 2], [1, 7, 2], [1, 8, 9, 9, 2]]
    flat = torch.tensor([sum(examples, [])])
    seq, missing = locate(flat, examples)
    assert missing == [] and seq.tolist() == [[0] * 4 + [1] * 3 + [2] * 5]
    padded = torch.tensor([[1, 7, 2, 0, 0], [1, 5, 6, 2, 0], [1, 8, 9, 9, 2]])  # rows out of order
    seq, missing = locate(padded, examples)
    assert missing == [] and seq.tolist() == [[1, 1, 1, -1, -1], [0, 0, 0, 0, -1], [2] * 5]
    assert locate(flat, [[1, 5, 6, 3]])[1] == [0]  # a changed example is not found
