"""packsim.audit: a gallery of planted faults (each wrong in exactly one way) and clean pipelines.

Every fault must be flagged by exactly the probes it breaks, with the right likely cause, and every
clean pipeline must pass. Numbers are from a tiny random Llama (d=128, 2 layers, vocab 40) in fp32
on CPU: leaks move another example's logits by ~0.1-1, isolation gives exactly 0.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from toy import EOS, VOCAB, toy_examples
from transformers import DataCollatorWithFlattening, GPT2Config, GPT2LMHeadModel

import packsim
from packsim import PackedBatch, PacksimError, Setup
from packsim.auditing import AuditReport
from packsim.auditing.features import response_mask_from_features
from packsim.auditing.report import PROBES
from packsim.cli import main
from packsim.core.loss import IGNORE_INDEX, Role
from packsim.core.model import build_model

LEAK = {"perturbation", "gradient", "attention_mass"}  # what a cross-example leak breaks (eager/packsim)
LEAK_NO_PROBS = {"perturbation", "gradient"}  # sdpa: no attention probabilities to read
LEAK_MIN = 1e-3  # measured leaks: 0.1-1
SHAPES = [(4, 3), (6, 5), (2, 5), (5, 6), (3, 4)]  # 10..14 tokens: two rows of 32 with padding


@pytest.fixture(scope="module")
def examples():
    return toy_examples(SHAPES, seed=3)


@pytest.fixture(scope="module")
def models():
    """One tiny Llama per attention implementation, same weights (seed 0)."""
    cache: dict[str, torch.nn.Module] = {}

    def get(impl: str = "packsim"):
        if impl not in cache:
            cache[impl] = build_model("tiny", vocab_size=VOCAB, attn_implementation=impl, seed=0)
        return cache[impl]

    return get


def packed(examples, setup="correct") -> PackedBatch:
    return PackedBatch.from_examples(examples, capacity=32, setup=setup)


def collated(examples, mask_prompt: bool = True) -> dict:
    """DataCollatorWithFlattening over the examples (labels with prompts masked, or plain ids)."""
    feats = [{"input_ids": list(ex.tokens)} for ex in examples]
    if mask_prompt:
        for f, ex in zip(feats, examples, strict=True):
            f["labels"] = [IGNORE_INDEX] * ex.n_prompt + list(ex.tokens[ex.n_prompt:])
    return DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)(feats)


response_mask = response_mask_from_features  # (1, N) bool: True on response tokens and EOS


def seq_of(batch: dict) -> torch.Tensor:
    """(N,) example index per token of a collated row."""
    return batch["seq_idx"][0].long()


def float_mask(seq: torch.Tensor) -> torch.Tensor:
    """(1, 1, N, N) additive block-diagonal causal mask (0 allowed, -inf elsewhere)."""
    N = seq.numel()
    allowed = (seq[:, None] == seq[None, :]) & torch.ones(N, N, dtype=torch.bool).tril()
    return torch.zeros(1, 1, N, N).masked_fill(~allowed, float("-inf"))


def off_by_one(seq: torch.Tensor) -> torch.Tensor:
    """Boundaries shifted by one: each example's first token is put in the previous example."""
    shifted = seq.clone()
    starts = torch.nonzero(seq[1:] != seq[:-1]).flatten() + 1
    shifted[starts] = seq[starts - 1]
    return shifted


def with_labels(batch: PackedBatch, role: Role, counted: bool) -> PackedBatch:
    """The batch with the labels of every token of ``role`` counted (or ignored)."""
    where = batch.roles == role
    value = batch.input_ids if counted else torch.full_like(batch.input_ids, IGNORE_INDEX)
    return dataclasses.replace(batch, labels=torch.where(where, value, batch.labels))


def gpt2(seed: int = 0):
    """A tiny GPT-2: absolute (learned) position embeddings, eager attention."""
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=1, eos_token_id=EOS, attn_implementation="eager")
    return GPT2LMHeadModel(config).eval()


@pytest.fixture
def leak_in_layer_1(models):
    """Layer 1 of the packsim model attends over the whole row (one causal segment per row)."""
    model = models("packsim")

    def hook(module, args, kwargs):
        B, T = kwargs["hidden_states"].shape[:2]
        cu = torch.arange(0, B * T + 1, T, dtype=torch.int32)
        return args, {**kwargs, "cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": T,
                      "max_length_k": T}

    handle = model.model.layers[1].self_attn.register_forward_pre_hook(hook, with_kwargs=True)
    yield model
    handle.remove()


# ----------------------------------------------------------------------------- planted faults
# name -> builder(examples, models) -> (model, batch, audit kwargs), the failed probes, a cause


def _causal_continuous(ex, m):
    return m(), packed(ex, Setup("causal", "continuous", "completion")), {}


def _causal_reset(ex, m):
    return m(), packed(ex, Setup("causal", "reset", "completion")), {}


def _off_by_one_mask(ex, m):
    b = collated(ex)
    b["attention_mask"] = float_mask(off_by_one(seq_of(b)))
    return m("eager"), b, {"response_mask": response_mask(ex), "use_cache": False}


def _labels(role, counted):
    return lambda ex, m: (m(), with_labels(packed(ex), role, counted), {})


def _all_ones_mask(ex, m):
    b = collated(ex)
    b["attention_mask"] = torch.ones_like(b["input_ids"])
    return m("sdpa"), b, {"response_mask": response_mask(ex), "use_cache": False}


def _cache(ex, m):
    return m("sdpa"), collated(ex), {"response_mask": response_mask(ex), "use_cache": True}


def _bool_mask_eager(ex, m):
    b = collated(ex)
    b["attention_mask"] = float_mask(seq_of(b)) == 0  # bool, True = attend: eager adds it
    return m("eager"), b, {"response_mask": response_mask(ex), "use_cache": False}


def _continuous_positions(ex, m):
    b = collated(ex)
    b["position_ids"] = torch.arange(b["input_ids"].shape[1])[None]
    return m("sdpa"), b, {"response_mask": response_mask(ex), "use_cache": False}


def _absolute_positions_continuous(ex, m):
    b = collated(ex)
    b["position_ids"] = torch.arange(b["input_ids"].shape[1])[None]
    b["attention_mask"] = float_mask(seq_of(b))  # isolates: only the positions are wrong
    return gpt2(), b, {"response_mask": response_mask(ex)}


def _dict_boundary_counted(ex, m):
    b = collated(ex)
    starts = b["cu_seq_lens_q"][1:-1].long()
    b["labels"][0, starts] = b["input_ids"][0, starts]  # undo the collator's -100 at each start
    return m("sdpa"), b, {"use_cache": False}  # no response_mask: boundaries are still known


def _dict_eos_not_counted(ex, m):
    b = collated(ex)
    b["labels"][b["input_ids"] == EOS] = IGNORE_INDEX  # EOS found through model.config.eos_token_id
    return m("sdpa"), b, {"use_cache": False}


def _dict_nothing_ignored(ex, m):
    return m("sdpa"), collated(ex, mask_prompt=False), {"use_cache": False}


FAULTS = {
    "default_causal_mask": (_causal_continuous, LEAK, "mask='causal'"),
    "reset_positions_but_causal_mask": (_causal_reset, LEAK, "mask='causal'"),
    # the 4D mask disagrees with the other boundary fields: boundary_fields names it
    "mask_from_boundaries_off_by_one": (_off_by_one_mask, LEAK | {"boundary_fields"}, "off-by-one"),
    "labels_include_prompt": (_labels(Role.PROMPT, True), {"loss_coverage"}, "prompt tokens"),
    "labels_include_padding": (_labels(Role.PAD, True), {"loss_coverage"}, "padding"),
    "boundary_token_counted": (_labels(Role.BOUNDARY, True), {"loss_coverage"}, "later example"),
    "eos_not_counted": (_labels(Role.EOS, False), {"loss_coverage"}, "never learns to stop"),
    "all_ones_mask_disables_detection": (_all_ones_mask, LEAK_NO_PROBS, "all-ones mask"),
    "cache_disables_detection": (_cache, LEAK_NO_PROBS, "use_cache=False"),
    "bool_4d_mask_under_eager": (_bool_mask_eager, LEAK, "boolean 4D"),
    # positions that keep counting disagree with the batch's cu_seq_lens_*: flash_fields fails too
    # the collator's cu_seq_lens are the examples (its BOS tokens say so): the positions are wrong, and the
    # probes that fail name them; flash_fields passes (tests/test_findings.py holds its rule)
    "continuous_positions_no_detection": (_continuous_positions, LEAK_NO_PROBS, "do not restart"),
    "absolute_positions_not_reset": (_absolute_positions_continuous, {"positions"}, "absolute"),
    "dict_boundary_counted": (_dict_boundary_counted, {"loss_coverage"}, "later example"),
    "dict_eos_not_counted": (_dict_eos_not_counted, {"loss_coverage"}, "never learns to stop"),
    "dict_nothing_ignored": (_dict_nothing_ignored, {"loss_coverage"}, "prompts are in the loss"),
}


def test_the_gallery_exercises_every_probe():
    flagged = set().union(*(probes for _, probes, _ in FAULTS.values()))
    assert flagged >= set(PROBES), f"no planted fault for {set(PROBES) - flagged}"
    assert len(FAULTS) >= 10


@pytest.mark.parametrize("name", list(FAULTS))
def test_planted_fault_is_flagged_by_the_right_probe(name, examples, models):
    build, expected, cause = FAULTS[name]
    model, batch, kwargs = build(examples, models)
    report = packsim.audit(model, batch, **kwargs)
    assert set(report.failed) == expected, report.table()
    assert not report.ok
    assert any(cause in c for c in report.causes), report.table()
    assert report.verdict.startswith("FAIL (" + ", ".join(p for p in PROBES if p in expected))
    for probe in expected & {"perturbation", "gradient", "attention_mass"}:
        assert report.probes[probe].value > LEAK_MIN, report.table()


def test_leak_in_one_layer_is_located(leak_in_layer_1, examples):
    report = packsim.audit(leak_in_layer_1, packed(examples))
    assert set(report.failed) == LEAK, report.table()
    outside = report.attention_outside  # (L, H)
    assert outside[0].max() == 0 and outside[1].min() > 0.05, outside
    assert any("only layer(s) [1] of 2" in c for c in report.causes), report.table()
    assert any("block-diagonal, yet attention still crosses" in c for c in report.causes)


def test_worst_pair_is_the_largest_cross_example_change(examples, models):
    batch = packed(examples, "loss_fix")
    report = packsim.audit(models(), batch, max_examples=len(examples))  # every pair
    change = report.logit_change.clone().fill_diagonal_(0)
    i, j = divmod(int(change.argmax()), change.shape[0])
    pair = report.worst_pair
    assert (pair.perturbed, pair.affected) == (report.example_ids[i], report.example_ids[j])
    assert pair.logit_change == pytest.approx(float(change.max())) and pair.logit_change > LEAK_MIN
    # a causal mask leaks only forwards: an example never changes one packed before it
    rows = {s.example: (s.row, s.start) for s in batch.segments}
    for a, ida in enumerate(report.example_ids):
        for b, idb in enumerate(report.example_ids):
            later = rows[ida][0] == rows[idb][0] and rows[ida][1] < rows[idb][1]
            assert (report.logit_change[a, b] > LEAK_MIN) == (later or a == b), (ida, idb)
            if a != b:  # the gradient flows the same way: into later examples' losses only
                assert (report.gradient_ratio[a, b] > 0) == later, (ida, idb)


# ----------------------------------------------------------------------------- clean pipelines


def _dict_clean(impl):
    def build(ex, m):
        return m(impl), collated(ex), {"response_mask": response_mask(ex), "use_cache": False}
    return build


def _gpt2_clean(ex, m):
    b = collated(ex)
    b["attention_mask"] = float_mask(seq_of(b))
    return gpt2(), b, {"response_mask": response_mask(ex)}


CLEAN = {
    "packed_correct_packsim_attention": (lambda ex, m: (m(), packed(ex), {}), set()),
    "packed_correct_transformers_eager": (
        lambda ex, m: (m("eager"), packed(ex), {"backend": "transformers"}), set()),
    "packed_padded_one_example_per_row": (lambda ex, m: (m(), packed(ex, "padded"), {}), set()),
    "collator_eager_no_cache": (_dict_clean("eager"), set()),
    "collator_sdpa_no_cache": (_dict_clean("sdpa"), {"attention_mass"}),
    "gpt2_float_4d_mask_reset_positions": (_gpt2_clean, set()),
}


@pytest.mark.parametrize("name", list(CLEAN))
def test_clean_pipeline_passes(name, examples, models):
    build, skipped = CLEAN[name]
    model, batch, kwargs = build(examples, models)
    report = packsim.audit(model, batch, **kwargs)
    assert report.ok and report.failed == [], report.table()
    assert set(report.skipped) == skipped, report.table()
    assert report.verdict.startswith("PASS") and report.causes == [] and report.worst_pair is None
    assert report.probes["perturbation"].value <= 1e-5
    if report.gradient_ratio is not None:
        assert report.probes["gradient"].value <= 1e-5


def test_skipped_probe_is_not_a_pass_and_says_why(examples, models):
    report = packsim.audit(models("sdpa"), collated(examples), use_cache=False)
    probe = report.probes["attention_mass"]
    assert probe.status == "skipped" and not probe.failed and "eager" in probe.summary
    assert "skipped: attention_mass" in report.verdict


def test_dropout_in_train_mode_does_not_fake_a_leak(examples):
    model = build_model("tiny", vocab_size=VOCAB, attn_implementation="eager", seed=0).train()
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.3
    report = packsim.audit(model, collated(examples), response_mask(examples), use_cache=False)
    assert report.ok, report.table()
    report = packsim.audit(model, collated(examples), response_mask(examples), use_cache=True)
    assert "perturbation" in report.failed  # and it still sees the real leak


@pytest.mark.parametrize("source", ["cu_seq_lens_q", "seq_idx", "position_ids"])
def test_boundaries_come_from_what_the_batch_carries(examples, models, source):
    """Each field alone gives the same examples and, eager ignoring the others, the same numbers."""
    full = collated(examples)
    keep = {"cu_seq_lens_q": ["cu_seq_lens_q"], "seq_idx": ["seq_idx"], "position_ids": []}[source]
    batch = {k: full[k] for k in ("input_ids", "labels", "position_ids", *keep)}
    report = packsim.audit(models("eager"), batch, response_mask(examples), use_cache=True)
    assert report.boundaries.startswith(source) and len(report.example_ids) == len(examples)
    reference = packsim.audit(models("eager"), full, response_mask(examples), use_cache=True)
    assert torch.equal(torch.nan_to_num(report.logit_change), torch.nan_to_num(reference.logit_change))
    assert "perturbation" in report.failed  # the cache leak, whatever the boundary source


@pytest.mark.parametrize(("setup", "leaks"), [("correct", False), ("loss_fix", True)])
def test_multi_row_dict_with_padding(examples, models, setup, leaks):
    """Two padded rows as a plain dict: seq_idx -1 marks padding; sdpa isolates per row via positions."""
    pb = packed(examples, setup)
    batch = {"input_ids": pb.input_ids, "labels": pb.labels, "position_ids": pb.position_ids,
             "seq_idx": pb.seq_ids}
    assert pb.shape[0] == 2 and bool((pb.seq_ids < 0).any())
    report = packsim.audit(models("sdpa"), batch, pb.response_mask, use_cache=False)
    assert len(report.example_ids) == len(examples)
    assert report.probes["loss_coverage"].details["counts"]["padding"] == (0, int((pb.seq_ids < 0).sum()))
    assert set(report.failed) == (LEAK_NO_PROBS if leaks else set()), report.table()


@pytest.mark.parametrize("mask_prompt", [True, False])
def test_packed_batch_from_flattening_is_not_judged_by_its_own_labels(examples, models, mask_prompt):
    """from_flattening infers roles from the labels; the audit must not pass the loss by construction."""
    pb = PackedBatch.from_flattening(collated(examples, mask_prompt=mask_prompt), setup="correct")
    report = packsim.audit(models(), pb)
    assert set(report.failed) == (set() if mask_prompt else {"loss_coverage"}), report.table()
    assert "pass response_mask" in report.probes["loss_coverage"].summary
    exact = packsim.audit(models(), pb, response_mask(examples))
    assert set(exact.failed) == (set() if mask_prompt else {"loss_coverage"}), exact.table()
    if not mask_prompt:
        assert exact.probes["loss_coverage"].details["problems"] == ["prompt"]


class _Wrapped(torch.nn.Module):
    """Any nn.Module that returns logits: no ``config``, no transformers base class."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def forward(self, **kwargs):
        return self.inner(**kwargs).logits


def test_any_module_returning_logits_can_be_audited(examples, models):
    model = _Wrapped(models("eager"))
    report = packsim.audit(model, collated(examples), response_mask(examples), use_cache=False,
                           examples=[ex.tokens for ex in examples])
    assert report.ok, report.table()
    # a bare tensor carries no attentions; no config, so no special tokens to read
    assert report.skipped == ["attention_mass", "special_tokens"]
    assert report.probes["positions"].details["kind"] == "RoPE"
    leaky = packsim.audit(model, collated(examples), response_mask(examples), use_cache=True)
    assert set(leaky.failed) == LEAK_NO_PROBS


# ----------------------------------------------------------------------------- third-party collators


@pytest.fixture(scope="module")
def uncompiled_flex():
    """transformers' flex path without torch.compile (6-9 s per mask on CPU; same masking logic)."""
    import transformers.integrations.flex_attention as hf_flex
    import transformers.masking_utils as hf_masking
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def eager_flex(query, key, value, training=False, **kwargs):
        return flex_attention(query, key, value, **kwargs)

    def eager_create_block_mask(*args, **kwargs):
        return create_block_mask(*args, **{**kwargs, "_compile": False})

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(hf_flex, "compile_friendly_flex_attention", eager_flex)
        mp.setattr(hf_masking, "create_block_mask", eager_create_block_mask)
        yield


COLLATOR_CASES = [(impl, cache, ones) for impl in ("eager", "sdpa", "flex_attention")
                  for cache in (False, True) for ones in (False, True)]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile:UserWarning")
@pytest.mark.parametrize(("impl", "use_cache", "all_ones_mask"), COLLATOR_CASES,
                         ids=[f"{i}-cache_{c}-ones_mask_{o}" for i, c, o in COLLATOR_CASES])
def test_flattening_collator_verdicts_match_transformers_facts(
        uncompiled_flex, examples, models, impl, use_cache, all_ones_mask):
    """DESIGN.md, transformers 5.24: isolated only with use_cache=False and no attention_mask."""
    batch = collated(examples)
    if all_ones_mask:
        batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    report = packsim.audit(models(impl), batch, response_mask(examples), use_cache=use_cache)
    assert report.boundaries.startswith("cu_seq_lens_q")
    assert report.probes["loss_coverage"].status == "pass"
    skipped = {"eager": set(), "sdpa": {"attention_mass"},
               "flex_attention": {"gradient", "attention_mass"}}[impl]  # flex: no CPU backward
    assert set(report.skipped) == skipped, report.table()
    if not use_cache and not all_ones_mask:
        assert report.ok, report.table()
        return
    assert set(report.failed) == LEAK - skipped, report.table()
    assert report.probes["perturbation"].value > LEAK_MIN
    cause = "attention_mask was passed" if all_ones_mask else "a cache was created"
    assert cause in report.causes[0], report.table()


def test_cache_from_the_config_default_is_caught(examples, models):
    model = build_model("tiny", vocab_size=VOCAB, attn_implementation="sdpa", seed=0)
    model.config.use_cache = True  # LlamaConfig's default; no use_cache kwarg in the call
    report = packsim.audit(model, collated(examples), response_mask(examples))
    assert "perturbation" in report.failed and "a cache was created" in report.causes[0]


def test_trl_padding_free_collator(examples, models):
    trl_sft = pytest.importorskip("trl.trainer.sft_trainer")
    collator = trl_sft.DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    feats = [{"input_ids": list(ex.tokens),
              "labels": [IGNORE_INDEX] * ex.n_prompt + list(ex.tokens[ex.n_prompt:])}
             for ex in examples]
    batch = collator(feats)
    assert "attention_mask" not in batch  # TRL >= 0.24 sends none for padding-free batches
    for impl in ("eager", "sdpa"):
        report = packsim.audit(models(impl), batch, response_mask(examples), use_cache=False)
        assert report.ok, report.table()
        leaky = packsim.audit(models(impl), batch, response_mask(examples), use_cache=True)
        assert "perturbation" in leaky.failed and "a cache was created" in leaky.causes[0]


# ----------------------------------------------------------------------------- bad input


def test_batch_without_boundaries_is_audited_by_its_tokens_or_refused(examples, models):
    b = collated(examples)
    bare = {"input_ids": b["input_ids"], "labels": b["labels"]}
    report = packsim.audit(models("sdpa"), bare)  # no field, but a BOS starts each example
    assert {"perturbation", "boundary_fields", "special_tokens"} <= set(report.failed), report.table()
    assert report.boundaries.startswith("the special tokens") and len(report.example_ids) == len(examples)
    one_run = {"input_ids": b["input_ids"], "position_ids": torch.arange(b["input_ids"].shape[1])[None]}
    assert "perturbation" in packsim.audit(models("sdpa"), one_run).failed
    blind = build_model("tiny", vocab_size=VOCAB, attn_implementation="sdpa", seed=0)
    blind.config.bos_token_id = blind.config.eos_token_id = None  # the tokens say nothing either
    with pytest.raises(PacksimError, match="no example boundaries"):
        packsim.audit(blind, bare)
    with pytest.raises(PacksimError, match=r"describes 1 example"):
        packsim.audit(blind, one_run)


@pytest.mark.parametrize("field", ["labels", "position_ids", "cu_seq_lens_q", "response_mask",
                                   "attention_mask"])
def test_mismatched_lengths_are_refused(examples, models, field):
    b = collated(examples)
    N = b["input_ids"].shape[1]
    kwargs = {}
    if field == "cu_seq_lens_q":
        b[field] = torch.cat([b[field][:-1], torch.tensor([N + 3], dtype=torch.int32)])
    elif field == "response_mask":
        kwargs["response_mask"] = response_mask(examples)[:, :-1]
    elif field == "attention_mask":
        b[field] = torch.ones(1, N + 1, dtype=torch.long)
    else:
        b[field] = b[field][:, :-1]
    with pytest.raises(PacksimError, match="input_ids|tokens"):
        packsim.audit(models("sdpa"), b, **kwargs)


class _StrictLM(torch.nn.Module):
    """A model whose forward takes input_ids only (no **kwargs): it cannot take position_ids."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 8)
        self.head = torch.nn.Linear(8, VOCAB)

    def get_input_embeddings(self):
        return self.emb

    def forward(self, input_ids, labels=None):
        return self.head(self.emb(input_ids))


def test_model_that_rejects_the_fields_gets_a_clear_error(examples):
    with pytest.raises(PacksimError, match="does not accept this batch.*position_ids"):
        packsim.audit(_StrictLM(), collated(examples))


def test_wrong_batch_type_and_missing_logits_are_refused(examples, models):
    with pytest.raises(PacksimError, match="PackedBatch or the collator's dict"):
        packsim.audit(models(), [1, 2, 3])
    with pytest.raises(PacksimError, match="input_ids"):
        packsim.audit(models(), {"input_ids": [[1, 2, 3]]})

    class NoLogits(_StrictLM):
        def forward(self, input_ids, **kwargs):
            return {"hidden": self.emb(input_ids)}

    with pytest.raises(PacksimError, match="without .logits"):
        packsim.audit(NoLogits(), collated(examples))


# ----------------------------------------------------------------------------- report and CLI


def test_report_renders_text_and_html(examples, models):
    report = packsim.audit(models(), packed(examples, "buggy"))
    assert isinstance(report, AuditReport)
    assert report.failed == ["perturbation", "gradient", "attention_mass", "loss_coverage"]
    text, page = report.table(), report._repr_html_()
    for name in PROBES:
        assert name in text and f"<code>{name}</code>" in page
    assert text.splitlines()[0] == report.verdict and "worst pair: changing example" in text
    assert "<table>" in page and "FAIL" in page and "&#x27;buggy&#x27;" in page
    assert str(report) == report.table(width=100) and max(map(len, str(report).splitlines())) <= 100


def test_audit_is_deterministic(examples, models):
    """Same seed, same numbers (its cost is measured in benchmarks/audit_cost.py, not here)."""
    batch = packed(examples, "buggy")
    a = packsim.audit(models(), batch, seed=1)
    b = packsim.audit(models(), batch, seed=1)
    assert torch.equal(torch.nan_to_num(a.logit_change), torch.nan_to_num(b.logit_change))


def test_max_examples_limits_the_perturbed_examples(examples, models):
    report = packsim.audit(models(), packed(examples, "buggy"), max_examples=2)
    perturbed = ~torch.isnan(report.logit_change).all(dim=1)
    alone = torch.tensor(report.probes["perturbation"].details["alone"])  # (S,) packed vs alone
    j = int(alone.argmax())  # the most contaminated example and the one packed just before it
    assert perturbed.nonzero().flatten().tolist() == [j - 1, j] and j > 0
    clean = packsim.audit(models(), packed(examples, "correct"), max_examples=2)
    assert (~torch.isnan(clean.logit_change).all(dim=1)).tolist() == [True, False, False, False, True]


def test_cli_audits_each_setup(capsys):
    assert main(["audit", "--setups", "buggy,correct", "--examples", "4", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "=== setup 'buggy'" in out and "=== setup 'correct'" in out
    summary = out.split("summary")[-1]
    assert "buggy    FAIL" in summary and "correct  PASS" in summary


def test_cli_rejects_unknown_setup(capsys):
    with pytest.raises(SystemExit) as info:  # the CLI's contract: one line on stderr, exit 2
        main(["audit", "--setups", "nope"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "unknown setup 'nope'" in err and len(err.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- what the texts say (issue 30)


def _later_starts(examples) -> list[int]:
    """Ground truth: the token where each later example starts in the collated row (from the lengths)."""
    lengths = torch.tensor([len(ex.tokens) for ex in examples])
    return lengths.cumsum(0)[:-1].tolist()


def _others_move(model, batch: dict, k: int, starts: list[int]) -> float:
    """Ground truth without packsim: the largest logit change outside example k when its tokens change."""
    ids = batch["input_ids"]
    bounds = [0, *starts, ids.shape[1]]
    mine = torch.zeros(ids.shape[1], dtype=torch.bool)
    mine[bounds[k]:bounds[k + 1]] = True
    rest = {key: v for key, v in batch.items() if key not in ("input_ids", "labels")}
    with torch.no_grad():
        base = model(input_ids=ids, **rest, use_cache=False).logits[0]
        moved = model(input_ids=torch.where(mine, (ids + 7) % VOCAB, ids), **rest, use_cache=False).logits[0]
    return float((moved - base).abs().amax(-1)[~mine].max())


def test_a_numerical_difference_is_not_called_a_leak_nor_given_the_flash_note(examples, models):
    """A correct flattening batch with cu_seq_lens on sdpa and a tolerance below fp32 round-off: packed and
    alone differ by round-off, no example moves another (0 leaking pairs): no flash-only note, no
    "attention crosses examples"."""
    batch, model = collated(examples), models("sdpa")
    starts = _later_starts(examples)
    assert all(_others_move(model, batch, k, starts) == 0.0 for k in range(len(examples)))  # ground truth
    report = packsim.audit(model, batch, response_mask(examples), use_cache=False, tol=1e-12)
    pert = report.probes["perturbation"]
    assert report.failed == ["perturbation"] and pert.details["leaking_pairs"] == 0, report.table()
    text = " ".join(report.causes)
    assert "cu_seq_lens" not in text and "attention crosses examples" not in text
    assert "0 leaking pairs" in report.causes[0] and "tolerance 1e-12" in report.causes[0]


def test_the_flash_note_comes_where_cu_seq_lens_mark_what_position_ids_do_not(examples, models):
    batch, model = collated(examples), models("sdpa")
    batch["position_ids"] = torch.arange(batch["input_ids"].shape[1])[None]  # cu_seq_lens_* still mark them
    assert _others_move(model, batch, 0, _later_starts(examples)) > LEAK_MIN  # ground truth: it leaks
    report = packsim.audit(model, batch, response_mask(examples), use_cache=False)
    assert "perturbation" in report.failed
    assert any(c.startswith("note: the batch's cu_seq_lens_*") and "'sdpa' isolates through position_ids" in c
               for c in report.causes), report.table()


@pytest.mark.parametrize("shift", [-1, 1], ids=["early", "late"])
def test_positions_restarting_one_token_off_are_named_with_the_token(examples, models, shift):
    """position_ids restart one token before (after) each later example's first token: the report says
    so, at the token the test put it, instead of "do not restart at each example"."""
    b = collated(examples)
    starts = _later_starts(examples)
    seq = torch.zeros(b["input_ids"].shape[1], dtype=torch.long)
    for s in starts:
        seq[s + shift:] += 1  # the collator's (wrong) examples: each start moved by `shift`
    pos = seq.clone()
    for k in range(int(seq.max()) + 1):
        pos[seq == k] = torch.arange(int((seq == k).sum()))
    batch = {"input_ids": b["input_ids"], "labels": b["labels"], "position_ids": pos[None]}
    model = models("sdpa")
    assert _others_move(model, batch, 0, starts) > LEAK_MIN  # ground truth: example 0 moves example 1
    report = packsim.audit(model, batch, response_mask(examples), use_cache=False,
                           examples=[list(ex.tokens) for ex in examples])
    word = "early" if shift < 0 else "late"
    s = starts[0]
    expected = f"restart one token {word}: at token {s + shift}, where the example starts at token {s}"
    assert expected in report.probes["positions"].summary, report.table()
    assert f"({len(starts)} of the {len(starts)} later examples' starts)" in report.probes["positions"].summary
    assert "perturbation" in report.failed
    cause = next(c for c in report.causes if c.startswith("position_ids restart one token"))
    assert expected in cause and ("the last token of each example" if shift < 0 else "the first token") in cause
    assert "do not restart at each example" not in report.table()


class _Blind(torch.nn.Module):
    """A 'model' whose logits do not depend on input_ids (a wrapper that binds its own tokens)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 4)
        self.register_buffer("out", torch.randn(VOCAB, generator=torch.Generator().manual_seed(0)))

    def get_input_embeddings(self):
        return self.emb

    def forward(self, input_ids=None, inputs_embeds=None, **kwargs):
        x = input_ids if input_ids is not None else inputs_embeds[..., 0]
        return self.out.expand(*x.shape[:2], VOCAB)


def test_logits_that_ignore_input_ids_say_so_in_how_to_get_the_probe(examples):
    b = collated(examples)
    report = packsim.audit(_Blind(), b, response_mask(examples))
    pert = report.probes["perturbation"]
    assert pert.status == "skipped" and pert.summary.startswith("the forward ran, but"), report.table()
    assert "its logits did not change with input_ids" in report.table()


# ----------------------------------------------------------------------------- objective="lm"


def _lm_batch(examples) -> dict:
    """Pretraining-style: DataCollatorWithFlattening over token lists, labels = input_ids (first of each -100)."""
    return DataCollatorWithFlattening()([{"input_ids": list(ex.tokens)} for ex in examples])


def test_a_language_modelling_batch_passes_under_objective_lm(examples, models):
    batch, model = _lm_batch(examples), models("sdpa")
    ids, labels = batch["input_ids"][0], batch["labels"][0]
    starts = [0, *_later_starts(examples)]
    inside = torch.ones_like(ids, dtype=torch.bool)
    inside[starts] = False
    assert bool((labels[inside] == ids[inside]).all()) and bool((labels[starts] == IGNORE_INDEX).all())  # truth
    sft = packsim.audit(model, batch, use_cache=False)  # the completion-only check: any prompt would count
    assert "loss_coverage" in sft.failed and any("objective='lm'" in c for c in sft.causes), sft.table()
    report = packsim.audit(model, batch, use_cache=False, objective="lm")
    loss = report.probes["loss_coverage"]
    assert report.ok and loss.status == "pass", report.table()
    c, n = loss.details["counts"]["response"]
    e, ne = loss.details["counts"]["EOS"]
    assert c == n and e == ne and c + e == int(inside.sum()), loss.details["counts"]
    assert "every real token" in report.verdict and "objective='lm'" in loss.summary


def test_objective_lm_still_checks_boundaries_padding_and_coverage(examples, models):
    model = models("sdpa")
    batch = _lm_batch(examples)
    s = _later_starts(examples)[0]
    batch["labels"][0, s] = batch["input_ids"][0, s]  # the label across a boundary counted
    assert "boundary" in packsim.audit(model, batch, use_cache=False, objective="lm").probes[
        "loss_coverage"].details["problems"]
    every = packed(examples, "mask_fix")  # loss 'all': every label counted, padding and boundaries too
    pad, first = every.roles == Role.PAD, every.roles == Role.BOUNDARY  # ground truth from the packer's roles
    assert bool((every.labels[pad | first] != IGNORE_INDEX).all()) and bool(pad.any()) and bool(first.any())
    done = packsim.audit(models(), every, objective="lm")
    assert set(done.probes["loss_coverage"].details["problems"]) == {"padding", "boundary"}, done.table()
    sft = packsim.audit(models(), packed(examples, "correct"), objective="lm")  # prompts -100: not LM
    assert "response" in sft.probes["loss_coverage"].details["problems"], sft.table()
    with pytest.raises(PacksimError, match="objective='x'"):
        packsim.audit(model, batch, objective="x")
    with pytest.raises(PacksimError, match="response_mask cannot go with it"):
        packsim.audit(model, batch, response_mask(examples), objective="lm")


def _axolotl_row(continuous: bool):
    """Axolotl's pad_to_sequence_len layout by hand: one row of two examples (BOS ... EOS, prompt labels
    -100) then a run of pad tokens with labels -100 and positions of its own (0, 1, ...), no attention_mask."""
    from packsim.core.tokenizer import BOS_ID, EOS_ID, PAD_ID

    g = torch.Generator().manual_seed(0)
    ids, pos, labels = [], [], []
    for n_prompt, n_resp in ((4, 3), (5, 4)):
        tokens = [BOS_ID] + (torch.randint(5, 40, (n_prompt + n_resp,), generator=g)).tolist() + [EOS_ID]
        ids += tokens
        pos += list(range(len(tokens)))
        labels += [IGNORE_INDEX] * (1 + n_prompt) + tokens[1 + n_prompt:]
    ids += [PAD_ID] * 6
    pos += list(range(6))
    labels += [IGNORE_INDEX] * 6
    if continuous:
        pos = list(range(len(ids)))
    return {"input_ids": torch.tensor([ids]), "position_ids": torch.tensor([pos]), "labels": torch.tensor([labels])}


def test_a_pad_run_ending_the_row_is_padding_so_the_tokens_confirm_the_examples():
    """Axolotl's padded layout: the pad run is padding (pad_token_id, not a BOS / EOS, no label counted), so
    BOS / EOS tie to the two examples and the audit is a PASS, not UNVERIFIED; the same row with positions
    that keep counting leaks (measured here: example 2 packed vs alone) and FAILs."""
    model = build_model("tiny", seed=0).eval()
    good = _axolotl_row(continuous=False)
    report = packsim.audit(model, good)
    assert report.status == "pass" and "pad token 0" in report.boundaries, report.table()
    bad = _axolotl_row(continuous=True)
    with torch.no_grad():
        packed = model(input_ids=bad["input_ids"], position_ids=bad["position_ids"]).logits[0, 9:20]
        alone = model(input_ids=bad["input_ids"][:, 9:20]).logits[0]
    assert float((packed - alone).abs().max()) > 1e-3  # ground truth: it leaks
    assert packsim.audit(model, bad).status == "fail"


def test_a_forward_that_raises_in_a_backend_is_not_measured_naming_it():
    """GPT-2 on transformers' flash path (reference kernel): transformers' get_target_dtype looks for an
    nn.Linear, GPT-2 has Conv1D, and the forward raises StopIteration (measured here). The audit answers
    NOT MEASURED naming the exception and the implementation, never the raw exception, never ok."""
    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=64, bos_token_id=1, eos_token_id=2)
    model = GPT2LMHeadModel(cfg).eval()
    model.set_attn_implementation(packsim.emulate_flash().name)
    batch = {"input_ids": torch.randint(3, VOCAB, (1, 12), generator=torch.Generator().manual_seed(0)),
             "position_ids": torch.cat([torch.arange(5), torch.arange(7)])[None]}
    try:
        with torch.no_grad():
            model(**batch)
        raised = None
    except Exception as err:  # noqa: BLE001 - the ground truth: what the forward itself does here
        raised = type(err).__name__
    if raised is None:
        pytest.skip("this transformers runs GPT-2 on the flash path: nothing to turn into a verdict")
    report = packsim.audit(model, batch, trust_boundaries=True)
    assert report.status == "not measured" and not report.ok
    forward = next(f for f in report.findings if f.name == "forward")
    assert f"raised {raised}" in forward.evidence and "packsim_reference_flash" in forward.evidence


@pytest.mark.parametrize("condition", ["positions_4rows", "positions_3d", "ones_mask_4rows"])
def test_a_multimodal_rope_batch_is_audited_against_its_ground_truth(condition):
    """Qwen2-VL's text stack with (4, 1, T) / (3, 1, T) rope rows: the ground truth (one example's tokens
    changed, the others' logits compared) computed here; the audit reads the rope rows, never raises."""
    from packsim.exhibits.hybrid_traps import build_frontier, frontier_batch

    model = build_frontier("qwen2_vl").eval()
    batch, seq = frontier_batch(condition)
    ids = batch["input_ids"]
    moved = ids.clone()
    moved[seq == 0] = (moved[seq == 0] + 1) % 90 + 3
    with torch.no_grad():
        change = (model(**{**batch, "input_ids": moved}, use_cache=False).logits
                  - model(**batch, use_cache=False).logits)[seq > 0].abs().max()
    examples = [ids[0, seq[0] == k].tolist() for k in range(int(seq.max()) + 1)]
    report = packsim.audit(model, batch, examples=examples, objective="lm", use_cache=False)
    assert report.status == ("fail" if float(change) > 1e-4 else "pass"), (float(change), report.table())


class _RefusesOtherShapes(torch.nn.Module):
    """A model whose forward accepts only the packed row's shape (a kernel with a fixed-size plan): the
    audit's first forward runs, the probes' rows of single examples raise inside the model."""

    def __init__(self, shape):
        super().__init__()
        self.inner, self.shape, self.config = packsim.build_model("tiny", seed=0), tuple(shape), None
        self.config = self.inner.config

    def forward(self, input_ids=None, **kwargs):
        if tuple(input_ids.shape) != self.shape:
            raise RuntimeError(f"this kernel was planned for {self.shape}, got {tuple(input_ids.shape)}")
        return self.inner(input_ids=input_ids, **kwargs)


def test_a_probe_forward_that_raises_in_the_model_is_not_measured_and_a_packsim_bug_still_crashes(monkeypatch):
    examples = [[1, 5, 6, 7, 2], [1, 8, 9, 2], [1, 10, 11, 12, 2]]
    batch = dict(DataCollatorWithFlattening()([{"input_ids": e} for e in examples]))
    model = _RefusesOtherShapes(batch["input_ids"].shape).eval()
    with torch.no_grad():
        model(input_ids=batch["input_ids"], position_ids=batch["position_ids"])  # the packed row runs
        with pytest.raises(RuntimeError, match="planned for"):
            model(input_ids=batch["input_ids"][:, :5])  # the ground truth: one example alone raises
    report = packsim.audit(model, batch, examples=examples, objective="lm")
    assert report.status == "not measured" and not report.ok, report.table()
    forward = next(f for f in report.findings if f.name == "forward")
    assert "a probe's forward" in forward.evidence and "raised RuntimeError: this kernel was planned" in forward.evidence

    import packsim.auditing.auditor as auditor

    planted = {}  # a bug whose frame is packsim's own file, as a fault of the audit's code would be
    exec(compile("def broken(*args, **kwargs):\n    raise TypeError('planted bug in packsim')\n",
                 auditor.__file__, "exec"), planted)
    monkeypatch.setattr(auditor, "leak_probes", planted["broken"])
    with pytest.raises(TypeError, match="planted bug"):  # packsim's own fault: a crash, never a verdict
        packsim.audit(packsim.build_model("tiny", seed=0).eval(), batch, examples=examples, objective="lm")


def test_a_stale_max_length_on_the_flash_path_is_a_fail_not_an_exception():
    """max_length_q one short of the longest example (computed here from the examples): flash-attn would
    size its grid by it and silently leave the rest uncomputed; packsim's reference kernel refuses it.
    Either way the audit answers FAIL naming flash_fields, never the kernel's exception."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).eval()
    model.set_attn_implementation(packsim.emulate_flash().name)
    examples = [[1, 5, 6, 7, 2], [1, 8, 9, 2], [1, 10, 11, 12, 13, 14, 2]]
    batch = dict(DataCollatorWithFlattening(return_flash_attn_kwargs=True)([{"input_ids": e} for e in examples]))
    longest = max(map(len, examples))
    assert packsim.audit(model, batch, examples=examples, objective="lm").status == "pass"  # the collator's own fields
    stale = {**batch, "max_length_q": longest - 1}
    with pytest.raises(PacksimError, match="max_seqlen_q"), torch.no_grad():
        model(**stale)  # the ground truth: the reference kernel refuses the forward
    report = packsim.audit(model, stale, examples=examples, objective="lm")
    assert report.status == "fail" and not report.ok and report.failed == ["flash_fields"], report.table()
    assert f"max_length_q={longest - 1}" in next(f for f in report.findings if f.name == "flash_fields").evidence


@pytest.mark.parametrize("kwargs, says", [
    ({"examples": []}, "examples=\\[\\]: pass the token ids"),
    ({"examples": "abc"}, "examples='abc'"),
    ({"examples": [["a", "b"]]}, "pass the token ids of each example"),
    ({"examples": torch.tensor([1, 5, 6, 2])}, "pass the token ids of each example"),
    ({"max_examples": 0}, "max_examples=0"),
    ({"max_examples": "3"}, "max_examples='3'"),
    ({"seed": "x"}, "seed='x': give an int"),
])
def test_bad_arguments_are_one_line_before_any_forward(kwargs, says):
    """Each was silently ignored (examples the audit could not read: the verdict then rested on the batch's
    own fields) or raised a TypeError / RuntimeError from inside the probes."""
    batch = dict(DataCollatorWithFlattening()([{"input_ids": e} for e in ([1, 5, 6, 2], [1, 8, 9, 2])]))
    with pytest.raises(PacksimError, match=says):
        packsim.audit(packsim.build_model("tiny", seed=0), batch, **kwargs)


def test_a_model_that_is_no_torch_module_is_one_line():
    with pytest.raises(PacksimError, match="takes a torch model"):
        packsim.audit("gpt2", {"input_ids": torch.ones(1, 4, dtype=torch.long)})
    import numpy as np  # numpy ints are ints to the audit

    batch = dict(DataCollatorWithFlattening()([{"input_ids": e} for e in ([1, 5, 6, 2], [1, 8, 9, 2])]))
    assert packsim.audit(packsim.build_model("tiny", seed=0), batch, seed=np.int64(3), max_examples=np.int64(2),
                         objective="lm").status in ("pass", "unverified")
