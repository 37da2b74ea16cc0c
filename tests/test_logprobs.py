"""packsim.audit_logprobs: per-sequence summed completion log-probs, packed vs alone, on DPO-style
pairs and RL-style groups; the ground truth here is an independent perturbation of the packed call."""

from __future__ import annotations

import logging
import random

import pytest
import torch
from installed import wrapper_refuses
from transformers import DataCollatorWithFlattening

from packsim.auditing.logprobs import audit_logprobs, group_names, pair_names
from packsim.exhibits.hybrid_traps import build_frontier
from packsim.exhibits.trap_cases import build_family

V = 96


def _features(n_pairs: int = 2, seed: int = 0) -> list[dict]:
    """TRL's order: every prompt+chosen, then every prompt+rejected; labels -100 on the prompt."""
    rng = random.Random(seed)
    prompts = [[1] + [rng.randrange(3, V) for _ in range(rng.randrange(3, 6))] for _ in range(n_pairs)]
    answers = [[[rng.randrange(3, V) for _ in range(rng.randrange(3, 7))] + [2] for _ in range(2)] for _ in prompts]
    rows = [(p, a[0]) for p, a in zip(prompts, answers, strict=True)] + [(p, a[1]) for p, a in zip(prompts, answers, strict=True)]
    return [{"input_ids": p + c, "labels": [-100] * len(p) + c} for p, c in rows]


def _packed(features, **collator):
    return dict(DataCollatorWithFlattening(**collator)(features))


def _perturbed_sum_change(model, batch) -> float:
    """Independent: change sequence 0's tokens, the largest change of any later sequence's summed log-prob."""
    pos = batch["position_ids"][0]
    seq = torch.cumsum((pos == 0).long(), 0) - 1  # (T,)
    ids = batch["input_ids"]
    new = ids.clone()
    new[0, seq == 0] = 3 + (ids[0, seq == 0] + 11) % (V - 3)
    counted = (batch["labels"][0] != -100)[1:]
    rest = {k: v for k, v in batch.items() if k not in ("input_ids", "labels")}

    def sums(x):
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=x, **rest).logits[0, :-1].double(), -1)
        tok = logp.gather(-1, x[0, 1:, None])[:, 0] * counted
        return torch.stack([tok[seq[1:] == e].sum() for e in range(1, int(seq.max()) + 1)])

    return float((sums(ids) - sums(new)).abs().max())


@pytest.fixture(scope="module")
def llama():
    return build_family("llama", "sdpa")


def test_a_packed_dpo_batch_isolates_on_sdpa(llama):
    batch = _packed(_features())
    report = audit_logprobs(llama, batch, names=pair_names(2), use_cache=False)
    assert _perturbed_sum_change(llama, {**batch, "use_cache": False}) < 1e-9
    assert report.ok and report.status == "isolated" and len(report.sequences) == 4
    assert report.worst.change <= report.worst.tol and "pair" in report.text()


def test_an_all_ones_mask_leaks_and_names_the_worst_sequence(llama):
    batch = _packed(_features())
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    assert _perturbed_sum_change(llama, {**batch, "use_cache": False}) > 1e-3
    report = audit_logprobs(llama, batch, names=pair_names(2), use_cache=False)
    assert report.status == "leaks" and report.worst.name != "pair 0 chosen"  # the first has nothing before it
    assert report.sequences[0].ok and report.worst.change > 1e-3
    assert "LEAKS" in report.text() and report.worst.name in report.text()


def test_rl_groups_isolate_and_names_must_match(llama):
    rng = random.Random(3)
    feats = [{"input_ids": [1, 5, 6, 7] + [rng.randrange(3, V) for _ in range(rng.randrange(2, 6))],
              "labels": [-100] * 4 + [rng.randrange(3, V) for _ in range(0)]} for _ in range(6)]
    for f in feats:
        f["labels"] = [-100] * 4 + f["input_ids"][4:]
    report = audit_logprobs(llama, _packed(feats), names=group_names(2, 3), use_cache=False)
    assert report.ok and report.sequences[-1].name == "group 1 completion 2"
    from packsim.core.errors import PacksimError

    with pytest.raises(PacksimError, match="names for"):
        audit_logprobs(llama, _packed(feats), names=["a"], use_cache=False)


def test_a_hybrid_without_seq_idx_leaks_and_with_it_is_not_measured_on_cpu():
    bamba = build_frontier("bamba")
    feats = _features()
    batch = _packed(feats)
    assert _perturbed_sum_change(bamba, {**batch, "use_cache": False}) > 1e-4
    report = audit_logprobs(bamba, batch, names=pair_names(2), use_cache=False)
    assert report.status == "leaks"
    with_idx = audit_logprobs(bamba, _packed(feats, return_seq_idx=True), use_cache=False)
    if torch.cuda.is_available():
        pytest.skip("on CUDA the kernels may be installed: not the CPU case")
    if not wrapper_refuses():  # transformers 5.16.1: the fallback drops seq_idx silently: a leak, measured
        assert _perturbed_sum_change(bamba, {**_packed(feats, return_seq_idx=True), "use_cache": False}) > 1e-4
        assert with_idx.status == "leaks"
        return
    assert with_idx.status == "not measured" and "can't keep packed sequences apart" in with_idx.note


def test_trl_dpo_trainer_falls_back_to_padding(tmp_path, caplog):
    """TRL 1.16 trl/trainer/dpo_trainer.py (DPOTrainer.__init__): padding_free=True logs a warning and
    sets self.padding_free = False; the collator pads one sequence per row. Audited here as it runs."""
    trl = pytest.importorskip("trl")
    import datasets
    from pipelines import save_tiny_checkpoint
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = save_tiny_checkpoint(tmp_path / "tiny")
    data = datasets.Dataset.from_dict({"prompt": ["hello there", "how are you"],
                                       "chosen": [" fine thanks", " good"], "rejected": [" no", " bad day"]})
    args = trl.DPOConfig(output_dir=str(tmp_path / "out"), padding_free=True, per_device_train_batch_size=2,
                         max_steps=1, report_to="none", save_strategy="no", use_cpu=True, bf16=False, seed=0)
    with caplog.at_level(logging.WARNING):
        trainer = trl.DPOTrainer(model=AutoModelForCausalLM.from_pretrained(path), args=args, train_dataset=data,
                                 processing_class=AutoTokenizer.from_pretrained(path))
    assert trainer.padding_free is False
    assert "Falling back to standard padding" in caplog.text
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    assert batch["input_ids"].shape[0] == 4 and "position_ids" not in batch  # 2 chosen + 2 rejected rows
    report = audit_logprobs(trainer.model.eval(), {k: batch[k] for k in ("input_ids", "attention_mask", "completion_mask")},
                            names=pair_names(2), use_cache=False)
    assert report.ok, report.text()


def test_audit_trainer_on_a_dpo_trainer_reports_the_fallback_and_the_logprobs(tmp_path):
    trl = pytest.importorskip("trl")
    import datasets
    from pipelines import save_tiny_checkpoint
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import packsim

    path = save_tiny_checkpoint(tmp_path / "tiny")
    data = datasets.Dataset.from_dict({"prompt": ["hello there", "how are you"],
                                       "chosen": [" fine thanks", " good"], "rejected": [" no", " bad day"]})
    args = trl.DPOConfig(output_dir=str(tmp_path / "out"), padding_free=True, per_device_train_batch_size=2,
                         max_steps=1, report_to="none", save_strategy="no", use_cpu=True, bf16=False, seed=0)
    trainer = trl.DPOTrainer(model=AutoModelForCausalLM.from_pretrained(path), args=args, train_dataset=data,
                             processing_class=AutoTokenizer.from_pretrained(path))
    result = packsim.audit_trainer(trainer)
    finding = result.findings[0]
    # a throughput fallback, not a training fault: a notice beside the PASS (strict=True fails it)
    assert finding.name == "padding_free" and finding.status == "notice" and "fell back to padding" in finding.evidence
    assert result.logprobs.ok and len(result.logprobs.sequences) == 4
    assert result.logprobs.sequences[2].name == "pair 0 rejected" and result.ok and result.status == "pass"
    assert packsim.audit_trainer(trainer, strict=True).status == "fail"


def test_left_padded_rows_are_isolated_and_the_padding_is_not_a_sequence():
    """GRPO-style rows: the prompt left-padded. Ground truth here: each row's real tokens alone."""
    llama = build_family("llama")
    ids = torch.tensor([[0, 0, 5, 6, 7, 8, 9], [4, 5, 6, 7, 8, 9, 10]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    comp = torch.tensor([[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1]])
    report = audit_logprobs(llama, {"input_ids": ids, "attention_mask": mask, "completion_mask": comp}, use_cache=False)
    with torch.no_grad():
        x = ids[0, 2:][None]
        lp = torch.log_softmax(llama(input_ids=x).logits[0, :-1].double(), -1).gather(-1, x[0, 1:, None])[:, 0]
    assert report.ok and len(report.sequences) == 2
    assert abs(report.sequences[0].alone - float(lp[-3:].sum())) < 1e-9 and report.sequences[0].tokens == 3


def _no_special(features):
    """The same pairs without BOS (1) / EOS (2): nothing in the tokens locates the sequences."""
    out = []
    for f in features:
        keep = [k for k, t in enumerate(f["input_ids"]) if t not in (1, 2)]
        out.append({"input_ids": [f["input_ids"][k] for k in keep], "labels": [f["labels"][k] for k in keep]})
    return out


def _true_sums(model, batch, features) -> list[float]:
    """Ground truth by hand: |summed completion log-prob in the packed call - the sequence alone| per sequence."""
    ids, labels = batch["input_ids"], batch["labels"]
    with torch.no_grad():
        packed = torch.log_softmax(model(**{k: batch[k] for k in ("input_ids", "position_ids")},
                                         use_cache=False).logits[0].double(), -1)  # (T, V)
    out, start = [], 0
    for f in features:
        n = len(f["input_ids"])
        x = ids[:, start:start + n]
        with torch.no_grad():
            alone = torch.log_softmax(model(input_ids=x, use_cache=False).logits[0].double(), -1)  # (n, V)
        lab = labels[0, start + 1:start + n]
        counted = lab != -100
        tgt = x[0, 1:]
        p = packed[start:start + n - 1].gather(-1, tgt[:, None])[:, 0][counted].sum()
        a = alone[:-1].gather(-1, tgt[:, None])[:, 0][counted].sum()
        out.append(abs(float(p - a)))
        start += n
    return out


@pytest.mark.parametrize("shift", [1, -1], ids=["late", "early"])
def test_positions_restarting_off_by_one_are_never_isolated(shift):
    """Four chosen/rejected sequences packed in one row whose position_ids restart one token late (or
    early). Without independent evidence the verdict is "unverified" (never isolated); with the
    sequences given it is "leaks", and the boundary fields are named."""
    llama = build_family("llama")
    features = _no_special(_features(2, seed=3))
    batch = _packed(features)
    lengths = [len(f["input_ids"]) for f in features]
    starts = torch.tensor([0, *lengths[:-1]]).cumsum(0).tolist()
    moved = [0] + [t + shift for t in starts[1:]]  # each restart one token off, the row's first stays
    bad = torch.empty(sum(lengths), dtype=torch.long)
    for a, b in zip(moved, [*moved[1:], sum(lengths)], strict=True):
        bad[a:b] = torch.arange(b - a)
    batch["position_ids"] = bad[None]  # (1, T)
    assert max(_true_sums(llama, batch, features)) > 1e-3  # ground truth: the true sequences leak
    alone = audit_logprobs(llama, batch, use_cache=False)
    assert alone.status == "unverified" and not alone.ok, alone.text()
    assert "rests on the batch's own metadata" in alone.note
    given = audit_logprobs(llama, batch, examples=[f["input_ids"] for f in features], use_cache=False)
    assert given.status == "leaks" and not given.ok, given.text()
    assert any(f.name == "boundary_fields" and f.failed for f in given.findings), given.text()
    right = _packed(features)
    assert max(_true_sums(llama, right, features)) < 1e-4  # ground truth: the right fields isolate
    fixed = audit_logprobs(llama, right, examples=[f["input_ids"] for f in features], use_cache=False)
    assert fixed.status == "isolated", fixed.text()
    trusted = audit_logprobs(llama, right, use_cache=False, trust_boundaries=True)
    assert trusted.status == "isolated"


def test_rows_without_boundary_fields_are_split_at_the_special_tokens(llama):
    """A wrapped-packing batch: two rows, an attention_mask and no boundary field, several BOS-started
    sequences per row under one causal mask. Rows are not sequences: the audit splits at the BOS and
    finds the leak; the ground truth is each BOS-started sequence run alone, computed here."""
    feats = _features(3)
    flat = sum((f["input_ids"] for f in feats), [])
    half = len(flat) // 2
    ids = torch.tensor([flat[:half], flat[half:2 * half]])  # (2, T)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    worst = 0.0
    with torch.no_grad():
        logits = llama(**batch, use_cache=False).logits  # (2, T, V)
        for b in range(2):
            starts = [t for t in range(ids.shape[1]) if ids[b, t] == 1] + [ids.shape[1]]
            for s, e in zip(starts, starts[1:], strict=False):
                alone = llama(input_ids=ids[b:b + 1, s:e], use_cache=False).logits[0]
                worst = max(worst, float((logits[b, s:e] - alone).abs().max()))
    assert worst > 1e-3  # the ground truth: the rows leak across the BOS inside them
    report = audit_logprobs(llama, batch, completion_mask=torch.ones_like(ids, dtype=torch.bool), use_cache=False)
    assert report.status == "leaks" and len(report.sequences) > 2, report.text()
    assert "special tokens" in report.boundaries


def test_an_eos_only_row_that_hides_several_sequences_is_unverified_not_isolated():
    """No BOS, eos == pad, examples concatenated with position_ids 0..T-1 (no boundary field): the
    EOS tokens cut the row into pieces nothing ties to examples (a multi-turn row looks the same), so
    reading the row as one sequence is the batch's own layout, not evidence: not ISOLATED. The ground
    truth here: each EOS-ended piece alone differs from the packed row (they do leak)."""
    qwen3 = build_family("qwen3", "sdpa")
    qwen3.config.bos_token_id, qwen3.config.pad_token_id = None, 2
    pieces = [p[1:] for p in (f["input_ids"] for f in _features(2))]  # drop the BOS; each ends with EOS 2
    ids = torch.tensor([sum(pieces, [])])  # (1, T)
    with torch.no_grad():
        packed = qwen3(input_ids=ids, use_cache=False).logits[0]
        at, worst = 0, 0.0
        for p in pieces:
            alone = qwen3(input_ids=torch.tensor([p]), use_cache=False).logits[0]
            worst, at = max(worst, float((packed[at:at + len(p)] - alone).abs().max())), at + len(p)
    assert worst > 1e-3
    batch = {"input_ids": ids, "position_ids": torch.arange(ids.shape[1])[None]}
    report = audit_logprobs(qwen3, batch, completion_mask=torch.ones_like(ids, dtype=torch.bool), use_cache=False)
    assert report.status == "unverified", report.text()


class _Bf16Prepared(torch.nn.Module):
    """A model's forward as accelerate's bf16 mixed precision leaves it once ``train()`` prepares it:
    computed under bf16 autocast, float32 logits returned (accelerate's ``convert_outputs_to_fp32``)."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config = model, model.config

    def forward(self, **kwargs):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = self.model(**kwargs)
        out.logits = out.logits.float()
        return out


def test_float32_logits_computed_in_bf16_are_judged_at_bf16_and_a_leak_is_still_caught(llama):
    """The tolerance follows the bf16 the layers compute in, not the float32 logits returned. The
    model's logits are scaled 8x (final norm weight; max |logit| ~3, still small beside a trained
    model's) so that a leak is larger than bf16's 3e-2 per token: smaller leaks hide in bf16 rounding."""
    import copy

    llama = copy.deepcopy(llama)
    with torch.no_grad():
        llama.model.norm.weight.mul_(8)
    features = _features(2, seed=1)
    batch = _packed(features)
    assert max(_true_sums(llama, batch, features)) < 1e-6  # ground truth, float32 outside autocast: isolated
    prepared = _Bf16Prepared(llama)
    report = audit_logprobs(prepared, batch, names=pair_names(2), use_cache=False)
    assert report.status == "isolated", report.text()
    assert report.worst.change > 1e-5 * report.worst.tokens  # bf16 rounding: float32's tolerance would fail it
    assert "logits float32 computed in bfloat16, tolerance 3e-02 per token" in report.text()
    # packed pairs without a block mask: the row is one causal sequence (positions 0..T-1)
    lengths = torch.tensor([len(f["input_ids"]) for f in features])
    causal = {"input_ids": batch["input_ids"], "labels": batch["labels"]}
    leak = _true_sums(llama, {**causal, "position_ids": torch.arange(int(lengths.sum()))[None]}, features)
    tokens = [sum(x != -100 for x in f["labels"][1:]) for f in features]
    assert max(c / n for c, n in zip(leak, tokens, strict=True)) > 3e-2 * 2  # ground truth: well past bf16's
    seq = torch.repeat_interleave(torch.arange(4), lengths)[None]  # (1, T): where the sequences are
    leaking = audit_logprobs(prepared, causal, seq=seq, names=pair_names(2), use_cache=False)
    assert leaking.status == "leaks" and not leaking.worst.ok, leaking.text()
    assert leaking.worst.name != "pair 0 chosen" and "computed in bfloat16" in leaking.text()


def test_bad_shapes_are_one_line_and_no_counted_token_is_not_measured():
    """A seq of another shape and an empty batch are PacksimError lines; a mask that counts no token
    after a sequence's first gives NOT MEASURED (there is no log-prob to compare), never 'isolated'."""
    from packsim import PackingCollator, build_model
    from packsim.core.errors import PacksimError

    model = build_model("tiny", seed=0)
    batch = PackingCollator("correct")([{"prompt_ids": [5, 6, 7], "response_ids": [8, 9, 10]},
                                        {"prompt_ids": [11, 12], "response_ids": [13, 14]}])
    mask = batch["labels"] != -100
    with pytest.raises(PacksimError, match="seq has shape \\(1, 3\\)"):
        audit_logprobs(model, batch, completion_mask=mask, seq=torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(PacksimError, match="holds no token"):
        audit_logprobs(model, {"input_ids": torch.zeros(1, 0, dtype=torch.long)})
    report = audit_logprobs(model, batch, completion_mask=torch.zeros_like(mask), trust_boundaries=True)
    assert report.status == "not measured" and "no completion token is counted" in report.text()
