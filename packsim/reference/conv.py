"""A causal depthwise conv1d that stops at every packed boundary: the reference kernel (packsim, pure
torch) for the ``causal_conv1d`` package's ``causal_conv1d_fn`` / ``causal_conv1d_update``.

Hybrid models (Mamba2 mixers, LFM2's short convolution, gated DeltaNet) run a width-W depthwise
convolution along the row before their recurrent state. Packed, tap ``j`` of token ``t`` reads
token ``t - (W-1) + j``: across a boundary that is the previous example's token. The CUDA kernel
drops such a tap when ``seq_idx`` says the two tokens belong to different examples; transformers'
torch fallback (``causal_conv1d_fn`` in e.g. ``models/bamba/modeling_bamba.py``) has no ``seq_idx``
and convolves straight across. This module does what the CUDA kernel does, in plain torch, on
any device: all taps at once (``unfold``), masked where ``seq_idx`` differs. The three reference
kernels (conv, ``ssm``, ``delta``) compute in fp32, or in float64
for float64 inputs (:func:`upcast`: a float64 audit is held to float64 round-off).

Contract (as transformers calls the package):
  ``causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None,
  return_final_states=False, final_states_out=None, activation=None)``
  x (B, D, T), weight (D, W), bias (D,), seq_idx (B, T) int, initial_states (B, D, W-1);
  returns out (B, D, T) in x's dtype, or (out, final_states (B, D, W-1)).
  ``causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
  conv_state_indices=None)``: x (B, D) or (B, D, L), conv_state (B, D, S >= W-1) updated in place
  (shifted left by L, the new columns at the end); returns out shaped like x.

Lessons: none directly (:mod:`packsim.reference.hybrid_emulation` wires it into transformers).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from packsim.core.errors import PacksimError

__all__ = ["REFERENCE_KERNEL", "causal_conv1d_fn", "causal_conv1d_update"]


def upcast(t: torch.Tensor) -> torch.Tensor:
    """``t`` in the dtype the reference kernels compute in: float32 for float32 / bf16 / fp16 inputs,
    float64 for float64 ones (a float64 audit is held to float64 round-off, not fp32's)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))

REFERENCE_KERNEL = "reference kernel (packsim, pure torch)"


def _activate(out: torch.Tensor, activation) -> torch.Tensor:
    if activation in (None, False):
        return out
    if activation in ("silu", "swish", True):
        return F.silu(out)
    raise PacksimError(f"activation={activation!r}: causal_conv1d supports None, 'silu' or 'swish'; pass one of those.")


def _check(x: torch.Tensor, weight: torch.Tensor, what: str) -> None:
    if weight.dim() != 2 or x.dim() < 2 or x.shape[1] != weight.shape[0]:
        raise PacksimError(f"{what}: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not fit; pass x "
                           "(B, D, T) and weight (D, W) with the same D (a Conv1d weight: .weight.squeeze(1)).")


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                     final_states_out=None, activation=None):
    """Causal depthwise conv1d along T whose taps never cross a ``seq_idx`` change: the reference kernel
    (packsim, pure torch) for ``causal_conv1d.causal_conv1d_fn``.

    x (B, D, T), weight (D, W), bias (D,) or None, seq_idx (B, T) int (the example index of every
    token; None: one sequence per row), initial_states (B, D, W-1) (the W-1 columns before x; not
    with seq_idx, as in the CUDA kernel). Computes in fp32, returns out (B, D, T) in x's dtype, and
    with ``return_final_states`` also the last W-1 input columns (B, D, W-1) (written to
    ``final_states_out`` when given).
    """
    _check(x, weight, "causal_conv1d_fn")
    if seq_idx is not None and (initial_states is not None or return_final_states):
        raise PacksimError("causal_conv1d_fn: seq_idx cannot go with initial_states / return_final_states "
                           "(the CUDA kernel refuses it too); pass seq_idx alone for a packed row.")
    B, D, T = x.shape
    W = weight.shape[-1]
    xf = upcast(x)  # (B, D, T)
    head = xf.new_zeros(B, D, W - 1) if initial_states is None else upcast(initial_states)  # (B, D, W-1)
    padded = torch.cat([head, xf], dim=-1)  # (B, D, T+W-1)
    windows = padded.unfold(-1, W, 1)  # (B, D, T, W): tap j of token t reads token t-(W-1)+j
    taps = windows * upcast(weight)[None, :, None, :]  # (B, D, T, W)
    if seq_idx is not None:
        if tuple(seq_idx.shape) != (B, T):
            raise PacksimError(f"causal_conv1d_fn: seq_idx {tuple(seq_idx.shape)} must be (B, T) = {(B, T)}; "
                               "pass one example index per token.")
        src = F.pad(seq_idx.long(), (W - 1, 0), value=-1).unfold(-1, W, 1)  # (B, T, W): example of each tap
        same = src == seq_idx.long()[:, :, None]  # (B, T, W)
        taps = taps * same[:, None].to(taps.dtype)
    out = taps.sum(-1)  # (B, D, T)
    if bias is not None:
        out = out + upcast(bias)[None, :, None]
    out = _activate(out, activation).to(x.dtype)
    if not return_final_states:
        return out
    final = padded[..., -(W - 1):].to(x.dtype) if W > 1 else padded[..., :0].to(x.dtype)  # (B, D, W-1)
    if final_states_out is not None:
        final_states_out.copy_(final)
        final = final_states_out
    return out, final


causal_conv1d_fn.__packsim_kernel__ = REFERENCE_KERNEL


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None):
    """One decode step (or L steps) of the causal conv from a cached state: the reference kernel
    (packsim, pure torch) for ``causal_conv1d.causal_conv1d_update``.

    x (B, D) or (B, D, L), conv_state (B, D, S) with S >= W-1: the last S input columns, updated in
    place (the L new columns enter at the end). Returns out shaped like x, in x's dtype.
    """
    if cache_seqlens is not None or conv_state_indices is not None:
        raise PacksimError("causal_conv1d_update: the reference kernel keeps a plain (B, D, S) state; "
                           "pass cache_seqlens=None and conv_state_indices=None.")
    squeeze = x.dim() == 2
    x3 = x[..., None] if squeeze else x  # (B, D, L)
    _check(x3, weight, "causal_conv1d_update")
    L, W, S = x3.shape[-1], weight.shape[-1], conv_state.shape[-1]
    if S < W - 1 or conv_state.shape[:2] != x3.shape[:2]:
        raise PacksimError(f"causal_conv1d_update: conv_state {tuple(conv_state.shape)} must be (B, D, S >= "
                           f"{W - 1}) for x {tuple(x3.shape)} and width {W}; pass the cache's conv state.")
    joined = torch.cat([upcast(conv_state), upcast(x3)], dim=-1)  # (B, D, S+L)
    conv_state.copy_(joined[..., -S:].to(conv_state.dtype))
    windows = joined[..., -(L + W - 1):].unfold(-1, W, 1)  # (B, D, L, W)
    out = (windows * upcast(weight)[None, :, None, :]).sum(-1)  # (B, D, L)
    if bias is not None:
        out = out + upcast(bias)[None, :, None]
    out = _activate(out, activation).to(x.dtype)
    return out[..., 0] if squeeze else out


causal_conv1d_update.__packsim_kernel__ = REFERENCE_KERNEL
