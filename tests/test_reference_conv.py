"""packsim.reference.conv: the causal conv1d stops at every seq_idx change (packed == each
segment alone from zero), equals transformers' own torch fallback on one sequence, and the
fallback's packed crossing is the case it must catch."""

import pytest
import torch
import torch.nn.functional as F

from packsim.core.errors import PacksimError
from packsim.core.upstream.hub_kernels import torch_function
from packsim.reference.conv import REFERENCE_KERNEL, causal_conv1d_fn, causal_conv1d_update

TOL = 1e-5


def _fallbacks():
    """transformers' torch functions behind its kernel wrappers (models/bamba/modeling_bamba.py)."""
    from transformers.models.bamba import modeling_bamba as mb

    return torch_function(mb.causal_conv1d_fn), torch_function(mb.causal_conv1d_update)


def _data(B=2, D=6, T=24, W=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, D, T, generator=g), torch.randn(D, W, generator=g), torch.randn(D, generator=g)


def _seq(rows):
    """seq_idx (B, T) int32 from each row's segment lengths."""
    return torch.stack([torch.repeat_interleave(torch.arange(len(r)), torch.tensor(r)) for r in rows]).int()


def _alone(x, w, b, rows, activation):
    """Each segment of each row convolved alone from a zero state, put back in place: (B, D, T)."""
    return torch.stack([torch.cat([causal_conv1d_fn(p[None], w, b, activation=activation)[0]
                                   for p in x[i].split(r, dim=-1)], dim=-1) for i, r in enumerate(rows)])


@pytest.mark.parametrize("W, activation, bias", [(4, "silu", True), (3, None, False), (2, "swish", True)])
def test_packed_row_equals_each_segment_alone(W, activation, bias):
    x, w, b = _data(W=W)
    b = b if bias else None
    rows = [[5, 1, 11, 7], [12, 3, 9]]  # a 1-token segment; the two rows cut differently
    packed = causal_conv1d_fn(x, w, b, seq_idx=_seq(rows), activation=activation)
    assert packed.shape == x.shape
    assert (packed - _alone(x, w, b, rows, activation)).abs().max() <= TOL


def test_matches_transformers_fallback_on_one_sequence_and_catches_its_crossing():
    fallback, _ = _fallbacks()
    x, w, b = _data()
    for activation in (None, "silu"):
        assert (causal_conv1d_fn(x, w, b, activation=activation) - fallback(x, w, b, activation=activation)
                ).abs().max() <= TOL
    rows = [[5, 1, 11, 7], [12, 3, 9]]
    crossing = fallback(x, w, b, activation="silu", seq_idx=_seq(rows))  # the fallback ignores seq_idx
    assert (crossing - _alone(x, w, b, rows, "silu")).abs().max() > 1e-3


def test_initial_and_final_states_continue_a_sequence():
    x, w, b = _data(W=4)
    head, tail = x[..., :9], x[..., 9:]
    full = causal_conv1d_fn(x, w, b, activation="silu")
    first, state = causal_conv1d_fn(head, w, b, activation="silu", return_final_states=True)
    assert torch.equal(state, head[..., -3:])
    out = torch.empty_like(state)
    second, written = causal_conv1d_fn(tail, w, b, initial_states=state, activation="silu",
                                       return_final_states=True, final_states_out=out)
    assert written is out and torch.equal(out, x[..., -3:])
    assert (torch.cat([first, second], -1) - full).abs().max() <= TOL


def test_update_steps_equal_the_full_conv_and_the_fallback():
    _, fallback_update = _fallbacks()
    x, w, b = _data(W=4)
    full = causal_conv1d_fn(x, w, b, activation="silu")
    for S in (3, 4):  # the state may hold more than W-1 columns (transformers' caches hold W)
        mine, theirs = torch.zeros(2, 6, S), torch.zeros(2, 6, S)
        steps = []
        for t in range(x.shape[-1]):
            y = causal_conv1d_update(x[..., t], mine, w, b, activation="silu")  # (B, D): the 2-D form
            y_ref = fallback_update(x[..., t:t + 1], theirs, w, b, activation="silu")  # (B, D, 1)
            assert (y - y_ref[..., 0]).abs().max() <= TOL
            steps.append(y)
        assert (torch.stack(steps, -1) - full).abs().max() <= TOL
        assert torch.equal(mine, x[..., -S:]) and torch.equal(mine, theirs)
    state = torch.zeros(2, 6, 3)
    chunked = torch.cat([causal_conv1d_update(p, state, w, b) for p in x.split([10, 14], -1)], -1)
    assert (chunked - causal_conv1d_fn(x, w, b)).abs().max() <= TOL


def test_float64_inputs_are_convolved_in_float64():
    x, w, b = (t.double() for t in _data())
    rows = [[5, 1, 11, 7], [12, 3, 9]]
    packed = causal_conv1d_fn(x, w, b, seq_idx=_seq(rows), activation="silu")
    want = F.silu(F.conv1d(F.pad(x[:1, :, :5], (3, 0)), w[:, None], b, groups=x.shape[1]))  # segment 0 of row 0
    assert packed.dtype == torch.float64 and (packed[:1, :, :5] - want).abs().max() <= 1e-12


def test_dtype_in_dtype_out():
    x, w, b = _data()
    out = causal_conv1d_fn(x.to(torch.bfloat16), w, b, activation="silu")
    assert out.dtype == torch.bfloat16
    assert (out.float() - F.silu(causal_conv1d_fn(x.to(torch.bfloat16).float(), w, b))).abs().max() < 2e-2


def test_bad_input_says_what_to_pass():
    x, w, b = _data()
    with pytest.raises(PacksimError, match="initial_states"):
        causal_conv1d_fn(x, w, b, seq_idx=_seq([[24], [24]]), initial_states=torch.zeros(2, 6, 3))
    with pytest.raises(PacksimError, match="seq_idx"):
        causal_conv1d_fn(x, w, b, seq_idx=torch.zeros(2, 5, dtype=torch.int32))
    with pytest.raises(PacksimError, match="activation"):
        causal_conv1d_fn(x, w, b, activation="gelu")
    with pytest.raises(PacksimError, match="weight"):
        causal_conv1d_fn(x, w[:3], b)
    with pytest.raises(PacksimError, match="conv_state"):
        causal_conv1d_update(x[..., 0], torch.zeros(2, 6, 2), w, b)
    with pytest.raises(PacksimError, match="cache_seqlens"):
        causal_conv1d_update(x[..., 0], torch.zeros(2, 6, 3), w, b, cache_seqlens=torch.zeros(2))


def test_says_it_is_the_reference_kernel():
    for fn in (causal_conv1d_fn, causal_conv1d_update):
        assert fn.__packsim_kernel__ == REFERENCE_KERNEL == "reference kernel (packsim, pure torch)"
        assert REFERENCE_KERNEL in " ".join(fn.__doc__.split())
