"""Tests for packsim.reference.flash: the reference kernel (packsim, pure torch), not
flash-attn, against dense masked softmax and torch's SDPA, on seeded random shapes (fp32, CPU).

Ground truth here is written apart from the kernel: ``dense`` builds each segment's mask cell by
cell from flash-attn 2's docstring rule and runs one head at a time in float64; SDPA gets its
causal masks from torch (``is_causal``, ``causal_lower_right``). Where a mask is the question
(bottom-right causal, windows), flash-attn's own docstring examples are asserted as printed.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from packsim.core.errors import PacksimError
from packsim.reference import flash as reference_flash
from packsim.reference.flash import REFERENCE_KERNEL, flash_attn_func, flash_attn_varlen_func

TOL = 1e-5  # fp32 kernel vs float64 dense math


def dense(q, k, v, lens_q, lens_k, causal=False, window=(-1, -1), softcap=0.0, scale=None):
    """Per segment, per head, float64: (total_q, H, D), (H, total_q) lse. The mask cell by cell:
    key j visible to query i iff j <= i + Lk - Lq + right and j >= i + Lk - Lq - left (-1: no
    bound), right = 0 under causal (flash-attn 2's docstring)."""
    H, H_kv, D = q.shape[1], k.shape[1], q.shape[2]
    scale = D**-0.5 if scale is None else scale
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full((H, q.shape[0]), float("inf"), dtype=torch.float64)
    oq = ok = 0
    for Lq, Lk in zip(lens_q, lens_k, strict=True):
        left, right = window
        right = 0 if causal else right
        d = Lk - Lq
        mask = torch.tensor([[(right < 0 or j <= i + d + right) and (left < 0 or j >= i + d - left)
                              for j in range(Lk)] for i in range(Lq)], dtype=torch.bool).reshape(Lq, Lk)
        for h in range(H):
            g = h // (H // H_kv)
            s = q[oq:oq + Lq, h].double() @ k[ok:ok + Lk, g].double().T * scale  # (Lq, Lk)
            if softcap > 0:
                s = softcap * torch.tanh(s / softcap)
            s = s.masked_fill(~mask, float("-inf"))
            for i in range(Lq):
                if mask[i].any():
                    p = torch.softmax(s[i], -1)
                    out[oq + i, h] = p @ v[ok:ok + Lk, g].double()
                    lse[h, oq + i] = torch.logsumexp(s[i], -1)
        oq, ok = oq + Lq, ok + Lk
    return out, lse


def cu_of(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# name -> (B, Tq, Tk, H, H_kv, D, options)
DENSE_CASES = {
    "causal": (2, 7, 7, 4, 4, 8, dict(causal=True)),
    "not causal": (2, 7, 7, 4, 4, 8, dict(causal=False)),
    "q shorter than k, causal (bottom-right)": (2, 3, 9, 4, 4, 8, dict(causal=True)),
    "q longer than k, causal (rows that see nothing)": (2, 6, 3, 2, 2, 8, dict(causal=True)),
    "window (3, 0), causal": (1, 12, 12, 2, 2, 8, dict(causal=True, window_size=(3, 0))),
    "window (7, 7), causal (transformers' form)": (1, 12, 12, 2, 2, 8, dict(causal=True, window_size=(7, 7))),
    "window (2, 1), not causal": (1, 10, 10, 2, 2, 8, dict(causal=False, window_size=(2, 1))),
    "window (2, -1), q shorter than k": (1, 4, 10, 2, 2, 8, dict(causal=False, window_size=(2, -1))),
    "softcap 2.0, causal": (2, 8, 8, 4, 4, 8, dict(causal=True, softcap=2.0)),
    "GQA 6/2 heads, causal": (2, 8, 8, 6, 2, 8, dict(causal=True)),
    "MQA 4/1 heads, softmax_scale 0.3": (2, 8, 8, 4, 1, 16, dict(causal=True, softmax_scale=0.3)),
}


def _dense_of(q, k, v, opts):
    """dense() of the (B, T, H, D) batch: each row one segment."""
    B, Tq, Tk = q.shape[0], q.shape[1], k.shape[1]
    out, lse = dense(q.reshape(B * Tq, *q.shape[2:]), k.reshape(B * Tk, *k.shape[2:]),
                     v.reshape(B * Tk, *v.shape[2:]), [Tq] * B, [Tk] * B, opts.get("causal", False),
                     opts.get("window_size", (-1, -1)), opts.get("softcap", 0.0), opts.get("softmax_scale"))
    return out.reshape(q.shape), lse.reshape(q.shape[2], B, Tq).transpose(0, 1)  # (B, Tq, H, D), (B, H, Tq)


@pytest.mark.parametrize("case", DENSE_CASES)
def test_flash_attn_func_equals_dense_math(case):
    B, Tq, Tk, H, H_kv, D, opts = DENSE_CASES[case]
    seed = sorted(DENSE_CASES).index(case)
    q, k, v = rand(B, Tq, H, D, seed=seed), rand(B, Tk, H_kv, D, seed=seed + 50), rand(B, Tk, H_kv, D, seed=seed + 99)
    out, lse, probs = flash_attn_func(q, k, v, return_attn_probs=True, **opts)
    want, want_lse = _dense_of(q, k, v, opts)
    assert out.shape == (B, Tq, H, D) and out.dtype == q.dtype and lse.shape == (B, H, Tq) and probs is None
    assert float((out.double() - want).abs().max()) < TOL
    seen = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), seen)  # +inf exactly where a query sees no key
    assert float((lse.double()[seen] - want_lse[seen]).abs().max()) < TOL


SDPA_CASES = ["causal", "not causal", "q shorter than k, causal (bottom-right)", "GQA 6/2 heads, causal",
              "MQA 4/1 heads, softmax_scale 0.3", "window (3, 0), causal"]


@pytest.mark.parametrize("case", SDPA_CASES)
def test_flash_attn_func_equals_sdpa(case):
    B, Tq, Tk, H, H_kv, D, opts = DENSE_CASES[case]
    q, k, v = rand(B, Tq, H, D, seed=1), rand(B, Tk, H_kv, D, seed=2), rand(B, Tk, H_kv, D, seed=3)
    mask = None
    if opts.get("causal"):
        mask = causal_lower_right(Tq, Tk)._materialize()  # (Tq, Tk): torch's own bottom-right mask
    if "window_size" in opts:
        left = opts["window_size"][0]
        i, j = torch.arange(Tq)[:, None], torch.arange(Tk)[None]
        mask = mask & (j >= i + Tk - Tq - left)
    want = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          attn_mask=mask, scale=opts.get("softmax_scale"), enable_gqa=True)
    out = flash_attn_func(q, k, v, **opts)
    assert float((out - want.transpose(1, 2)).abs().max()) < TOL


# name -> (segment lengths of q, of k, H, H_kv, options)
VARLEN_CASES = {
    "causal, segments 1 5 3 8": ([1, 5, 3, 8], [1, 5, 3, 8], 4, 2, dict(causal=True)),
    "not causal, segments 4 1 6": ([4, 1, 6], [4, 1, 6], 2, 2, dict(causal=False)),
    "q shorter than k per segment (decode-like)": ([1, 2, 3, 1], [1, 5, 3, 8], 4, 4, dict(causal=True)),
    "empty segments 0 and k-only": ([0, 3, 2], [0, 3, 4], 2, 1, dict(causal=True)),
    "window (2, 2) causal, segments 9 1 7": ([9, 1, 7], [9, 1, 7], 2, 2, dict(causal=True, window_size=(2, 2))),
    "softcap 1.5, GQA, segments 6 6": ([6, 6], [6, 6], 4, 2, dict(causal=True, softcap=1.5)),
    "one segment of length 1": ([1], [1], 2, 2, dict(causal=True)),
}


@pytest.mark.parametrize("case", VARLEN_CASES)
def test_flash_attn_varlen_func_equals_dense_math(case):
    lq, lk, H, H_kv, opts = VARLEN_CASES[case]
    seed, D = sorted(VARLEN_CASES).index(case), 8
    q, k, v = rand(sum(lq), H, D, seed=seed), rand(sum(lk), H_kv, D, seed=seed + 7), rand(sum(lk), H_kv, D, seed=seed + 9)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_of(lq), cu_of(lk), max(lq), max(lk),
                                         return_attn_probs=True, **opts)
    want, want_lse = dense(q, k, v, lq, lk, opts.get("causal", False), opts.get("window_size", (-1, -1)),
                           opts.get("softcap", 0.0))
    assert out.shape == q.shape and lse.shape == (H, sum(lq))
    assert float((out.double() - want).abs().max()) < TOL
    seen = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), seen)
    assert float((lse.double()[seen] - want_lse[seen]).abs().max()) < TOL


def test_varlen_equals_each_segment_alone_through_sdpa():
    """The packed call equals each segment run alone (torch's SDPA, causal): nothing crosses a boundary."""
    lengths, H, D = [3, 1, 7, 5], 4, 8
    q, k, v = rand(16, H, D, seed=4), rand(16, 2, D, seed=5), rand(16, 2, D, seed=6)
    out = flash_attn_varlen_func(q, k, v, cu_of(lengths), cu_of(lengths), torch.tensor(7), torch.tensor(7),
                                 causal=True)  # max_seqlen as a 0-dim tensor, as transformers passes it
    start = 0
    for L in lengths:
        seg = slice(start, start + L)
        alone = F.scaled_dot_product_attention(q[seg].transpose(0, 1), k[seg].transpose(0, 1),
                                               v[seg].transpose(0, 1), is_causal=True, enable_gqa=True)
        assert float((out[seg] - alone.transpose(0, 1)).abs().max()) < TOL
        start += L


def _pattern(Tq: int, Tk: int, **opts) -> list[list[int]]:
    """The 0/1 mask the kernel applies: equal scores (q = k = 0), v = one-hot of the key."""
    q, k = torch.zeros(1, Tq, 1, Tk), torch.zeros(1, Tk, 1, Tk)
    v = torch.eye(Tk)[None, :, None, :]  # (1, Tk, 1, Tk)
    return (flash_attn_func(q, k, v, **opts)[0, :, 0] > 0).int().tolist()


def test_masks_are_flash_attns_docstring_examples():
    # flash-attn 2, flash_attn_func docstring: "If causal=True, the causal mask is aligned to the
    # bottom right corner of the attention matrix" with these two examples.
    assert _pattern(2, 5, causal=True) == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert _pattern(5, 2, causal=True) == [[0, 0], [0, 0], [0, 0], [1, 0], [1, 1]]
    # window_size=(1, 0), causal: each query sees itself and one key back
    assert _pattern(4, 4, causal=True, window_size=(1, 0)) == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    # causal overrides the right bound: (1, 2) with causal is (1, 0)
    assert _pattern(4, 4, causal=True, window_size=(1, 2)) == _pattern(4, 4, causal=True, window_size=(1, 0))
    assert _pattern(3, 3, window_size=(0, 1)) == [[1, 1, 0], [0, 1, 1], [0, 0, 1]]


def test_a_query_that_sees_no_key_gives_zero():
    q, k, v = rand(1, 5, 2, 8, seed=1), rand(1, 2, 2, 8, seed=2), rand(1, 2, 2, 8, seed=3)
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.equal(out[0, :3], torch.zeros(3, 2, 8)) and bool(torch.isinf(lse[0, :, :3]).all())


def test_backward_is_autograd_and_padding_sends_no_gradient():
    """float64 gradcheck over uneven segments (the padded batch's dead rows must not leak NaN or mass)."""
    lengths = [1, 4, 2]
    q = rand(7, 2, 4, seed=1).double().requires_grad_()
    k = rand(7, 1, 4, seed=2).double().requires_grad_()
    v = rand(7, 1, 4, seed=3).double().requires_grad_()
    cu = cu_of(lengths)
    assert torch.autograd.gradcheck(
        lambda q, k, v: flash_attn_varlen_func(q, k, v, cu, cu, 4, 4, causal=True, softcap=3.0), (q, k, v))


def test_half_inputs_are_computed_in_fp32_and_returned_in_their_dtype():
    q, k, v = rand(2, 6, 4, 8, seed=1), rand(2, 6, 2, 8, seed=2), rand(2, 6, 2, 8, seed=3)
    want = flash_attn_func(q, k, v, causal=True)
    for dtype in (torch.bfloat16, torch.float16):
        out = flash_attn_func(q.to(dtype), k.to(dtype), v.to(dtype), causal=True)
        assert out.dtype == dtype and float((out.float() - want).abs().max()) < 2e-2


def test_signatures_are_flash_attn_2s():
    # flash-attn 2 (flash_attn/flash_attn_interface.py): the parameters transformers reads by
    # name (_lazy_define_process_function inspects the varlen one), in flash-attn's order.
    common = ["dropout_p", "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes",
              "deterministic", "return_attn_probs"]
    assert list(inspect.signature(flash_attn_func).parameters) == ["q", "k", "v", *common]
    assert list(inspect.signature(flash_attn_varlen_func).parameters) == [
        "q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", *common, "block_table"]
    defaults = {n: p.default for n, p in inspect.signature(flash_attn_varlen_func).parameters.items()}
    assert defaults["window_size"] == (-1, -1) and defaults["softcap"] == 0.0 and defaults["causal"] is False


def test_everything_it_exposes_says_it_is_the_reference_kernel():
    assert REFERENCE_KERNEL == "reference kernel (packsim, pure torch), not flash-attn"
    assert REFERENCE_KERNEL in " ".join(reference_flash.__doc__.split())
    for name in reference_flash.__all__:
        obj = getattr(reference_flash, name)
        if callable(obj):
            assert REFERENCE_KERNEL.lower() in " ".join(obj.__doc__.split()).lower(), name


def _varlen(**changes):
    q, k, v = rand(6, 2, 8, seed=1), rand(6, 2, 8, seed=2), rand(6, 2, 8, seed=3)
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_of([2, 4]), cu_seqlens_k=cu_of([2, 4]), max_seqlen_q=4,
                max_seqlen_k=4, causal=True)
    return flash_attn_varlen_func(**{**args, **changes})


@pytest.mark.parametrize("changes, message", [
    (dict(dropout_p=0.1), "no attention dropout"),
    (dict(alibi_slopes=torch.ones(2)), "no ALiBi"),
    (dict(block_table=torch.zeros(1, 1, dtype=torch.int32)), "no paged KV cache"),
    (dict(cu_seqlens_q=torch.tensor([0, 2, 6])), "int32 offsets"),
    (dict(cu_seqlens_q=cu_of([2, 3])), "every token in exactly one segment"),
    (dict(cu_seqlens_k=cu_of([6])), "one offset table per side"),
    (dict(max_seqlen_q=3), "longest segment"),
    (dict(window_size=(-2, 0)), "window_size"),
    (dict(k=rand(6, 3, 8, seed=1), v=rand(6, 3, 8, seed=1)), "multiple of 3"),
    (dict(v=rand(6, 2, 4, seed=1)), "one shape"),
    (dict(q=rand(6, 2, 8, seed=1).double()), "one float dtype"),
    (dict(q=rand(1, 6, 2, 8, seed=1)), "3D tensor"),
])
def test_what_it_does_not_do_is_refused_in_one_line(changes, message):
    with pytest.raises(PacksimError, match=message) as err:
        _varlen(**changes)
    assert "\n" not in str(err.value)


def test_unknown_keywords_are_refused_like_flash_attn():
    with pytest.raises(TypeError, match="s_aux"):
        _varlen(s_aux=torch.zeros(2))
