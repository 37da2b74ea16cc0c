"""packsim.exhibits.bf16_roundoff: in bf16 a correct pack differs from each example alone by round-off, while the
perturbation probe (same layout) reads exactly 0; a leak moves the probe by far more. Ground truth: the
test's own forwards, and the dtype's spacing from torch.nextafter."""

from __future__ import annotations

import functools

import torch

from packsim.exhibits import bf16_roundoff as br


@functools.cache
def _weights() -> dict:
    from packsim.experiment.committed_models import load_committed_model

    return load_committed_model("correct").state_dict()


@functools.cache
def _examples() -> tuple:
    from packsim.core.data import make_dataset

    return tuple(tuple(ex.tokens) for ex in make_dataset(12, 0, seed=0)[0])


@functools.cache
def _rows() -> dict:
    return {(r.dtype, r.call): r for r in br.roundoff_rows(_weights(), [list(e) for e in _examples()])}


def test_spacing_is_the_gap_to_the_next_number_of_the_dtype():
    x = torch.tensor([0.3, 1.0, 1.7, 13.5, -13.5, 100.0, 1e-3])
    for dtype in (torch.bfloat16, torch.float32):
        xs = x.to(dtype).abs()
        gap = (torch.nextafter(xs, torch.tensor(float("inf"), dtype=dtype)) - xs).float()
        assert torch.equal(br.spacing(xs, dtype), gap), (dtype, br.spacing(xs, dtype), gap)


def _own_packed_and_probe(dtype, leaky: bool):
    from packsim.core.model import build_model

    model = build_model("tiny", attn_implementation="sdpa", seed=0)
    model.load_state_dict(_weights(), strict=False)
    model = model.to(dtype).eval()
    exs = [list(e) for e in _examples()]
    ids = torch.tensor([[t for e in exs for t in e]])  # (1, T)
    pos = torch.tensor([[p for e in exs for p in range(len(e))]])  # restarting
    seq = torch.tensor([i for i, e in enumerate(exs) for _ in e])
    extra = {"attention_mask": torch.ones_like(ids)} if leaky else {}
    with torch.no_grad():
        base = model(input_ids=ids, position_ids=pos, use_cache=False, **extra).logits[0].float()
        alone = torch.cat([model(input_ids=torch.tensor([e]), use_cache=False).logits[0].float() for e in exs])
        probe = 0.0
        for j in range(len(exs)):
            other = ids.clone()
            other[0, seq == j] = (other[0, seq == j] - 3 + 11) % (model.config.vocab_size - 3) + 3
            moved = model(input_ids=other, position_ids=pos, use_cache=False, **extra).logits[0].float()
            probe = max(probe, float((moved - base).abs()[seq != j].max()))
    return float((base - alone).abs().max()), probe


def test_a_correct_bf16_pack_differs_from_alone_yet_the_probe_reads_exactly_zero():
    alone, probe = _own_packed_and_probe(torch.bfloat16, leaky=False)
    assert alone > 1e-3 and probe == 0.0, (alone, probe)  # different layout, different rounding; same layout, none
    row = _rows()["bfloat16", "correct"]
    assert row.alone == alone and row.probe == 0.0
    assert 0.5 < row.steps < 10  # a few bf16 steps at the logits' scale: round-off
    assert row.audit_status == "pass"
    fp32 = _rows()["float32", "correct"]
    assert fp32.alone < 1e-5 and fp32.probe == 0.0 and fp32.alone < row.alone / 100


def test_a_leak_in_bf16_moves_the_probe_by_far_more_than_round_off():
    alone, probe = _own_packed_and_probe(torch.bfloat16, leaky=True)
    assert probe > 1.0, probe
    row = _rows()["bfloat16", "all-ones mask"]
    assert row.probe > 1.0 and row.steps > 100 and row.audit_status == "fail"  # (other replacement tokens than ours)
    text = br.roundoff_text(list(_rows().values()))
    assert len(text.splitlines()) == 1 + 4 and "perturbation probe" in text.splitlines()[0]
