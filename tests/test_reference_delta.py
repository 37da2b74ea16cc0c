"""packsim.reference.delta: the gated delta rule (chunked and recurrent) against a per-token loop
written here, restarting at every cu_seqlens boundary (packed == each sequence alone from its own
initial state), equal to transformers' torch fallbacks on unpacked rows, and the crossing without
cu_seqlens as the case to catch."""

import pytest
import torch
import torch.nn.functional as F

from packsim.core.errors import PacksimError
from packsim.core.upstream.hub_kernels import torch_function
from packsim.reference.conv import REFERENCE_KERNEL
from packsim.reference.delta import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

TOL = 1e-5
H, HV, K, V = 2, 4, 8, 6  # GVA: each q/k head serves two value heads
CU = [0, 70, 71, 120, 150]  # a 1-token sequence; sequences across the 64-token chunks
KERNELS = [chunk_gated_delta_rule, fused_recurrent_gated_delta_rule]


def _data(B=1, T=150, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    return dict(q=r(B, T, H, K), k=r(B, T, H, K), v=r(B, T, HV, V), g=F.logsigmoid(r(B, T, HV) + 2),
                beta=torch.rand(B, T, HV, generator=gen))


def _loop(q, k, v, g, beta, S=None):
    """Ground truth, one token and one head at a time (l2-normalised q, k; scale K**-0.5)."""
    B, T = q.shape[:2]
    q = F.normalize(q, dim=-1, eps=0) * K ** -0.5
    k = F.normalize(k, dim=-1, eps=0)
    S = torch.zeros(B, HV, K, V, dtype=q.dtype) if S is None else S.clone()
    o = torch.zeros(B, T, HV, V, dtype=q.dtype)
    for bi in range(B):
        for j in range(HV):
            qh, kh = q[bi, :, j // (HV // H)], k[bi, :, j // (HV // H)]
            for t in range(T):
                S[bi, j] = S[bi, j] * g[bi, t, j].exp()
                S[bi, j] = S[bi, j] + beta[bi, t, j] * torch.outer(kh[t], v[bi, t, j] - S[bi, j].T @ kh[t])
                o[bi, t, j] = S[bi, j].T @ qh[t]
    return o, S


@pytest.mark.parametrize("kernel", KERNELS)
def test_matches_the_per_token_loop(kernel):
    d = _data(B=2, T=80)
    S0 = torch.randn(2, HV, K, V)
    o, S = kernel(**d, initial_state=S0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    want, want_S = _loop(**d, S=S0)
    assert (o - want).abs().max() <= TOL and (S - want_S).abs().max() <= TOL


@pytest.mark.parametrize("kernel", KERNELS)
def test_outputs_are_contiguous_for_callers_that_view_them(kernel):
    d = _data(B=1, T=40)
    assert kernel(**d)[0].is_contiguous()
    cu = torch.tensor([0, 13, 40], dtype=torch.int32)
    assert kernel(**d, cu_seqlens=cu)[0].is_contiguous()


@pytest.mark.parametrize("kernel", KERNELS)
def test_float64_inputs_run_in_float64(kernel):
    """A float64 audit holds the kernel to float64 round-off: fp32 accumulation would miss by ~1e-7."""
    d = {k: v.double() for k, v in _data(B=1, T=40).items()}
    d["q"], d["k"] = (F.normalize(d[x], dim=-1, eps=0) for x in ("q", "k"))  # as the loop does (no kernel eps)
    o, S = kernel(**d, output_final_state=True, use_qk_l2norm_in_kernel=False)
    want, want_S = _loop(**d)
    assert o.dtype == torch.float64 and (o - want).abs().max() <= 1e-10 and (S - want_S).abs().max() <= 1e-10


@pytest.mark.parametrize("kernel", KERNELS)
def test_packed_row_equals_each_sequence_alone(kernel):
    d = _data()
    S0 = torch.randn(len(CU) - 1, HV, K, V)
    o, S = kernel(**d, initial_state=S0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                  cu_seqlens=torch.tensor(CU, dtype=torch.int32))
    for s, (a, e) in enumerate(zip(CU[:-1], CU[1:], strict=True)):
        want, want_S = _loop(**{n: t[:, a:e] for n, t in d.items()}, S=S0[s:s + 1])
        assert (o[:, a:e] - want).abs().max() <= TOL
        assert (S[s] - want_S[0]).abs().max() <= TOL
    # the case it must catch: the same packed row without cu_seqlens runs the state across
    crossing, _ = kernel(**d, use_qk_l2norm_in_kernel=True)
    alone, _ = kernel(**d, use_qk_l2norm_in_kernel=True, cu_seqlens=torch.tensor(CU))
    assert (crossing - alone).abs().max() > 1e-3


def test_match_transformers_fallbacks_on_unpacked_rows():
    from transformers.models.qwen3_next import modeling_qwen3_next as mq

    d = _data(B=2, T=100)
    S0 = torch.randn(2, HV, K, V)
    pairs = [(chunk_gated_delta_rule, torch_function(mq.torch_chunk_gated_delta_rule)),
             (fused_recurrent_gated_delta_rule, torch_function(mq.torch_recurrent_gated_delta_rule))]
    unit = {n: F.normalize(d[n], dim=-1) for n in ("q", "k")}  # without the in-kernel norm: unit keys (stable)
    for mine, theirs in pairs:
        for l2, qk in ((True, d), (False, unit)):
            o, S = mine(qk["q"], qk["k"], d["v"], g=d["g"], beta=d["beta"], initial_state=S0,
                        output_final_state=True, use_qk_l2norm_in_kernel=l2)
            o_ref, S_ref = theirs(qk["q"], qk["k"], d["v"], g=d["g"], beta=d["beta"], initial_state=S0,
                                  output_final_state=True, use_qk_l2norm_in_kernel=l2)
            assert (o - o_ref).abs().max() <= TOL and (S - S_ref).abs().max() <= TOL


def test_scale_and_missing_beta_and_g():
    d = _data(T=20)
    base, _ = chunk_gated_delta_rule(**d, use_qk_l2norm_in_kernel=True)
    doubled, _ = chunk_gated_delta_rule(**d, scale=2 * K ** -0.5, use_qk_l2norm_in_kernel=True)
    assert (doubled - 2 * base).abs().max() <= TOL  # the output is linear in q
    ones = dict(d, beta=torch.ones_like(d["beta"]), g=torch.zeros_like(d["g"]))
    no_gates, none_state = fused_recurrent_gated_delta_rule(d["q"], d["k"], d["v"])
    assert none_state is None
    assert (no_gates - fused_recurrent_gated_delta_rule(**ones)[0]).abs().max() <= TOL


def test_bad_input_says_what_to_pass():
    d = _data(B=2, T=20)
    with pytest.raises(PacksimError, match="batch 1"):
        chunk_gated_delta_rule(**d, cu_seqlens=torch.tensor([0, 20]))
    d1 = _data(T=20)
    with pytest.raises(PacksimError, match="cu_seqlens"):
        chunk_gated_delta_rule(**d1, cu_seqlens=torch.tensor([0, 5, 19]))
    with pytest.raises(PacksimError, match="one state per sequence"):
        chunk_gated_delta_rule(**d1, cu_seqlens=torch.tensor([0, 5, 20]), initial_state=torch.zeros(1, HV, K, V))
    with pytest.raises(PacksimError, match="HV a multiple of H"):
        chunk_gated_delta_rule(**dict(d1, v=d1["v"][:, :, :3], g=d1["g"][..., :3], beta=d1["beta"][..., :3]))


def test_says_it_is_the_reference_kernel():
    for fn in KERNELS:
        assert fn.__packsim_kernel__ == REFERENCE_KERNEL
        assert REFERENCE_KERNEL in " ".join(fn.__doc__.split())
