"""The gated delta rule over packed sequences (``cu_seqlens``): the reference kernel (packsim, pure
torch) for flash-linear-attention's ``chunk_gated_delta_rule`` / ``fused_recurrent_gated_delta_rule``.

Gated DeltaNet (Qwen3-Next's linear-attention layers) keeps a state S (K x V) per value head::

    S_t = exp(g_t) S_{t-1};  S_t += k_t (beta_t (v_t - S_t^T k_t))^T;  o_t = S_t^T (scale * q_t)

Packed, S runs from one example into the next unless it restarts at every boundary. fla restarts
it where ``cu_seqlens`` (S+1,) says (batch 1, one initial / final state per sequence);
transformers' torch fallbacks (``torch_chunk_gated_delta_rule`` in ``models/qwen3_next``) have no
such argument. This module cuts the packed row at ``cu_seqlens`` into a batch of sequences (padded
at the end with g = 0, beta = 0: the state does not move), runs them side by side, and puts the
outputs back in place. The chunked form (UT transform in chunks of 64, one Python loop over chunks,
every sequence and head at once) serves ``chunk_gated_delta_rule``; the recurrent form (one loop
over time, every sequence and head at once: the decode kernel's own shape, one token per step)
serves ``fused_recurrent_gated_delta_rule``.

Shapes (fla's): q, k (B, T, H, K), v (B, T, HV, V) with HV % H == 0 (each q/k head serves HV/H
consecutive value heads), g and beta (B, T, HV), initial_state (N, HV, K, V) with N = B, or the
number of sequences with cu_seqlens (then B == 1); returns o (B, T, HV, V) in q's dtype and the
final state (N, HV, K, V) fp32 (float64 for float64 inputs) or None.

Lessons: none directly (:mod:`packsim.reference.hybrid_emulation` wires it into transformers).
"""

from __future__ import annotations

import torch

from packsim.core.errors import PacksimError
from packsim.reference.conv import REFERENCE_KERNEL, upcast

__all__ = ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"]

CHUNK = 64  # fla's chunk length


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _to_sequences(q, k, v, g, beta, scale, initial_state, cu_seqlens, l2norm, what):
    """(q, k, v, g, beta) as (N, HV, L, ·) fp32 sequences, the initial state, and the function that puts
    (N, HV, L, V) outputs back as (B, T, HV, V)."""
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:2] != q.shape[:2] or v.shape[2] % q.shape[2] \
            or g.shape != v.shape[:3] or (beta is not None and beta.shape != v.shape[:3]):
        raise PacksimError(f"{what}: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, g {tuple(g.shape)} "
                           "do not fit; pass q, k (B, T, H, K), v (B, T, HV, V) with HV a multiple of H, g and "
                           "beta (B, T, HV).")
    B, T, H, K = q.shape
    HV = v.shape[2]
    beta = torch.ones_like(g) if beta is None else beta
    q, k = (upcast(t).repeat_interleave(HV // H, dim=2) for t in (q, k))  # (B, T, HV, K)
    if l2norm:
        q, k = _l2norm(q), _l2norm(k)
    q = q * (K ** -0.5 if scale is None else scale)
    v, g, beta = upcast(v), upcast(g), upcast(beta)
    if cu_seqlens is None:
        lay = lambda t: t.transpose(1, 2)  # noqa: E731  (B, T, HV, ·) -> (B, HV, T, ·)
        seqs = [lay(t) for t in (q, k, v, g, beta)]
        N, back = B, (lambda o: o.transpose(1, 2))
    else:
        cu = torch.as_tensor(cu_seqlens, device=q.device).long()
        if B != 1 or cu.dim() != 1 or cu.numel() < 2 or int(cu[0]) != 0 or int(cu[-1]) != T \
                or bool((cu[1:] < cu[:-1]).any()):
            raise PacksimError(f"{what}: cu_seqlens {cu.tolist()} must run 0 .. T={T} non-decreasing over one "
                               f"packed row (batch 1, got {B}); flatten the batch and pass its cumulative lengths.")
        lengths = cu[1:] - cu[:-1]  # (N,)
        N, Lmax = lengths.numel(), max(int(lengths.max()), 1)
        offs = torch.arange(Lmax, device=q.device)  # (Lmax,)
        valid = offs[None] < lengths[:, None]  # (N, Lmax)
        idx = (cu[:-1, None] + offs[None]).clamp(max=max(T - 1, 0))  # (N, Lmax)

        def lay(t):  # (1, T, HV, ·) -> (N, HV, Lmax, ·), zeros past each sequence's end
            picked = t[0][idx] * valid.view(N, Lmax, *([1] * (t.dim() - 2)))
            return picked.transpose(1, 2)

        seqs = [lay(t) for t in (q, k, v, g, beta)]

        def back(o):  # (N, HV, Lmax, V) -> (1, T, HV, V)
            return o.transpose(1, 2)[valid][None]

    if initial_state is not None and tuple(initial_state.shape) != (N, HV, K, v.shape[-1]):
        raise PacksimError(f"{what}: initial_state {tuple(initial_state.shape)} must be (N, HV, K, V) = "
                           f"{(N, HV, K, v.shape[-1])}: one state per sequence.")
    S0 = None if initial_state is None else upcast(initial_state)
    return seqs, S0, back


def _chunked(q, k, v, g, beta, S):
    """Chunked gated delta rule on (N, HV, L, ·) fp32 sequences: (o (N, HV, L, V), final S (N, HV, K, V))."""
    N, HV, L, K = k.shape
    Vd = v.shape[-1]
    pad = (-L) % CHUNK
    if pad:  # g = 0, beta = 0, k = 0 past the end: the state neither decays nor moves
        q, k, v, g, beta = (torch.cat([t, t.new_zeros(*t.shape[:2], pad, *t.shape[3:])], dim=2)
                            for t in (q, k, v, g, beta))
    c = (L + pad) // CHUNK
    q, k, v = (t.reshape(N, HV, c, CHUNK, -1) for t in (q, k, v))  # (N, HV, c, C, ·)
    g, beta = (t.reshape(N, HV, c, CHUNK) for t in (g, beta))  # (N, HV, c, C)
    gam = g.cumsum(-1)  # (N, HV, c, C): log decay from the chunk's start
    lower = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
    decay = torch.exp((gam[..., :, None] - gam[..., None, :]).masked_fill(~lower, float("-inf")))  # (N,HV,c,C,C)
    # u_i + beta_i sum_{j<i} e^{gam_i - gam_j} (k_i.k_j) u_j = beta_i v_i - beta_i e^{gam_i} S0^T k_i
    system = (beta[..., None] * (k @ k.transpose(-1, -2)) * decay).tril(-1) \
        + torch.eye(CHUNK, device=q.device)  # (N, HV, c, C, C), unit lower triangular
    from_v = torch.linalg.solve_triangular(system, beta[..., None] * v, upper=False, unitriangular=True)
    from_s = torch.linalg.solve_triangular(system, (beta * gam.exp())[..., None] * k, upper=False, unitriangular=True)
    attn = (q @ k.transpose(-1, -2)) * decay  # (N, HV, c, C, C)
    S = q.new_zeros(N, HV, K, Vd) if S is None else S
    out = []
    for i in range(c):
        u = from_v[:, :, i] - from_s[:, :, i] @ S  # (N, HV, C, V)
        out.append(gam[:, :, i, :, None].exp() * (q[:, :, i] @ S) + attn[:, :, i] @ u)
        to_end = (gam[:, :, i, -1:] - gam[:, :, i]).exp()[..., None]  # (N, HV, C, 1)
        S = gam[:, :, i, -1].exp()[..., None, None] * S + (k[:, :, i] * to_end).transpose(-1, -2) @ u
    return torch.cat(out, dim=2)[:, :, :L], S


def _recurrent(q, k, v, g, beta, S):
    """Token-by-token gated delta rule on (N, HV, L, ·) fp32 sequences: (o (N, HV, L, V), final S)."""
    N, HV, L, K = k.shape
    S = q.new_zeros(N, HV, K, v.shape[-1]) if S is None else S
    out = []
    for t in range(L):  # one loop over time; every sequence and head at once
        S = S * g[:, :, t].exp()[..., None, None]
        delta = (v[:, :, t] - (S * k[:, :, t, :, None]).sum(-2)) * beta[:, :, t, None]  # (N, HV, V)
        S = S + k[:, :, t, :, None] * delta[:, :, None, :]
        out.append((S * q[:, :, t, :, None]).sum(-2))  # (N, HV, V)
    return torch.stack(out, dim=2) if out else v.new_zeros(N, HV, 0, v.shape[-1]), S


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, cu_seqlens=None):
    """Gated delta rule, chunked, restarting at every ``cu_seqlens`` boundary: the reference kernel
    (packsim, pure torch) for ``fla.ops.gated_delta_rule.chunk_gated_delta_rule``.

    q, k (B, T, H, K), v (B, T, HV, V), g (log decay, <= 0) and beta (B, T, HV); scale defaults to
    K**-0.5; ``use_qk_l2norm_in_kernel`` L2-normalises q and k (eps 1e-6) first. Returns
    (o (B, T, HV, V) in q's dtype, final state (N, HV, K, V) fp32 or None).
    """
    seqs, S0, back = _to_sequences(q, k, v, g, beta, scale, initial_state, cu_seqlens, use_qk_l2norm_in_kernel,
                                   "chunk_gated_delta_rule")
    o, S = _chunked(*seqs, S0)
    return back(o).to(q.dtype).contiguous(), (S if output_final_state else None)  # contiguous: callers .view it


chunk_gated_delta_rule.__packsim_kernel__ = REFERENCE_KERNEL


def fused_recurrent_gated_delta_rule(q, k, v, g=None, beta=None, scale=None, initial_state=None,
                                     output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None):
    """Gated delta rule, token by token, restarting at every ``cu_seqlens`` boundary: the reference
    kernel (packsim, pure torch) for ``fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule``.

    Same shapes and returns as :func:`chunk_gated_delta_rule` (g None: no decay). A Python loop over
    time (every sequence and head vectorised): the decode step's kernel, one token per call.
    """
    g = v.new_zeros(v.shape[:3], dtype=torch.promote_types(v.dtype, torch.float32)) if g is None else g
    seqs, S0, back = _to_sequences(q, k, v, g, beta, scale, initial_state, cu_seqlens, use_qk_l2norm_in_kernel,
                                   "fused_recurrent_gated_delta_rule")
    o, S = _recurrent(*seqs, S0)
    return back(o).to(q.dtype).contiguous(), (S if output_final_state else None)  # contiguous: callers .view it


fused_recurrent_gated_delta_rule.__packsim_kernel__ = REFERENCE_KERNEL
