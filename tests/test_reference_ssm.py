"""packsim.reference.ssm: the Mamba2 SSD scan against a token-by-token recurrence written here,
its state reset at every seq_idx change (packed == each segment alone from zero), transformers'
own torch fallback on one sequence, and the fallback's packed crossing as the case to catch."""

import pytest
import torch
import torch.nn.functional as F

from packsim.core.errors import PacksimError
from packsim.core.upstream.hub_kernels import torch_function
from packsim.reference.conv import REFERENCE_KERNEL, causal_conv1d_fn
from packsim.reference.ssm import mamba_chunk_scan_combined, mamba_split_conv1d_scan_combined

TOL = 1e-5
b, T, h, p, g, n = 2, 29, 4, 3, 2, 5  # T: no multiple of the chunk (8)
ROWS = [[5, 11, 1, 12], [3, 2, 16, 8]]  # segments across chunk edges, several in one chunk, a 1-token one


def _data(seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    return dict(x=r(b, T, h, p), dt=r(b, T, h), A=-torch.rand(h, generator=gen) - 0.2, B=r(b, T, g, n),
                C=r(b, T, g, n), D=r(h), dt_bias=r(h), z=r(b, T, h, p))


def _seq(rows):
    return torch.stack([torch.repeat_interleave(torch.arange(len(r)), torch.tensor(r)) for r in rows]).int()


def _recurrence(x, dt, A, B, C, D=None, z=None, dt_bias=None, h0=None):
    """Ground truth, one token at a time: h = exp(dt A) h + dt x B^T, y = h C + D x (times silu z)."""
    dt = F.softplus(dt + dt_bias) if dt_bias is not None else F.softplus(dt)
    Bh, Ch = (t.repeat_interleave(h // g, dim=2) for t in (B, C))  # (b, T, h, n)
    state = torch.zeros(x.shape[0], h, p, n, dtype=x.dtype) if h0 is None else h0.clone()
    ys = []
    for t in range(x.shape[1]):
        state = torch.exp(dt[:, t] * A)[:, :, None, None] * state \
            + dt[:, t, :, None, None] * x[:, t, :, :, None] * Bh[:, t, :, None, :]
        y = (state * Ch[:, t, :, None, :]).sum(-1)  # (b, h, p)
        if D is not None:
            y = y + x[:, t] * (D[:, None] if D.dim() == 1 else D)
        ys.append(y)
    y = torch.stack(ys, 1)
    return (y * F.silu(z) if z is not None else y), state


def _scan(d, **kw):
    return mamba_chunk_scan_combined(d["x"], d["dt"], d["A"], d["B"], d["C"], 8, dt_softplus=True, **kw)


def test_matches_the_token_by_token_recurrence():
    d = _data()
    h0 = torch.randn(b, h, p, n)
    for D in (d["D"], torch.randn(h, p)):  # D as (h,) and as (h, p)
        y, final = _scan(d, D=D, z=d["z"], dt_bias=d["dt_bias"], initial_states=h0, return_final_states=True)
        want, want_final = _recurrence(d["x"], d["dt"], d["A"], d["B"], d["C"], D, d["z"], d["dt_bias"], h0)
        assert (y - want).abs().max() <= TOL and (final - want_final).abs().max() <= TOL


def test_outputs_are_contiguous_for_callers_that_view_them():
    """transformers' mixers .view the scan's output (Falcon-H1's in 5.16.1: modeling_falcon_h1.py)."""
    d = _data()
    assert _scan(d, seq_idx=_seq([[10, 19], [29]])).is_contiguous()  # no D, no z: the scan's own layout
    short = {k: v[:, :5] if v.dim() > 1 and v.shape[1] == T else v for k, v in d.items()}  # under one chunk
    assert _scan(short, D=d["D"], z=short["z"]).is_contiguous()


def test_float64_inputs_are_scanned_in_float64():
    """A float64 audit holds the kernel to float64 round-off: fp32 accumulation would miss by ~1e-7."""
    d = {k: v.double() for k, v in _data().items()}
    y = _scan(d, D=d["D"], z=d["z"], dt_bias=d["dt_bias"])
    want, _ = _recurrence(d["x"], d["dt"], d["A"], d["B"], d["C"], d["D"], d["z"], d["dt_bias"])
    assert y.dtype == torch.float64 and (y - want).abs().max() <= 1e-10


def test_packed_row_equals_each_segment_alone_and_the_fallback_crosses():
    from transformers.models.bamba import modeling_bamba as mb

    d = _data()
    seq = _seq(ROWS)
    y, final = _scan(d, D=d["D"], z=d["z"], dt_bias=d["dt_bias"], seq_idx=seq, return_final_states=True)
    alone, last_state = torch.zeros_like(y), []
    for i, row in enumerate(ROWS):
        start = 0
        for L in row:
            part = slice(start, start + L)
            want, state = _recurrence(*(d[k][i:i + 1, part] for k in ("x", "dt")), d["A"], d["B"][i:i + 1, part],
                                      d["C"][i:i + 1, part], d["D"], d["z"][i:i + 1, part], d["dt_bias"])
            alone[i, part] = want[0]
            start += L
        last_state.append(state[0])
    assert (y - alone).abs().max() <= TOL
    assert (final - torch.stack(last_state)).abs().max() <= TOL
    # the case it must catch: without seq_idx (and in transformers' fallback, which ignores it) the state crosses
    assert (_scan(d, D=d["D"], z=d["z"], dt_bias=d["dt_bias"]) - alone).abs().max() > 1e-3
    crossing = torch_function(mb.mamba2_chunk_scan)(d["x"], d["dt"], d["A"], d["B"], d["C"], 8, D=d["D"],
                                                dt_bias=d["dt_bias"], dt_softplus=True, seq_idx=seq)
    assert (crossing * F.silu(d["z"]) - alone).abs().max() > 1e-3


def test_varlen_states_are_each_sequences_last_state():
    d = _data()
    cu = torch.tensor([0, 5, 16, 17, 29])
    y, varlen = _scan({k: v[:1] if v.dim() > 1 else v for k, v in d.items()}, D=d["D"], dt_bias=d["dt_bias"],
                      seq_idx=_seq(ROWS[:1]), cu_seqlens=cu, return_varlen_states=True)
    for s in range(4):
        part = slice(int(cu[s]), int(cu[s + 1]))
        _, state = _recurrence(d["x"][:1, part], d["dt"][:1, part], d["A"], d["B"][:1, part], d["C"][:1, part],
                               dt_bias=d["dt_bias"])
        assert (varlen[s] - state[0]).abs().max() <= TOL


def test_initial_state_enters_only_the_rows_first_example():
    d = _data()
    h0 = torch.randn(b, h, p, n)
    y = _scan(d, dt_bias=d["dt_bias"], seq_idx=_seq(ROWS), initial_states=h0)
    plain = _scan(d, dt_bias=d["dt_bias"], seq_idx=_seq(ROWS))
    for i, row in enumerate(ROWS):
        first = slice(0, row[0])
        want, _ = _recurrence(d["x"][i:i + 1, first], d["dt"][i:i + 1, first], d["A"], d["B"][i:i + 1, first],
                              d["C"][i:i + 1, first], dt_bias=d["dt_bias"], h0=h0[i:i + 1])
        assert (y[i, first] - want[0]).abs().max() <= TOL
        assert torch.equal(y[i, row[0]:], plain[i, row[0]:])


def test_matches_transformers_fallback_on_one_sequence():
    from transformers.models.bamba import modeling_bamba as mb

    d = _data()
    h0 = torch.randn(b, h, p, n)
    for limit in ((0.0, float("inf")), (0.05, 0.9)):
        kw = dict(D=d["D"], dt_bias=d["dt_bias"], dt_softplus=True, dt_limit=limit, initial_states=h0,
                  return_final_states=True)
        ref, ref_final = torch_function(mb.mamba2_chunk_scan)(d["x"], d["dt"], d["A"], d["B"], d["C"], 8, **kw)
        y, final = mamba_chunk_scan_combined(d["x"], d["dt"], d["A"], d["B"], d["C"], 8, **kw)
        assert (y - ref).abs().max() <= TOL and (final - ref_final).abs().max() <= TOL


def _fused_inputs(seed=0, d_mlp=0):
    gen = torch.Generator().manual_seed(seed)
    dim, conv_dim = h * p, h * p + 2 * g * n
    zxbcdt = torch.randn(b, T, 2 * d_mlp + dim + conv_dim + h, generator=gen)
    return dict(zxbcdt=zxbcdt, conv1d_weight=torch.randn(conv_dim, 4, generator=gen),
                conv1d_bias=torch.randn(conv_dim, generator=gen), dt_bias=torch.randn(h, generator=gen),
                A=-torch.rand(h, generator=gen) - 0.2, D=torch.randn(h, generator=gen)), dim, conv_dim


@pytest.mark.parametrize("norm_before_gate", [False, True])
def test_fused_mixer_equals_its_parts(norm_before_gate):
    """split -> conv1d -> scan -> gated RMSNorm (transformers' BambaRMSNormGated) -> out projection."""
    from transformers.models.bamba.modeling_bamba import BambaRMSNormGated

    f, dim, conv_dim = _fused_inputs()
    weight, out_w, out_b = torch.randn(dim), torch.randn(7, dim), torch.randn(7)
    seq = _seq(ROWS)
    out = mamba_split_conv1d_scan_combined(**f, chunk_size=8, seq_idx=seq, rmsnorm_weight=weight, rmsnorm_eps=1e-5,
                                           outproj_weight=out_w, outproj_bias=out_b, headdim=p, ngroups=g,
                                           norm_before_gate=norm_before_gate)
    z, xBC, dt = f["zxbcdt"].split([dim, conv_dim, h], dim=-1)
    xBC = causal_conv1d_fn(xBC.transpose(1, 2), f["conv1d_weight"], f["conv1d_bias"], seq_idx=seq,
                           activation="silu").transpose(1, 2)
    x, B, C = xBC.split([dim, g * n, g * n], dim=-1)
    y = mamba_chunk_scan_combined(x.reshape(b, T, h, p), dt, f["A"], B.reshape(b, T, g, n), C.reshape(b, T, g, n),
                                  8, D=f["D"], dt_bias=f["dt_bias"], dt_softplus=True, seq_idx=seq).reshape(b, T, dim)
    norm = BambaRMSNormGated(dim, group_size=dim // g, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(weight)
        normed = norm(y, z) if not norm_before_gate else norm(y) * F.silu(z)
    assert (out - F.linear(normed, out_w, out_b)).abs().max() <= 1e-4


def test_fused_mixer_packed_equals_each_segment_alone():
    f, dim, _ = _fused_inputs(d_mlp=3)
    seq = _seq(ROWS)
    out = mamba_split_conv1d_scan_combined(**f, chunk_size=8, seq_idx=seq, headdim=p, ngroups=g)
    assert out.shape == (b, T, 3 + dim)
    for i, row in enumerate(ROWS):
        start = 0
        for L in row:
            part = dict(f, zxbcdt=f["zxbcdt"][i:i + 1, start:start + L])
            alone = mamba_split_conv1d_scan_combined(**part, chunk_size=8, headdim=p, ngroups=g)
            assert (out[i:i + 1, start:start + L] - alone).abs().max() <= TOL
            start += L


def test_bad_input_says_what_to_pass():
    d = _data()
    with pytest.raises(PacksimError, match="seq_idx"):
        _scan(d, seq_idx=torch.zeros(b, 3, dtype=torch.int32))
    with pytest.raises(PacksimError, match="B and C"):
        mamba_chunk_scan_combined(d["x"], d["dt"], d["A"], d["B"][:, :, :1, :3], d["C"], 8)
    with pytest.raises(PacksimError, match="cu_seqlens"):
        _scan(d, return_varlen_states=True)
    f, _, _ = _fused_inputs()
    with pytest.raises(PacksimError, match="headdim"):
        mamba_split_conv1d_scan_combined(**f, chunk_size=8)
    with pytest.raises(PacksimError, match="zxbcdt"):
        mamba_split_conv1d_scan_combined(**dict(f, zxbcdt=f["zxbcdt"][..., :-1]), chunk_size=8, headdim=p, ngroups=g)


def test_says_it_is_the_reference_kernel():
    for fn in (mamba_chunk_scan_combined, mamba_split_conv1d_scan_combined):
        assert fn.__packsim_kernel__ == REFERENCE_KERNEL
        assert REFERENCE_KERNEL in " ".join(fn.__doc__.split())
