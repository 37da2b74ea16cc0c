"""The audit's shared pass (packsim.auditing.shared_pass): a clean batch from a few shared forwards, a
leak from the pair probes, a leak only the backward makes still caught; the pieces it rests on.

Ground truth is computed here without packsim's probes: the perturbation as the offsets the pair
probe draws, the shift test and the accumulation check's token mean by hand. Cost is asserted as
counts of forward and backward calls (times are measured in benchmarks/audit_cost.py, not here).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from toy import VOCAB, toy_examples
from transformers import DataCollatorWithFlattening

import packsim
from packsim.auditing.attention_probe import _probabilities
from packsim.auditing.pipeline import same_randomness
from packsim.auditing.probes import probe_examples
from packsim.core.loss import IGNORE_INDEX
from packsim.core.model import build_model

SHAPES = [(4, 3), (6, 5), (2, 5), (5, 6), (3, 4), (4, 4)]  # 6 examples: 4 chosen, 2 not


def collated(examples, position_ids=None) -> dict:
    feats = [{"input_ids": list(ex.tokens),
              "labels": [IGNORE_INDEX] * ex.n_prompt + list(ex.tokens[ex.n_prompt:])} for ex in examples]
    batch = DataCollatorWithFlattening()(feats)  # one row, position_ids restarting
    if position_ids is not None:
        batch["position_ids"] = position_ids
    return batch


def seq_of(examples) -> torch.Tensor:
    """(N,) example index per token of the collated row, from the example lengths."""
    return torch.cat([torch.full((len(ex.tokens),), k) for k, ex in enumerate(examples)])


class Counter:
    """Counts the model's forward calls by input shape, and torch.autograd.grad calls."""

    def __init__(self, model, monkeypatch):
        self.shapes: list[tuple[int, ...]] = []
        self.backwards = 0
        model.register_forward_pre_hook(self._forward, with_kwargs=True)
        grad = torch.autograd.grad

        def counted(*args, **kwargs):
            self.backwards += 1
            return grad(*args, **kwargs)

        monkeypatch.setattr(torch.autograd, "grad", counted)

    def _forward(self, _module, args, kwargs):
        x = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else kwargs.get("inputs_embeds")
        self.shapes.append(tuple((x if x is not None else args[0]).shape[:2]))


@pytest.fixture()
def examples():
    return toy_examples(SHAPES, seed=3)


def _model(impl="sdpa"):
    return build_model("tiny", vocab_size=VOCAB, attn_implementation=impl, seed=0)


def _offsets(chosen, seed=0) -> dict[int, int]:
    """The offsets the pair probe draws: torch.randint(1, V) per chosen example, in order."""
    gen = torch.Generator().manual_seed(seed)
    return {i: int(torch.randint(1, VOCAB, (1,), generator=gen)) for i in chosen}


def _change(model, batch, seq, offsets: dict[int, int]) -> torch.Tensor:
    """(S,) max |logit change| of each example when example i's tokens move by offsets[i] (all at once)."""
    ids = batch["input_ids"].clone()
    for i, off in offsets.items():
        where = seq[None] == i
        ids[where] = (ids[where] + off) % VOCAB
    rest = {k: v for k, v in batch.items() if k not in ("input_ids", "labels")}
    with torch.no_grad():
        diff = (model(input_ids=ids, **rest).logits - model(input_ids=batch["input_ids"], **rest).logits)
    diff = diff.abs().amax(-1)[0]  # (N,)
    return torch.stack([diff[seq == k].max() for k in range(int(seq.max()) + 1)])


def test_a_clean_batch_takes_two_packed_forwards_and_two_backwards(examples, monkeypatch):
    model, batch, seq = _model(), collated(examples), seq_of(examples)
    count = Counter(model, monkeypatch)
    report = packsim.audit(model, batch, use_cache=False)
    assert report.ok and report.failed == [], report.table()
    assert count.shapes.count(tuple(batch["input_ids"].shape)) == 2  # the baseline, the joint perturbation
    assert count.backwards == 2
    chosen = probe_examples(len(examples), 4)
    assert report.probes["perturbation"].details["together"] == chosen and len(chosen) == 4
    truth = _change(model, batch, seq, _offsets(chosen))  # (S,): all chosen changed together
    rest = [j for j in range(len(examples)) if j not in chosen]
    assert bool((truth[rest] == 0).all()) and bool((truth[chosen] > 1e-3).all())  # isolated, and read
    for i in chosen:
        assert torch.allclose(report.logit_change[i, rest], truth[rest], atol=1e-6)
        assert float(report.logit_change[i, i]) == pytest.approx(float(truth[i]), rel=1e-5)
        assert torch.isnan(report.logit_change[i, [j for j in chosen if j != i]]).all()
    assert report.probes["gradient"].value == 0.0 and report.worst_pair is None


def test_a_leak_gets_the_pair_probes_one_forward_per_perturbed_example(examples, monkeypatch):
    N = sum(len(ex.tokens) for ex in examples)
    model, seq = _model(), seq_of(examples)
    batch = collated(examples, position_ids=torch.arange(N)[None])  # one causal sequence: it leaks
    count = Counter(model, monkeypatch)
    report = packsim.audit(model, batch, use_cache=False)
    assert {"perturbation", "gradient"} <= set(report.failed), report.table()
    rows = (~torch.isnan(report.logit_change).all(dim=1)).nonzero().flatten().tolist()  # perturbed
    assert len(rows) == 4
    assert count.shapes.count(tuple(batch["input_ids"].shape)) == 1 + len(rows)  # the baseline, then the pairs
    assert count.backwards == len(rows)  # one per differentiated loss, from the baseline's graph
    for i, off in _offsets(rows).items():  # each row: example i changed alone, as the pair probe draws it
        assert torch.allclose(report.logit_change[i], _change(model, batch, seq, {i: off}), atol=1e-5)
    later = [j for j in range(len(examples)) if j > rows[0]]
    assert bool((report.logit_change[rows[0], later] > 1e-3).all())  # a causal row leaks forwards


class _CrossGrad(torch.autograd.Function):
    """Identity forward; the backward adds example b's gradient onto example a's first tokens."""

    @staticmethod
    def forward(ctx, h, a, b):
        ctx.a, ctx.b = a, b
        return h.view_as(h)

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        n = min(len(ctx.a), len(ctx.b))
        g[:, ctx.a[:n]] += g[:, ctx.b[:n]]
        return g, None, None


def test_a_leak_only_the_backward_makes_between_chosen_examples_is_caught(monkeypatch):
    examples = toy_examples(SHAPES[:4], seed=3)  # 4 examples: all chosen, no other one to see it
    model, batch, seq = _model(), collated(examples), seq_of(examples)
    a, b = (seq == 0).nonzero().flatten(), (seq == 2).nonzero().flatten()
    clean = packsim.audit(model, batch, use_cache=False)
    assert clean.ok, clean.table()
    layer = model.model.layers[0]
    handle = layer.register_forward_hook(lambda _m, _args, out: _CrossGrad.apply(out, a, b)
                                         if isinstance(out, torch.Tensor) else out)
    try:
        count = Counter(model, monkeypatch)
        report = packsim.audit(model, batch, use_cache=False)
    finally:
        handle.remove()
    assert report.failed == ["gradient"], report.table()  # the forward still isolates
    assert float(report.gradient_ratio[0, 2]) > 0.1  # example 2's loss reaches example 0's embeddings
    others = report.gradient_ratio.clone().fill_diagonal_(0)
    others[0, 2] = 0
    assert float(torch.nan_to_num(others).max()) == 0.0
    assert count.backwards == 2 + 4  # the shared pass's two, then one per loss


def test_dropped_out_attention_weights_are_not_read_as_shares():
    seq = torch.tensor([[0, 0, 0, 1, 1, -1]])  # (B, T), the last token padding
    scores = torch.randn(1, 2, 6, 6, generator=torch.Generator().manual_seed(0))
    probs = scores.softmax(-1)  # (B, H, T, T): each query's weights sum to 1
    assert _probabilities((probs, probs), seq)
    keep = torch.rand(probs.shape, generator=torch.Generator().manual_seed(1)) > 0.3
    assert not _probabilities((probs, probs * keep / 0.7), seq)  # dropout in train mode rescales
    assert _probabilities((None,), seq)  # nothing recorded: the probe says so itself


def test_same_randomness_draws_what_manual_seed_draws_and_restores_the_state():
    torch.manual_seed(5)
    outside = torch.rand(3)
    torch.manual_seed(5)
    with same_randomness(7, torch.device("cpu")):
        inside = torch.rand(4)
    after = torch.rand(3)
    assert torch.equal(inside, torch.rand(4, generator=torch.Generator().manual_seed(7)))
    assert torch.equal(after, outside)  # the caller's stream goes on as if nothing ran


def test_the_shift_test_from_the_alone_rows_is_the_two_forwards_it_replaces(examples):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2, bos_token_id=1,
                        eos_token_id=2)
    model = GPT2LMHeadModel(config).eval()
    batch, seq = collated(examples), seq_of(examples)
    allowed = (seq[:, None] == seq[None, :]) & torch.ones(len(seq), len(seq), dtype=torch.bool).tril()
    batch["attention_mask"] = torch.zeros(1, 1, len(seq), len(seq)).masked_fill(~allowed, float("-inf"))
    report = packsim.audit(model, batch)
    assert report.failed == [] and "together" in report.probes["perturbation"].details, report.table()
    j = int(torch.bincount(seq).argmax())  # the longest example, alone, positions 0.. and + shift
    x = batch["input_ids"][0, seq == j][None]
    L = x.shape[1]
    shift = min(len(seq), 64 - L)
    pos = torch.arange(L)[None]
    with torch.no_grad():
        a = model(input_ids=x, position_ids=pos).logits
        b = model(input_ids=x, position_ids=pos + shift).logits
    truth = float((a - b).abs().max())
    assert truth > 0.1  # absolute positions: it matters
    assert report.probes["positions"].value == pytest.approx(truth, rel=1e-4)
    assert f"positions +{shift}" in report.probes["positions"].summary


def test_a_clean_trainer_runs_its_packed_forward_three_times(monkeypatch, tmp_path):
    datasets = pytest.importorskip("datasets")
    from transformers import Trainer, TrainingArguments

    examples = toy_examples(SHAPES, seed=3)
    feats = [{"input_ids": list(ex.tokens),
              "labels": [IGNORE_INDEX] * ex.n_prompt + list(ex.tokens[ex.n_prompt:])} for ex in examples]
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=len(feats), max_steps=1,
                             report_to="none", save_strategy="no", use_cpu=True, seed=0)
    model = _model()
    trainer = Trainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(feats),
                      data_collator=DataCollatorWithFlattening())
    count = Counter(model, monkeypatch)
    report = packsim.audit_trainer(trainer)
    assert report.ok, report.table()
    N = sum(len(f["input_ids"]) for f in feats)
    assert count.shapes.count((1, N)) == 3  # baseline, joint perturbation, compute_loss (its logits reused)
    assert count.backwards == 2
    batch = DataCollatorWithFlattening()(feats)  # ground truth: the token mean, by hand, in eval mode
    with torch.no_grad():
        logits = model.eval()(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits[0]
    labels = batch["labels"][0, 1:]
    keep = labels != IGNORE_INDEX
    want = float(F.cross_entropy(logits[:-1][keep], labels[keep]))
    (acc,) = [f for f in report.findings if f.name == "loss_over_accumulation"]
    assert acc.status == "pass" and f"the mean over all counted labels is {want:.6g}" in acc.evidence


def test_a_checkpointed_model_in_train_mode_is_audited_as_its_graph_free_forwards_run(examples):
    """transformers 5.24 on drops the cache under activation checkpointing only with grad enabled: the
    perturbed forwards (no grad) build one, so the baseline must too, or the two would differ. 5.16.1 drops
    it in train mode with or without grad: no cache, isolated (packsim.core.upstream.outputs)."""
    from packsim.core.upstream.outputs import cache_of, enable_checkpointing, per_version

    model = _model()
    model.config.use_cache = True
    enable_checkpointing(model)
    model.train()
    batch = collated(examples)
    rest = {k: v for k, v in batch.items() if k not in ("input_ids", "labels")}
    with torch.no_grad():  # ground truth: does the forward make a cache without grad?
        made = cache_of(model(input_ids=batch["input_ids"], **rest)) is not None
    assert per_version(True, False) in (None, made)
    report = packsim.audit(model, batch)
    assert ("perturbation" in report.failed) == made, report.table()
    if made:
        assert any("use_cache=False" in c for c in report.causes), report.causes
