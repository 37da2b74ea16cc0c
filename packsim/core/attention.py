"""Varlen (packed) attention: one interface, five backends, all tested equal.

Every backend takes q, k, v flattened over a pack plus ``cu_seqlens`` (int32 offsets), as
FlashAttention's ``flash_attn_varlen_func`` does, and attends *inside* each example only
(block-diagonal, causal by default)::

    q: (total_q, H, D)    k, v: (total_k, H_kv, D)    H % H_kv == 0 (GQA)
    cu_seqlens_q/k: (S+1,) int32    ->    out: (total_q, H, D)

Backends (``BACKENDS``): ``dense`` (the reference: an explicit (N, N) mask, for teaching and
tests), ``blocked`` (examples bucketed by length, each bucket one SDPA call, work ~ sum L_i^2;
the CPU default), ``flex`` (FlexAttention with a document ``BlockMask``, eager), ``flash``
(``flash_attn_varlen_func``) and ``torch_varlen`` (``torch.nn.attention.varlen.varlen_attn``).
What each needs and ``backend="auto"``: :mod:`packsim.core.attention_backends`.

Lessons: 03, A7.
"""

from __future__ import annotations

import inspect
from itertools import pairwise

import torch
import torch.nn.functional as F

from packsim.core.attention_backends import (
    BACKENDS,
    log_choice,
    resolve_backend,
    torch_varlen_fn,
    unknown_backend,
)
from packsim.core.errors import PacksimError
from packsim.core.masks import block_diagonal_mask_from_cu_seqlens, flex_block_mask
from packsim.core.segments import check_cu_seqlens, seq_ids_from_cu_seqlens

__all__ = ["varlen_attention"]

_SELF_ONLY = ("dense", "blocked", "flex")  # backends that need cu_seqlens_q == cu_seqlens_k
_BUCKET_RATIO = 0.8  # blocked: a bucket holds lengths in [0.8 * L_max, L_max]


# ----------------------------------------------------------------------------- validation


def _validate(q, k, v, cu_q, cu_k, max_q, max_k) -> tuple[list[int], list[int]]:
    """Check shapes, dtypes, devices and offsets; return the offsets as lists. No compute."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise PacksimError(
                f"{name} must be 3-D (total_tokens, heads, head_dim), got {shape}. For (B, T, H, D) "
                f"tensors, flatten the batch: {name}.reshape(-1, H, D) with matching cu_seqlens."
            )
    if k.shape != v.shape:
        raise PacksimError(f"k and v must have the same shape, got k {tuple(k.shape)}, v {tuple(v.shape)}.")
    if q.shape[2] != k.shape[2]:
        raise PacksimError(
            f"head_dim of q ({q.shape[2]}) and k/v ({k.shape[2]}) must match. Check the head split "
            f"of your projections (hidden_size // num_heads)."
        )
    H, H_kv = q.shape[1], k.shape[1]
    if H_kv == 0 or H % H_kv != 0:
        raise PacksimError(
            f"q has {H} heads, which is not a multiple of the {H_kv} k/v heads (GQA needs "
            f"num_heads % num_kv_heads == 0). Fix num_key_value_heads in the model config."
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise PacksimError(
            f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}. Cast them, e.g. "
            f"k = k.to(q.dtype)."
        )
    if not q.dtype.is_floating_point:
        raise PacksimError(f"q, k, v must be floating point, got {q.dtype}. Call q.float().")
    if not (q.device == k.device == v.device):
        raise PacksimError(
            f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}. Move them "
            f"with .to(q.device)."
        )
    offs_q = check_cu_seqlens(cu_q, q.shape[0], "cu_seqlens_q")
    offs_k = check_cu_seqlens(cu_k, k.shape[0], "cu_seqlens_k")
    if len(offs_q) != len(offs_k):
        raise PacksimError(
            f"cu_seqlens_q describes {len(offs_q) - 1} sequences but cu_seqlens_k describes "
            f"{len(offs_k) - 1}. They must list the same sequences."
        )
    for name, offs, given in (("max_seqlen_q", offs_q, max_q), ("max_seqlen_k", offs_k, max_k)):
        longest = max(b - a for a, b in pairwise(offs))
        if int(given) < longest:
            raise PacksimError(
                f"{name} = {int(given)} is smaller than the longest sequence ({longest} tokens); "
                f"kernels would silently drop tokens. Pass {name}=int(cu_seqlens.diff().max())."
            )
    return offs_q, offs_k


# ----------------------------------------------------------------------------- backends


def _repeat_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """GQA: (N, H_kv, D) -> (N, H, D); query head h uses kv head h // (H // H_kv)."""
    n_rep = heads // x.shape[1]
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def _dense(q, k, v, cu, causal, scale):
    """Reference: (N, H, D) -> (N, H, D) via SDPA with an explicit (N, N) bool mask."""
    H = q.shape[1]
    k, v = _repeat_kv(k, H), _repeat_kv(v, H)
    mask = block_diagonal_mask_from_cu_seqlens(cu.to(q.device), causal=causal)  # (N, N)
    qh, kh, vh = (t.transpose(0, 1)[None] for t in (q, k, v))  # (1, H, N, D)
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)  # (1, H, N, D)
    return out[0].transpose(0, 1)  # (N, H, D)


def _length_buckets(lengths: list[int], ratio: float = _BUCKET_RATIO) -> list[list[int]]:
    """Group sequence indices by length, longest first; each bucket spans [ratio*L_max, L_max]."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    buckets: list[list[int]] = []
    for i in order:
        if buckets and lengths[i] >= ratio * lengths[buckets[-1][0]]:
            buckets[-1].append(i)
        else:
            buckets.append([i])
    return buckets


def _bucket_slots(starts, lengths, buckets, N, device):
    """Slot layout of the buckets: per bucket (S_b, L_b) and its token index per slot (S_b*L_b,).

    Sequences of a bucket are right-padded to its longest, L_b; padding slots hold index N
    (a zero row appended to the inputs).
    """
    shapes, index = [], []
    for bucket in buckets:
        L = max(lengths[i] for i in bucket)
        pos = torch.arange(L, device=device)  # (L,)
        start = torch.tensor([starts[i] for i in bucket], device=device)[:, None]  # (S_b, 1)
        length = torch.tensor([lengths[i] for i in bucket], device=device)[:, None]  # (S_b, 1)
        index.append(torch.where(pos[None] < length, start + pos[None], N).reshape(-1))  # (S_b*L,)
        shapes.append((len(bucket), L))
    return shapes, index


def _blocked(q, k, v, cu, causal, scale):
    """Trainable path without an N x N mask: (N, H, D) -> (N, H, D), work ~ sum L_i^2.

    One gather puts every sequence in its length bucket's padded (S_b, H, L_b, D) block, SDPA
    runs per bucket, and one gather puts the outputs back in pack order (so the backward is two
    scatters, not one full-size gradient per bucket).
    """
    (N, H, D), dev = q.shape, q.device
    k, v = _repeat_kv(k, H), _repeat_kv(v, H)
    offs = cu.tolist()
    starts, lengths = offs[:-1], [b - a for a, b in pairwise(offs)]
    shapes, index = _bucket_slots(starts, lengths, _length_buckets(lengths), N, dev)
    slots = torch.cat(index)  # (n_slots,): token per slot, N = padding
    slot_of = torch.empty(N + 1, dtype=torch.long, device=dev)
    slot_of[slots] = torch.arange(slots.numel(), device=dev)  # token -> its slot
    sizes = [S * L for S, L in shapes]

    def gather(x):  # (N, H, D) -> per bucket (S_b*L_b, H, D), zeros in padding slots
        return torch.cat([x, x.new_zeros(1, H, D)])[slots].split(sizes)

    outs = []
    for qb, kb, vb, (S, L), idx in zip(gather(q), gather(k), gather(v), shapes, index, strict=True):
        qb, kb, vb = (x.view(S, L, H, D).transpose(1, 2) for x in (qb, kb, vb))  # (S_b, H, L, D)
        if causal:  # right padding is safe: real query t only sees keys <= t, all real
            ob = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scale)
        else:  # key-padding mask (S_b, 1, 1, L); padded query rows still see real keys, no NaN
            valid = idx.view(S, L) < N
            mask = None if bool(valid.all()) else valid[:, None, None, :]
            ob = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale)
        outs.append(ob.transpose(1, 2).reshape(S * L, H, D))
    return torch.cat(outs)[slot_of[:N]]  # (N, H, D) in pack order


def _flex(q, k, v, cu, causal, scale):
    """FlexAttention with a document BlockMask: (N, H, D) -> (N, H, D). Eager (unfused)."""
    from torch.nn.attention.flex_attention import flex_attention

    if q.device.type == "cpu" and not torch.is_grad_enabled():
        # torch (the CPU build of the tested window) refuses CPU flex whenever an input has requires_grad,
        # even under no_grad; detached inputs run on any torch
        q, k, v = q.detach(), k.detach(), v.detach()
    ids = seq_ids_from_cu_seqlens(cu.to(q.device))  # (N,)
    block_mask = flex_block_mask(ids, causal=causal, device=q.device)
    qh, kh, vh = (t.transpose(0, 1)[None] for t in (q, k, v))  # (1, H, N, D), kv (1, H_kv, N, D)
    gqa = q.shape[1] != k.shape[1]
    out = flex_attention(qh, kh, vh, block_mask=block_mask, scale=scale, enable_gqa=gqa)
    return out[0].transpose(0, 1)  # (N, H, D)


def _flash(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale):
    """flash-attn varlen kernel (CUDA, fp16/bf16): (total_q, H, D) -> (total_q, H, D)."""
    from flash_attn import flash_attn_varlen_func

    cu_q, cu_k = (c.to(q.device, torch.int32).contiguous() for c in (cu_q, cu_k))
    return flash_attn_varlen_func(q, k, v, cu_q, cu_k, int(max_q), int(max_k), dropout_p=0.0,
                                  softmax_scale=scale, causal=causal)  # fmt: skip


def _torch_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale):
    """torch.nn.attention.varlen.varlen_attn (CUDA): (total_q, H, D) -> (total_q, H, D)."""
    varlen_attn = torch_varlen_fn()
    params = inspect.signature(varlen_attn).parameters
    cu_q, cu_k = (c.to(q.device, torch.int32).contiguous() for c in (cu_q, cu_k))
    kwargs = {}
    if "window_size" in params:  # the newer signature (read, not the version): causal is window_size=(-1, 0)
        kwargs["window_size"] = (-1, 0) if causal else (-1, -1)
    elif causal:  # the first varlen_attn signature: an is_causal flag
        kwargs["is_causal"] = True
    if scale is not None:
        kwargs["scale"] = scale
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            k, v = _repeat_kv(k, q.shape[1]), _repeat_kv(v, q.shape[1])
    return varlen_attn(q, k, v, cu_q, cu_k, int(max_q), int(max_k), **kwargs)


def varlen_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
    causal: bool = True, softmax_scale: float | None = None, backend: str = "auto",
) -> torch.Tensor:  # fmt: skip
    """Attention inside each packed sequence only: q (total_q, H, D) -> out (total_q, H, D).

    k, v: (total_k, H_kv, D) with H % H_kv == 0; cu_seqlens_q/k: (S+1,) int32 offsets;
    ``max_seqlen_*`` >= the longest sequence. ``causal`` is bottom-right aligned (as flash-attn);
    ``softmax_scale`` defaults to 1/sqrt(D). ``backend``: "auto" or one of :data:`BACKENDS`.
    dense/blocked/flex need ``cu_seqlens_q == cu_seqlens_k`` (self-attention over one pack).
    All input errors raise :class:`PacksimError` before any compute.
    Used by notebooks 03_block_diagonal and 08_flash_varlen_internals.

    Example::

        >>> import torch, packsim
        >>> q = k = v = torch.randn(7, 2, 8)  # two sequences of 3 and 4 tokens, 2 heads, head dim 8
        >>> cu = torch.tensor([0, 3, 7], dtype=torch.int32)
        >>> out = packsim.varlen_attention(q, k, v, cu, cu, 4, 4, backend="dense")
        >>> alone = packsim.varlen_attention(q[:3], k[:3], v[:3], cu[:2], cu[:2], 3, 3, backend="dense")
        >>> out.shape, torch.allclose(out[:3], alone)
        (torch.Size([7, 2, 8]), True)
    """
    if backend != "auto" and backend not in BACKENDS:
        raise unknown_backend(backend)
    if not isinstance(causal, bool):
        raise PacksimError(f"causal must be True or False, got {causal!r}.")
    if softmax_scale is not None and not (isinstance(softmax_scale, (int, float)) and softmax_scale > 0):
        raise PacksimError(
            f"softmax_scale must be a positive number or None (1/sqrt(head_dim)), got {softmax_scale!r}."
        )
    offs_q, offs_k = _validate(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    name, why = resolve_backend(backend, q, needs_grad)
    if name in _SELF_ONLY and offs_q != offs_k:
        raise PacksimError(
            f"backend {name!r} supports only self-attention over one pack, so cu_seqlens_q must "
            f"equal cu_seqlens_k (got {offs_q[:6]}... vs {offs_k[:6]}...). For cross-attention "
            f"with different q/k lengths use backend='flash' or 'torch_varlen' on CUDA."
        )
    log_choice(name, why)
    scale = None if softmax_scale is None else float(softmax_scale)
    if name in _SELF_ONLY:  # one pack: cu_seqlens_q == cu_seqlens_k
        return {"dense": _dense, "blocked": _blocked, "flex": _flex}[name](
            q, k, v, cu_seqlens_q, causal, scale
        )
    kernel = _flash if name == "flash" else _torch_varlen
    return kernel(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale)
