"""Tests for packsim.core.attention and attention_backends: every backend equals per-sequence
attention, exactly (fp32, CPU); which backends can run here, and the pick.

GPU tests (``-m gpu``) compare flash / torch_varlen / flex in bf16 with the fp32 dense reference
and skip cleanly without CUDA.
"""

from __future__ import annotations

import logging
from itertools import pairwise

import pytest
import torch
import torch.nn.functional as F

from packsim.core.attention import _length_buckets, varlen_attention
from packsim.core.attention_backends import (
    BACKENDS,
    _flash_import_error,
    _flex_cpu_trains,
    available_backends,
    resolve_backend,
)
from packsim.core.errors import PacksimError

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

CPU_BACKENDS = [n for n, s in available_backends("cpu").items() if s.available]
CPU_TRAINING = [n for n, s in available_backends("cpu").items() if s.available and s.trains]
TOL = 1e-5

LENGTH_CASES = {
    "mixed": [1, 7, 33, 1, 100, 64, 2, 17],
    "single": [50],
    "all_ones": [1, 1, 1, 1],
    "random": torch.randint(1, 40, (20,), generator=torch.Generator().manual_seed(3)).tolist(),
}


def _pack(lengths, H=4, H_kv=4, D=16, seed=0, dtype=torch.float32, device="cpu"):
    """Random q (N, H, D), k, v (N, H_kv, D), cu_seqlens (S+1,) int32 and max_seqlen."""
    gen = torch.Generator().manual_seed(seed)
    N = sum(lengths)
    q = torch.randn(N, H, D, generator=gen)
    k = torch.randn(N, H_kv, D, generator=gen)
    v = torch.randn(N, H_kv, D, generator=gen)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    q, k, v = (t.to(device=device, dtype=dtype) for t in (q, k, v))
    return q, k, v, cu.to(device), max(lengths)


def _per_sequence(q, k, v, cu, causal=True, scale=None):
    """Ground truth: run each sequence alone through SDPA (is_causal), then concatenate."""
    rep = q.shape[1] // k.shape[1]
    outs = []
    offs = cu.tolist()
    for a, b in pairwise(offs):
        qs = q[a:b].transpose(0, 1)[None]  # (1, H, L, D)
        ks = k[a:b].repeat_interleave(rep, 1).transpose(0, 1)[None]
        vs = v[a:b].repeat_interleave(rep, 1).transpose(0, 1)[None]
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=scale)
        outs.append(o[0].transpose(0, 1))
    return torch.cat(outs)  # (N, H, D)


def _run(backend, q, k, v, cu, max_len, **kw):
    return varlen_attention(q, k, v, cu, cu, max_len, max_len, backend=backend, **kw)


# ----------------------------------------------------------------------------- equality, fp32 CPU


def test_cpu_backends_listed():
    assert set(CPU_BACKENDS) >= {"dense", "blocked", "flex"}
    assert "blocked" in CPU_TRAINING and "dense" in CPU_TRAINING
    assert set(BACKENDS) == {"dense", "blocked", "flex", "flash", "torch_varlen"}


@pytest.mark.parametrize("case", list(LENGTH_CASES))
@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("causal", [True, False])
def test_backend_equals_per_sequence(backend, case, causal):
    q, k, v, cu, max_len = _pack(LENGTH_CASES[case])
    with torch.no_grad():
        out = _run(backend, q, k, v, cu, max_len, causal=causal)
    assert out.shape == q.shape and out.dtype == q.dtype
    ref = _per_sequence(q, k, v, cu, causal=causal)
    assert (out - ref).abs().max().item() <= TOL


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("H_kv", [1, 2])
def test_backend_gqa(backend, H_kv):
    q, k, v, cu, max_len = _pack(LENGTH_CASES["mixed"], H=4, H_kv=H_kv, seed=1)
    with torch.no_grad():
        out = _run(backend, q, k, v, cu, max_len)
    assert (out - _per_sequence(q, k, v, cu)).abs().max().item() <= TOL


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_backend_softmax_scale(backend):
    q, k, v, cu, max_len = _pack([5, 9, 3], seed=2)
    with torch.no_grad():
        out = _run(backend, q, k, v, cu, max_len, softmax_scale=0.3)
    assert (out - _per_sequence(q, k, v, cu, scale=0.3)).abs().max().item() <= TOL


def test_max_seqlen_may_exceed_longest():
    q, k, v, cu, max_len = _pack([5, 9, 3])
    out = varlen_attention(q, k, v, cu, cu, 64, 64, backend="blocked")
    assert (out - _per_sequence(q, k, v, cu)).abs().max().item() <= TOL


def test_whole_pack_causal_mask_differs():
    """The buggy setup (one causal mask over the pack) is NOT per-sequence: the test can fail."""
    lengths = [30, 20, 25]
    q, k, v, cu, _ = _pack(lengths, seed=4)
    qh, kh, vh = (t.transpose(0, 1)[None] for t in (q, k, v))
    leaky = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)[0].transpose(0, 1)
    ref = _per_sequence(q, k, v, cu)
    assert (leaky[:30] - ref[:30]).abs().max() <= TOL  # the first example is unaffected
    assert (leaky[30:] - ref[30:]).abs().max() > 1e-3  # later examples read earlier ones


# ----------------------------------------------------------------------------- gradients


def _grads(backend, lengths, seed=5, H_kv=4, causal=True):
    q, k, v, cu, max_len = _pack(lengths, H_kv=H_kv, seed=seed)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = _run(backend, q, k, v, cu, max_len, causal=causal)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1))
    return torch.autograd.grad((out * w).sum(), (q, k, v))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("H_kv", [4, 2])
def test_blocked_gradients_equal_dense(causal, H_kv):
    lengths = LENGTH_CASES["mixed"]
    for g_blocked, g_dense in zip(
        _grads("blocked", lengths, H_kv=H_kv, causal=causal),
        _grads("dense", lengths, H_kv=H_kv, causal=causal),
        strict=True,
    ):
        assert (g_blocked - g_dense).abs().max().item() <= TOL


@pytest.mark.parametrize("backend", CPU_TRAINING)
def test_no_gradient_across_sequences(backend):
    """d out[seq j] / d (q, k, v)[seq i] is exactly zero for i != j."""
    lengths = [6, 1, 9, 4]
    q, k, v, cu, max_len = _pack(lengths, seed=6)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = _run(backend, q, k, v, cu, max_len)
    offs = cu.tolist()
    for j in range(len(lengths)):
        a, b = offs[j], offs[j + 1]
        grads = torch.autograd.grad(out[a:b].sum(), (q, k, v), retain_graph=True)
        for g in grads:
            outside = torch.cat([g[:a], g[b:]])
            assert torch.count_nonzero(outside) == 0
            assert torch.count_nonzero(g[a:b]) > 0


# ----------------------------------------------------------------------------- selection, logging


def test_auto_on_cpu_picks_blocked_and_logs_once(caplog):
    q, k, v, cu, max_len = _pack([3, 4], seed=7)
    name, why = resolve_backend("auto", q, requires_grad=True)
    assert name == "blocked" and "auto" in why
    with caplog.at_level(logging.INFO, logger="packsim"):
        varlen_attention(q, k, v, cu, cu, max_len, max_len, softmax_scale=0.123)
        varlen_attention(q, k, v, cu, cu, max_len, max_len, softmax_scale=0.123)
    # logged at most once per distinct choice (an earlier test may already have logged it)
    assert sum("blocked" in r.getMessage() for r in caplog.records) <= 1


def test_resolve_backend_by_name():
    q = torch.zeros(3, 2, 4)
    assert resolve_backend("dense", q, requires_grad=True)[0] == "dense"
    assert resolve_backend("flex", q, requires_grad=False)[0] == "flex"


def test_flex_under_no_grad_accepts_requires_grad_inputs():
    q, k, v, cu, max_len = _pack([4, 6], seed=8)
    q.requires_grad_()
    with torch.no_grad():
        out = _run("flex", q, k, v, cu, max_len)
    assert (out - _per_sequence(q.detach(), k, v, cu)).abs().max() <= TOL


def test_available_backends_statuses():
    st = available_backends("cpu", torch.float32)
    assert set(st) == set(BACKENDS)
    assert st["blocked"].available and st["blocked"].trains
    assert not st["flash"].available and "CUDA" in st["flash"].reason
    assert not st["torch_varlen"].available and "CUDA" in st["torch_varlen"].reason


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_asking_for_cuda_without_cuda_reports_instead_of_crashing():
    st = available_backends("cuda", torch.bfloat16)  # torch.cuda calls would assert here
    assert st["blocked"].available
    for name in ("flash", "torch_varlen"):
        assert not st[name].available and "CUDA" in st[name].reason


def test_length_buckets_cover_every_sequence_once():
    lengths = LENGTH_CASES["random"]
    buckets = _length_buckets(lengths)
    assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
    for b in buckets:
        assert min(lengths[i] for i in b) >= 0.8 * max(lengths[i] for i in b)


# ----------------------------------------------------------------------------- bad input


def _bad(words, *, q=None, k=None, v=None, cu_q=None, cu_k=None, max_q=None, max_k=None, **kw):
    q0, k0, v0, cu0, m0 = _pack([3, 5, 2], H=4, H_kv=2, D=8)
    args = [
        q0 if q is None else q,
        k0 if k is None else k,
        v0 if v is None else v,
        cu0 if cu_q is None else cu_q,
        cu0 if cu_k is None else cu_k,
        m0 if max_q is None else max_q,
        m0 if max_k is None else max_k,
    ]
    with pytest.raises(PacksimError) as info:
        varlen_attention(*args, **kw)
    msg = str(info.value)
    for w in words:
        assert w.lower() in msg.lower(), f"{w!r} not in: {msg}"
    return msg


def _cu(*offsets):
    return torch.tensor(offsets, dtype=torch.int32)


def test_bad_q_not_3d():
    _bad(["q must be 3-D", "reshape"], q=torch.zeros(10, 32))


def test_bad_k_v_shapes_differ():
    _bad(["same shape"], v=torch.zeros(10, 2, 4))


def test_bad_head_dim_mismatch():
    _bad(["head_dim", "16", "8"], q=torch.zeros(10, 4, 16))


def test_bad_gqa_heads():
    _bad(["not a multiple", "num_key_value_heads"], q=torch.zeros(10, 3, 8))


def test_bad_dtype_mismatch():
    _bad(["one dtype", "torch.float64"], k=torch.zeros(10, 2, 8, dtype=torch.float64))


def test_bad_integer_dtype():
    z = torch.zeros(10, 2, 8, dtype=torch.long)
    _bad(["floating point"], q=torch.zeros(10, 4, 8, dtype=torch.long), k=z, v=z)


def test_bad_device_mismatch():
    meta = torch.zeros(10, 2, 8, device="meta")
    _bad(["one device", "meta"], k=meta, v=meta)


def test_bad_cu_seqlens_int64():
    _bad(["int32", "cu_seqlens_q.to(torch.int32)"], cu_q=torch.tensor([0, 3, 8, 10]))


def test_bad_cu_seqlens_not_from_zero():
    _bad(["start at 0"], cu_k=_cu(2, 3, 8, 10))


def test_bad_cu_seqlens_not_increasing():
    _bad(["strictly increasing", "cu_seqlens_q[2] = 3"], cu_q=_cu(0, 3, 3, 10))


def test_bad_cu_seqlens_wrong_total():
    _bad(["ends at 9", "10 tokens"], cu_q=_cu(0, 3, 8, 9))


def test_bad_cu_seqlens_count_differs():
    _bad(["3 sequences", "2"], cu_k=_cu(0, 3, 10), max_k=7)


def test_bad_cross_attention_on_cpu_path():
    _bad(["only self-attention", "flash"], cu_k=_cu(0, 4, 8, 10), backend="blocked")


def test_bad_max_seqlen_too_small():
    _bad(["max_seqlen_q = 4", "longest sequence (5 tokens)"], max_q=4)
    _bad(["max_seqlen_k"], max_k=2)


def test_bad_backend_name():
    _bad(["unknown attention backend 'cuda'", "'blocked'", "'auto'"], backend="cuda")


def test_bad_causal_and_scale():
    _bad(["causal must be"], causal=1)
    _bad(["softmax_scale"], softmax_scale=-1.0)


def test_bad_flash_on_cpu():
    q, k, v, cu, m = _pack([3, 5], dtype=torch.bfloat16)
    with pytest.raises(PacksimError) as info:
        varlen_attention(q, k, v, cu, cu, m, m, backend="flash")
    msg = str(info.value)
    assert "CUDA only" in msg and "cpu" in msg and "blocked" in msg
    assert "float16/bfloat16" not in msg  # the dtype is fine: only the real problems are listed


def test_bad_flash_in_fp32():
    _bad(["float16/bfloat16", "torch.float32", "torch.bfloat16"], backend="flash")


@pytest.mark.skipif(_flash_import_error() is None, reason="flash-attn is installed here")
def test_bad_flash_not_installed():
    _bad(["not installed", "packsim[gpu]", "nvcc"], backend="flash")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: torch_varlen may run")
def test_bad_torch_varlen_on_cpu():
    _bad(["varlen_attn", "CUDA only", "blocked"], backend="torch_varlen")


@pytest.mark.skipif(_flex_cpu_trains(), reason="this torch has a CPU FlexAttention backward")
def test_bad_flex_backward_on_cpu():
    q, k, v, cu, m = _pack([3, 5])
    q.requires_grad_()
    with pytest.raises(PacksimError) as info:
        varlen_attention(q, k, v, cu, cu, m, m, backend="flex")
    msg = str(info.value)
    assert "backward" in msg and "backend='blocked'" in msg and "CUDA" in msg


# ----------------------------------------------------------------------------- GPU (bf16)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("backend", ["flash", "torch_varlen", "flex", "blocked"])
@pytest.mark.parametrize("H_kv", [4, 2])
def test_gpu_backend_bf16_matches_fp32_dense(backend, H_kv):
    status = available_backends("cuda", torch.bfloat16)[backend]
    if not status.available:
        pytest.skip(f"{backend} unavailable: {status.reason}")
    lengths = [1, 7, 300, 1, 129, 64, 2, 517]
    q, k, v, cu, m = _pack(lengths, H=4, H_kv=H_kv, D=64, seed=9, device="cuda")
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = varlen_attention(*ref_in, cu, cu, m, m, backend="dense")  # fp32 reference
    low_in = [t.to(torch.bfloat16).requires_grad_() for t in (q, k, v)]
    out = varlen_attention(*low_in, cu, cu, m, m, backend=backend)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    assert _rel(out, ref) < 2e-2
    w = torch.randn_like(ref)
    g_ref = torch.autograd.grad((ref * w).sum(), ref_in)
    g_low = torch.autograd.grad((out.float() * w).sum(), low_in)
    for a, b in zip(g_low, g_ref, strict=True):
        assert _rel(a, b) < 5e-2


@pytest.mark.gpu
@needs_cuda
def test_gpu_fp32_cpu_paths_exact():
    q, k, v, cu, m = _pack([1, 7, 300, 1, 129], seed=10, device="cuda")
    ref = _per_sequence(q, k, v, cu)
    for backend in ("dense", "blocked", "flex"):
        with torch.no_grad():
            out = _run(backend, q, k, v, cu, m)
        assert (out - ref).abs().max().item() <= 1e-4, backend


@pytest.mark.gpu
@needs_cuda
def test_gpu_auto_picks_a_kernel():
    q = torch.zeros(8, 4, 64, device="cuda", dtype=torch.bfloat16)
    name, why = resolve_backend("auto", q, requires_grad=True)
    assert name in ("flash", "torch_varlen", "blocked") and "auto on cuda" in why
