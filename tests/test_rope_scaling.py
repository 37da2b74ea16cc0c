"""packsim.exhibits.rope_scaling: positions that keep counting change nothing under default RoPE (to round-off),
and change every example under dynamic and longrope RoPE. Ground truth: the scaled frequencies computed here
from the formulas (not from transformers), put into a default-RoPE model that runs each example alone."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from packsim.exhibits import rope_scaling as rs


@functools.cache
def _weights() -> dict:
    from packsim.experiment.committed_models import load_committed_model

    return load_committed_model("correct").state_dict()  # trained: sharp attention, position effects show


@functools.cache
def _examples() -> tuple:
    from packsim.core.data import make_dataset

    return tuple(tuple(ex.tokens) for ex in make_dataset(12, 0, seed=0)[0])  # 195 tokens, about 3x ORIGINAL_CONTEXT


DIM = 128 // 4  # the tiny size's head dim


def _alone_with(inv_freq: torch.Tensor, scale: float, exs) -> list[torch.Tensor]:
    """Logits (L, V) of each example alone on a default-RoPE model with the given frequencies and cos/sin scale."""
    model = rs.rope_model("default", _weights())
    for module in model.modules():
        if type(module).__name__.endswith("RotaryEmbedding"):
            module.inv_freq = inv_freq.clone()
            module.original_inv_freq = inv_freq.clone()
            module.attention_scaling = scale
    with torch.no_grad():
        return [model(input_ids=torch.tensor([ids])).logits[0] for ids in exs]


@functools.cache
def _table() -> rs.RopeTable:
    return rs.rope_table(_weights(), [list(e) for e in _examples()])


def _worst(a, b) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def _packed(model, exs, continuous: bool) -> list[torch.Tensor]:
    lengths = [len(e) for e in exs]
    seq = torch.repeat_interleave(torch.arange(len(exs)), torch.tensor(lengths))
    allowed = (seq[:, None] == seq[None, :]) & torch.ones(len(seq), len(seq), dtype=torch.bool).tril()
    dtype = next(model.parameters()).dtype
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[None, None]
    pos = torch.arange(len(seq))[None] if continuous else torch.cat([torch.arange(n) for n in lengths])[None]
    with torch.no_grad():
        out = model(input_ids=torch.tensor([[t for e in exs for t in e]]), position_ids=pos, attention_mask=mask)
    return list(out.logits[0].split(lengths))


def _ntk_inv_freq(seq_len: int) -> torch.Tensor:
    """Dynamic NTK by its formula: base * (factor * L / L0 - (factor - 1)) ** (d / (d - 2)), from L > L0 on."""
    base = rs.THETA * (rs.FACTOR * seq_len / rs.ORIGINAL_CONTEXT - (rs.FACTOR - 1)) ** (DIM / (DIM - 2))
    return 1.0 / base ** (torch.arange(0, DIM, 2).double() / DIM).float()


def test_dynamic_packed_with_continuous_positions_is_every_example_at_the_rescaled_base():
    exs = [list(e) for e in _examples()]
    n = sum(len(e) for e in exs)
    packed = _packed(rs.rope_model("dynamic", _weights()), exs, continuous=True)
    inv = _ntk_inv_freq(n)
    assert _worst(packed, _alone_with(inv, 1.0, exs)) < 1e-3  # the rescaled base explains it
    table = _table()
    cell = table.cell("dynamic", "continuous_vs_restart")
    assert cell.status == "CHANGES" and cell.first > 1.0, cell  # the first example too: its positions never moved
    assert table.cell("dynamic", "restart_vs_alone").status == "unchanged"


def test_longrope_packed_past_the_original_context_switches_every_example_to_the_long_factors():
    exs = [list(e) for e in _examples()]
    packed = _packed(rs.rope_model("longrope", _weights()), exs, continuous=True)
    half = DIM // 2
    long = torch.tensor([rs.FACTOR ** (i / (half - 1)) for i in range(half)])  # 1 .. FACTOR
    inv = 1.0 / (long * rs.THETA ** (torch.arange(0, DIM, 2).float() / DIM))
    scale = math.sqrt(1 + math.log(rs.FACTOR) / math.log(rs.ORIGINAL_CONTEXT))  # LongRoPE's default attention factor
    assert _worst(packed, _alone_with(inv, scale, exs)) < 1e-3
    short = 1.0 / rs.THETA ** (torch.arange(0, DIM, 2).float() / DIM)  # short_factor 1: the default frequencies
    restart = _packed(rs.rope_model("longrope", _weights()), exs, continuous=False)
    assert _worst(restart, _alone_with(short, scale, exs)) < 1e-5
    assert _table().cell("longrope", "continuous_vs_restart").first > 1.0


def test_a_long_neighbour_rescales_the_short_examples_even_with_restarting_positions():
    exs = [list(e) for e in _examples()]
    long = torch.randint(3, 40, (rs.ORIGINAL_CONTEXT + 16,), generator=torch.Generator().manual_seed(7)).tolist()
    packed = _packed(rs.rope_model("dynamic", _weights()), exs + [long], continuous=False)[:-1]
    inv = _ntk_inv_freq(len(long))  # the batch's largest position + 1: the long example's length
    assert _worst(packed, _alone_with(inv, 1.0, exs)) < 1e-4
    table = _table()
    assert table.cell("dynamic", "long_neighbour_vs_alone").worst > 1.0
    assert table.cell("default", "long_neighbour_vs_alone").status == "unchanged"


def test_default_rope_is_invariant_to_round_off_only():
    exs = [list(e) for e in _examples()]
    table = _table()
    fp32 = table.cell("default", "continuous_vs_restart", "float32")
    assert fp32.first == 0.0 and fp32.worst < 1e-3  # the angle pos * inv_freq in fp32: rounding grows with pos
    assert table.cell("default", "restart_vs_alone", "float32").status == "unchanged"
    bf16 = table.cell("default", "continuous_vs_restart", "bfloat16")
    assert bf16.first == 0.0 and fp32.worst < bf16.worst < 1.0  # cos / sin rounded to bf16: larger, still round-off
    # independent: in float64 the layout is exact (restart vs alone ~1e-14), yet continuous vs restart stays at
    # fp32's size: the rotary computes the angle position * inv_freq in fp32 whatever the model's dtype
    model = rs.rope_model("default", _weights(), torch.float64)
    a, b = (_packed(model, exs, continuous=c) for c in (False, True))
    with torch.no_grad():
        alone = [model(input_ids=torch.tensor([e])).logits[0] for e in exs]
    assert _worst(a, alone) < 1e-12
    shift = _worst(a, b)
    assert fp32.worst / 2 < shift < fp32.worst * 2, (shift, fp32.worst)


def test_dynamic_rope_keeps_the_frequencies_of_the_longest_call_so_far():
    """The statefulness the module docstring names (and orders its forwards for): after a call with
    seq_len 195, an 80-token call keeps the 195 frequencies; a fresh model recomputes them for 80."""
    ids = torch.randint(3, 40, (1, rs.ORIGINAL_CONTEXT + 16), generator=torch.Generator().manual_seed(1))
    fresh = rs.rope_model("dynamic", _weights())
    with torch.no_grad():
        want = fresh(input_ids=ids).logits
        used = rs.rope_model("dynamic", _weights())
        used(input_ids=torch.randint(3, 40, (1, 195), generator=torch.Generator().manual_seed(2)))
        after = used(input_ids=ids).logits
    assert float((after - want).abs().max()) > 0.1
    exs = [list(e) for e in _examples()[:4]]
    model = rs.rope_model("dynamic", _weights())
    got = rs.rope_changes(model, exs)
    model(input_ids=torch.randint(3, 40, (1, 300), generator=torch.Generator().manual_seed(3)))  # a long call first
    assert rs.rope_changes(model, exs) == got  # the module's order gives every call its own frequencies


def test_the_table_prints_one_line_per_rope_type_and_dtype():
    lines = _table().text().splitlines()
    assert len(lines) == 1 + len(rs.ROPE_TYPES) * 2, lines
    assert lines[0].startswith("rope_type") and "continuous vs restart" in lines[0]


def test_unknown_rope_type_and_longrope_past_its_context_are_refused():
    from packsim.core.errors import PacksimError

    with pytest.raises(PacksimError, match="unknown rope_type"):
        rs.rope_config("yarn")
    with pytest.raises(PacksimError, match="past this longrope config"):
        rs.rope_changes(rs.rope_model("longrope"), [list(range(3, 40)) * 3] * 3)
