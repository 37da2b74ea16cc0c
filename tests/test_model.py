"""The packed forward through the tiny model: correct == each example alone, on every backend."""

import pytest
import torch
from toy import VOCAB, ToyExample

from packsim.core.attention_backends import available_backends
from packsim.core.batch import PackedBatch
from packsim.core.errors import PacksimError
from packsim.core.loss import token_losses
from packsim.core.model import MODEL_SIZES, build_model, forward, model_from_config, shared_model

TOL = 1e-5


def test_build_model_is_model_from_config_seeded():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = build_model("tiny", vocab_size=VOCAB, attn_implementation="sdpa", seed=3)
    config = LlamaConfig(vocab_size=VOCAB, max_position_embeddings=4096, tie_word_embeddings=True,
                         use_cache=False, pad_token_id=0, **MODEL_SIZES["tiny"])
    torch.manual_seed(3)
    by_hand = LlamaForCausalLM(config).eval()  # what build_model built before model_from_config
    ours = model_from_config(config, attn_implementation="sdpa", seed=3)
    for m in (model, ours):
        assert type(m) is LlamaForCausalLM and not m.training and m.config._attn_implementation == "sdpa"
        assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), by_hand.state_dict().values(),
                                                     strict=True))


def test_shared_model_builds_once_per_arguments():
    calls = []

    def build(name, scale=1):
        calls.append((name, scale))
        return torch.nn.Linear(scale, 1)

    a, b = shared_model(build, "x"), shared_model(build, "x")
    c = shared_model(build, "x", scale=2)
    assert a is b and c is not a and calls == [("x", 1), ("x", 2)]


def _cpu_backends(trains: bool = False):
    status = available_backends(torch.device("cpu"), torch.float32)
    return [name for name, s in status.items() if s.available and (s.trains or not trains)]


@pytest.fixture(scope="module")
def reference_model(tiny_model):
    """The same weights with transformers' own sdpa attention: an independent reference."""
    ref = build_model("tiny", vocab_size=VOCAB, attn_implementation="sdpa")
    ref.load_state_dict(tiny_model.state_dict())
    return ref


def _alone(ref, example) -> torch.Tensor:
    ids = torch.tensor([example.tokens])
    with torch.no_grad():
        return ref(input_ids=ids, use_cache=False).logits[0]  # (L, V)


def _max_diff_per_example(model, ref, examples, batch, backend):
    with torch.no_grad():
        logits = forward(model, batch, backend=backend)  # (B, T, V)
    diffs = {}
    for s in batch.segments:
        alone = _alone(ref, examples[s.example])
        diffs[s.example] = (logits[s.row, s.start:s.stop] - alone).abs().max().item()
    return diffs


@pytest.mark.parametrize("backend", _cpu_backends() + ["transformers"])
def test_correct_setup_equals_each_example_alone(tiny_model, reference_model, examples, backend):
    batch = PackedBatch.from_examples(examples, capacity=32, setup="correct")
    model = reference_model if backend == "transformers" else tiny_model
    diffs = _max_diff_per_example(model, reference_model, examples, batch, backend)
    assert max(diffs.values()) <= TOL, f"{backend}: packed != alone {diffs}"


@pytest.mark.parametrize("backend", _cpu_backends() + ["transformers"])
def test_buggy_setup_leaks_into_later_examples(tiny_model, reference_model, examples, backend):
    batch = PackedBatch.from_examples(examples, capacity=32, setup="buggy")
    model = reference_model if backend == "transformers" else tiny_model
    diffs = _max_diff_per_example(model, reference_model, examples, batch, backend)
    firsts = {s.example for s in batch.segments if s.start == 0}
    later = [d for i, d in diffs.items() if i not in firsts]
    assert later and min(later) > 1e-3, f"{backend}: later examples should see earlier ones {diffs}"
    assert max(diffs[i] for i in firsts) <= TOL, "the first example of a row has nothing to leak from"


def test_padded_setup_equals_each_example_alone(tiny_model, reference_model, examples):
    batch = PackedBatch.from_examples(examples, capacity=32, setup="padded")
    diffs = _max_diff_per_example(tiny_model, reference_model, examples, batch, "auto")
    assert max(diffs.values()) <= TOL


def _gradient_leak(model, batch, backend="blocked"):
    """|d loss_j / d embeds_i| summed, for every pair (i, j) of segments in the same row."""
    embeds = model.get_input_embeddings()(batch.input_ids).detach().requires_grad_(True)
    per_tok = token_losses(forward(model, batch, backend=backend, inputs_embeds=embeds), batch.input_ids)
    leaks = {}
    for j, sj in enumerate(batch.segments):
        loss_j = per_tok[sj.row, sj.start:sj.stop - 1].sum()  # predictions made inside example j
        (grad,) = torch.autograd.grad(loss_j, embeds, retain_graph=True)
        for i, si in enumerate(batch.segments):
            if i != j and si.row == sj.row:
                leaks[(i, j)] = grad[si.row, si.start:si.stop].abs().sum().item()
    return leaks


def test_gradients_do_not_cross_boundaries_under_correct(tiny_model, examples):
    leaks = _gradient_leak(tiny_model, PackedBatch.from_examples(examples, 32, setup="correct"))
    assert leaks and all(v == 0.0 for v in leaks.values()), leaks


def test_gradients_cross_boundaries_under_buggy(tiny_model, examples):
    batch = PackedBatch.from_examples(examples, 32, setup="buggy")
    leaks = _gradient_leak(tiny_model, batch)
    forward_pairs = [v for (i, j), v in leaks.items() if i < j]  # segments are in row order
    backward_pairs = [v for (i, j), v in leaks.items() if i > j]
    assert forward_pairs and min(forward_pairs) > 0, "later examples get gradient from earlier ones"
    assert all(v == 0.0 for v in backward_pairs), "causal: nothing flows from later to earlier"


def test_out_of_vocab_ids_fail_before_the_model_runs(tiny_model):
    batch = PackedBatch.from_examples([ToyExample((1, 5, VOCAB + 3, 2), 2)], 16, setup="correct")
    with pytest.raises(PacksimError, match="outside the model's vocabulary"):
        forward(tiny_model, batch)


def test_transformers_backend_needs_a_native_attention_model(tiny_model, examples):
    batch = PackedBatch.from_examples(examples, 32, setup="correct")
    with pytest.raises(PacksimError, match="attn_implementation='eager'"):
        forward(tiny_model, batch, backend="transformers")


def test_unknown_model_size_is_explained():
    with pytest.raises(PacksimError, match="unknown model size 'huge'"):
        build_model("huge", vocab_size=VOCAB)


def test_forward_restores_the_model_attention(reference_model, examples):
    batch = PackedBatch.from_examples(examples, 32, setup="correct")
    with torch.no_grad():
        forward(reference_model, batch, backend="blocked")
    assert reference_model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("impl", ["eager", "flex_attention"])
def test_transformers_backend_isolates_on_other_attention_implementations(reference_model, examples, impl):
    """eager gets a 4D additive mask, flex_attention a BlockMask (a 4D tensor crashes compiled CPU flex)."""
    model = build_model("tiny", vocab_size=VOCAB, attn_implementation=impl)
    model.load_state_dict(reference_model.state_dict())
    batch = PackedBatch.from_examples(examples, 32, setup="correct")
    diffs = _max_diff_per_example(model, reference_model, examples, batch, "transformers")
    assert max(diffs.values()) <= TOL, diffs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["flash", "torch_varlen", "flex", "blocked"])
def test_gpu_backends_in_bf16_match_the_fp32_reference(reference_model, examples, backend):
    status = available_backends(torch.device("cuda"), torch.bfloat16)[backend]
    if not status.available:
        pytest.skip(status.reason)
    model = build_model("tiny", vocab_size=VOCAB)
    model.load_state_dict(reference_model.state_dict())
    model.to(device="cuda", dtype=torch.bfloat16)
    for setup, leaks in (("correct", False), ("buggy", True)):
        batch = PackedBatch.from_examples(examples, 32, setup=setup).to("cuda")
        with torch.no_grad():
            logits = forward(model, batch, backend=backend).float().cpu()
        for s in batch.segments:
            diff = (logits[s.row, s.start:s.stop] - _alone(reference_model, examples[s.example])).abs().max()
            if leaks and s.start > 0:
                assert diff > 0.1, f"{backend} bf16: buggy later example should leak ({diff:.3g})"
            else:
                assert diff < 0.05, f"{backend} bf16: {setup} example {s.example} off by {diff:.3g}"


def test_packsim_attention_accepts_a_transformers_collator_batch(tiny_model, reference_model, examples):
    """model(**DataCollatorWithFlattening output) isolates examples on the registered 'packsim' path."""
    from transformers import DataCollatorWithFlattening

    features = [{"input_ids": list(e.tokens)} for e in examples]
    flat = DataCollatorWithFlattening(return_flash_attn_kwargs=True)(features, return_tensors="pt")
    slim = {k: flat[k] for k in ("input_ids", "position_ids")}  # boundaries from position_ids alone
    for inputs in (flat, slim):
        with torch.no_grad():
            logits = tiny_model(**inputs, use_cache=False).logits[0]  # (N, V)
        start = 0
        for e in examples:
            stop = start + len(e.tokens)
            assert (logits[start:stop] - _alone(reference_model, e)).abs().max() <= TOL
            start = stop


def test_packsim_attention_rejects_segments_that_do_not_cover_the_batch(tiny_model):
    ids = torch.tensor([[1, 5, 6, 2, 1, 7, 2]])
    with pytest.raises(PacksimError, match="must cover every token"):
        tiny_model(input_ids=ids, cu_seq_lens_q=torch.tensor([0, 4], dtype=torch.int32), use_cache=False)


def test_attention_maps_show_the_leak_only_under_the_causal_mask(examples):
    from packsim.core.attention_share import outside_share
    from packsim.core.model import attention_maps

    model = build_model("tiny", vocab_size=VOCAB, seed=0)
    for setup in ("buggy", "correct"):
        batch = PackedBatch.from_examples(examples, 32, setup=setup)
        attn = attention_maps(model, batch)  # (L, B, H, T, T)
        L, B, H, T, _ = attn.shape
        assert (L, H) == (2, 4) and (B, T) == batch.shape
        assert torch.allclose(attn.sum(-1), torch.ones(L, B, H, T), atol=1e-5)
        share = outside_share(attn, batch.seq_ids)  # (L, B, H, T)
        first = batch.seq_ids == batch.seq_ids[:, :1]  # tokens of each row's first example
        assert float(share.permute(1, 3, 0, 2)[first].abs().max()) == 0.0
        later = float(share.permute(1, 3, 0, 2)[~first & batch.real_mask].max())
        assert (later > 0.05) if setup == "buggy" else (later == 0.0)
