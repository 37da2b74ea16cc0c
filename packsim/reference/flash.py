"""The reference kernel (packsim, pure torch), not flash-attn: flash-attn 2's two attention
entry points, ``flash_attn_func`` and ``flash_attn_varlen_func``, with their contract as
transformers calls them, computed by plain torch on CPU or GPU.

A teaching and checking kernel: one masked matmul-softmax over a padded batch of segments (no
tiling, no online softmax, never a Python loop over tokens). Wherever it runs, whatever runs on
it must say "reference kernel (packsim, pure torch), not flash-attn" (:data:`REFERENCE_KERNEL`);
:func:`packsim.reference.flash_emulation.emulate_flash` puts it behind transformers' own flash path.

Shapes (flash-attn's layout: tokens before heads; H query heads, H_kv key/value heads):

- ``flash_attn_func``: q (B, Tq, H, D), k/v (B, Tk, H_kv, D) -> out (B, Tq, H, D);
  with ``return_attn_probs=True``: (out, softmax_lse (B, H, Tq), None).
- ``flash_attn_varlen_func``: q (total_q, H, D), k/v (total_k, H_kv, D), ``cu_seqlens_q/k``
  (S+1,) int32 offsets of S segments -> out (total_q, H, D); lse (H, total_q).

The rules, as flash-attn 2 documents them (per segment of Lq queries and Lk keys, d = Lk - Lq):

- ``causal``: aligned to the bottom-right corner: query i sees key j iff j <= i + d; a query that
  sees no key gets output 0 (and lse +inf);
- ``window_size=(left, right)``: key j in [i + d - left, i + d + right], -1 = no bound; with
  ``causal`` the right bound is 0 (flash-attn overrides it);
- ``softcap`` > 0: scores = softcap * tanh(scores / softcap), after ``softmax_scale``
  (default D ** -0.5);
- GQA/MQA: H % H_kv == 0, query head h reads key/value head h // (H // H_kv);
- ``dropout_p`` must be 0, ``alibi_slopes`` and ``block_table`` None (refused with a
  PacksimError); ``deterministic`` is accepted (this forward is deterministic).

Unlike flash-attn, on purpose: float32/float64 are accepted (flash-attn takes fp16/bf16 only), so
CPU checks are exact; scores are computed in at least float32 and the output has q's dtype;
memory is O(S * Lq_max * Lk_max * H); the backward is torch autograd.

Lessons: none directly.
"""

from __future__ import annotations

import torch

from packsim.core.errors import PacksimError

__all__ = ["REFERENCE_KERNEL", "flash_attn_func", "flash_attn_varlen_func"]

REFERENCE_KERNEL = "reference kernel (packsim, pure torch), not flash-attn"


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """Reference kernel (packsim, pure torch), not flash-attn: flash-attn 2's ``flash_attn_func``.

    q (B, Tq, H, D), k/v (B, Tk, H_kv, D) -> out (B, Tq, H, D) in q's dtype; with
    ``return_attn_probs=True`` the tuple (out, softmax_lse (B, H, Tq), None): flash-attn returns
    the probabilities only with dropout, which this kernel refuses. Rules: the module docstring.
    """
    _check_qkv(q, k, v, dims=4)
    if k.shape[0] != q.shape[0]:
        raise PacksimError(f"q holds {q.shape[0]} rows but k/v {k.shape[0]}: pass the same batch size B.")
    left, right = _check_options(dropout_p, window_size, alibi_slopes, None)
    B, Tq, Tk = q.shape[0], q.shape[1], k.shape[1]
    len_q = torch.full((B,), Tq, dtype=torch.long, device=q.device)  # (B,)
    len_k = torch.full((B,), Tk, dtype=torch.long, device=q.device)  # (B,)
    out, lse = _attend(q, k, v, len_q, len_k, _scale(softmax_scale, q), bool(causal), left, right,
                       float(softcap))  # (B, Tq, H, D), (B, H, Tq)
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
                           block_table=None):
    """Reference kernel (packsim, pure torch), not flash-attn: flash-attn 2's ``flash_attn_varlen_func``.

    q (total_q, H, D), k/v (total_k, H_kv, D); segment s is q[cu_seqlens_q[s]:cu_seqlens_q[s+1]]
    against k/v[cu_seqlens_k[s]:cu_seqlens_k[s+1]] (both (S+1,) int32, covering every token);
    ``max_seqlen_q/k`` (int or 0-dim tensor, as transformers passes them) must be at least the
    longest segment. -> out (total_q, H, D) in q's dtype; with ``return_attn_probs=True`` the
    tuple (out, softmax_lse (H, total_q), None). Rules: the module docstring.
    """
    _check_qkv(q, k, v, dims=3)
    left, right = _check_options(dropout_p, window_size, alibi_slopes, block_table)
    len_q = _segment_lengths(cu_seqlens_q, q, "q")  # (S,)
    len_k = _segment_lengths(cu_seqlens_k, k, "k")  # (S,)
    if len_q.numel() != len_k.numel():
        raise PacksimError(f"cu_seqlens_q holds {len_q.numel()} segments but cu_seqlens_k "
                           f"{len_k.numel()}: pass one offset table per side for the same segments.")
    max_q = _check_max(max_seqlen_q, len_q, "q")
    max_k = _check_max(max_seqlen_k, len_k, "k")
    qp, valid_q = _pad_segments(q, cu_seqlens_q, len_q, max_q)  # (S, Lq, H, D), (S, Lq)
    kp, _ = _pad_segments(k, cu_seqlens_k, len_k, max_k)  # (S, Lk, H_kv, D)
    vp, _ = _pad_segments(v, cu_seqlens_k, len_k, max_k)  # (S, Lk, H_kv, D)
    out, lse = _attend(qp, kp, vp, len_q, len_k, _scale(softmax_scale, q), bool(causal), left, right,
                       float(softcap))  # (S, Lq, H, D), (S, H, Lq)
    out = out[valid_q]  # (total_q, H, D): segments in order, tokens in order
    if not return_attn_probs:
        return out
    return out, lse.transpose(1, 2)[valid_q].transpose(0, 1), None  # lse (H, total_q)


def _attend(q, k, v, len_q, len_k, scale: float, causal: bool, left: int, right: int, softcap: float):
    """q (N, Lq, H, D), k/v (N, Lk, H_kv, D), valid lengths (N,) -> (out (N, Lq, H, D), lse (N, H, Lq)).

    Segment n holds queries 0..len_q[n]-1 and keys 0..len_k[n]-1; the rest is padding.
    """
    H, H_kv = q.shape[2], k.shape[2]
    if k.shape[1] == 0:  # no key anywhere: every query sees nothing
        lse = torch.full((q.shape[0], H, q.shape[1]), float("inf"), device=q.device)
        return torch.zeros_like(q), lse
    acc = torch.promote_types(q.dtype, torch.float32)  # at least fp32 (fp64 stays fp64)
    qh = q.to(acc).transpose(1, 2)  # (N, H, Lq, D)
    kh = k.to(acc).transpose(1, 2).repeat_interleave(H // H_kv, dim=1)  # (N, H, Lk, D)
    vh = v.to(acc).transpose(1, 2).repeat_interleave(H // H_kv, dim=1)  # (N, H, Lk, D)
    scores = (qh @ kh.transpose(-1, -2)) * scale  # (N, H, Lq, Lk)
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    allowed = _allowed(len_q, len_k, q.shape[1], k.shape[1], causal, left, right)  # (N, Lq, Lk)
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    seen = allowed.any(-1)[:, None]  # (N, 1, Lq): the query sees at least one key
    top = scores.amax(-1).detach()  # (N, H, Lq): -inf where the query sees nothing
    top = torch.where(seen, top, torch.zeros_like(top))
    e = torch.exp(scores - top[..., None])  # (N, H, Lq, Lk): 0 where masked
    total = e.sum(-1)  # (N, H, Lq): >= 1 where seen, 0 elsewhere
    total = torch.where(seen, total, torch.ones_like(total))
    out = (e / total[..., None]) @ vh  # (N, H, Lq, D): a query that sees nothing gives 0
    lse = torch.where(seen, top + torch.log(total), torch.full_like(total, float("inf")))  # (N, H, Lq)
    return out.transpose(1, 2).to(q.dtype), lse


def _allowed(len_q, len_k, Lq: int, Lk: int, causal: bool, left: int, right: int) -> torch.Tensor:
    """(N, Lq, Lk) bool, True = query i may read key j: inside its segment, causal and window rules."""
    i = torch.arange(Lq, device=len_q.device)[None, :, None]  # (1, Lq, 1)
    j = torch.arange(Lk, device=len_q.device)[None, None, :]  # (1, 1, Lk)
    lq, lk = len_q[:, None, None], len_k[:, None, None]  # (N, 1, 1)
    diag = i + lk - lq  # (N, Lq, 1): the key query i lines up with (bottom-right alignment)
    ok = (i < lq) & (j < lk)  # (N, Lq, Lk)
    if causal:
        right = 0  # flash-attn: causal overrides the right bound of the window
    if right >= 0:
        ok = ok & (j <= diag + right)
    if left >= 0:
        ok = ok & (j >= diag - left)
    return ok


def _pad_segments(x, cu, lengths, L: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x (total, H, D) -> (padded (S, L, H, D), valid (S, L) bool): segment s's tokens at [s, :len]."""
    pos = torch.arange(L, device=x.device)  # (L,)
    valid = pos[None] < lengths[:, None]  # (S, L)
    idx = (cu[:-1].long()[:, None] + pos[None]).clamp(0, max(x.shape[0] - 1, 0))  # (S, L)
    if x.shape[0] == 0:
        return x.new_zeros(lengths.numel(), L, *x.shape[1:]), valid
    return torch.where(valid[..., None, None], x[idx], torch.zeros((), dtype=x.dtype, device=x.device)), valid


def _scale(softmax_scale, q) -> float:
    return float(q.shape[-1] ** -0.5) if softmax_scale is None else float(softmax_scale)


def _check_qkv(q, k, v, dims: int) -> None:
    layout = "(B, T, H, D)" if dims == 4 else "(total, H, D)"
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != dims:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise PacksimError(f"{name} must be a {dims}D tensor {layout} (flash-attn's layout), got {got}.")
        if not x.is_floating_point() or x.dtype != q.dtype:
            raise PacksimError(f"{name} has dtype {x.dtype}, q {q.dtype}: pass q, k and v in one float dtype.")
    if k.shape != v.shape:
        raise PacksimError(f"k {tuple(k.shape)} and v {tuple(v.shape)} differ: flash-attn 2 takes k and v of "
                           "one shape (transformers pads v up to the query head dim).")
    if k.shape[-1] != q.shape[-1]:
        raise PacksimError(f"q head dim {q.shape[-1]} != k head dim {k.shape[-1]}: pass one head dim D.")
    if k.shape[-2] == 0 or q.shape[-2] % k.shape[-2]:
        raise PacksimError(f"{q.shape[-2]} query heads are not a multiple of {k.shape[-2]} key/value heads: "
                           "GQA/MQA needs H % H_kv == 0.")


def _check_options(dropout_p, window_size, alibi_slopes, block_table) -> tuple[int, int]:
    """(left, right) of the window, after refusing what the reference kernel does not do."""
    if float(dropout_p) != 0.0:
        raise PacksimError(f"dropout_p={dropout_p}: the reference flash kernel has no attention dropout; "
                           "set the config's attention_dropout=0 (or call model.eval()).")
    if alibi_slopes is not None:
        raise PacksimError("alibi_slopes: the reference flash kernel has no ALiBi (transformers never passes "
                           "it); pass alibi_slopes=None.")
    if block_table is not None:
        raise PacksimError("block_table: the reference flash kernel has no paged KV cache; use it without "
                           "continuous batching (block_table=None).")
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise PacksimError(f"window_size={window_size!r}: pass (left, right) ints, -1 = unbounded.") from None
    if left < -1 or right < -1:
        raise PacksimError(f"window_size={window_size!r}: bounds are >= 0 tokens, or -1 for unbounded.")
    return left, right


def _segment_lengths(cu, x, side: str) -> torch.Tensor:
    """(S,) long lengths of the segments of a (S+1,) int32 offset table covering x's tokens."""
    name = f"cu_seqlens_{side}"
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.numel() < 1:
        raise PacksimError(f"{name} must be a 1D tensor (S+1,) of segment offsets starting at 0.")
    if cu.dtype != torch.int32:
        raise PacksimError(f"{name} has dtype {cu.dtype}: flash-attn takes int32 offsets; pass "
                           f"{name}.to(torch.int32).")
    if cu.device != x.device:
        raise PacksimError(f"{name} is on {cu.device} but {side} on {x.device}: put them on one device.")
    lengths = (cu[1:] - cu[:-1]).long()  # (S,)
    if int(cu[0]) != 0 or bool((lengths < 0).any()) or int(cu[-1]) != x.shape[0]:
        raise PacksimError(f"{name}={cu.tolist()} must rise from 0 to the {x.shape[0]} tokens of {side}: "
                           "every token in exactly one segment.")
    return lengths


def _check_max(max_seqlen, lengths, side: str) -> int:
    """The longest segment, after checking the caller's ``max_seqlen_{side}`` covers it."""
    longest = int(lengths.max()) if lengths.numel() else 0
    if max_seqlen is None or int(max_seqlen) < longest:
        raise PacksimError(f"max_seqlen_{side}={max_seqlen} but the longest segment of cu_seqlens_{side} "
                           f"holds {longest} tokens: pass the longest segment's length (or more).")
    return longest
