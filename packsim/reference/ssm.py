"""The Mamba2 SSD scan with its state reset where ``seq_idx`` changes: the reference kernel (packsim,
pure torch) for ``mamba_ssm``'s ``mamba_chunk_scan_combined`` and ``mamba_split_conv1d_scan_combined``.

A Mamba2 mixer carries a state ``h`` (per head: headdim x d_state) along the row::

    h_t = exp(dt_t * A) * h_{t-1} + dt_t * x_t B_t^T        y_t = h_t C_t + D * x_t

Packed, ``h`` runs from one example into the next unless it restarts from zero at each boundary.
The CUDA kernels do that when ``seq_idx`` (B, T) marks the example of every token; transformers'
torch fallback (``mamba2_chunk_scan`` in e.g. ``models/bamba/modeling_bamba.py``) has no such
argument. This module computes the scan in chunks of ``chunk_size`` (SSD): inside a chunk the
quadratic form (C_t . B_s times the decay between s and t, masked where the two tokens' seq_idx
differ), then one sequential pass over chunks (a Python loop over chunks, every batch row, head
and channel at once) that hands the state on and drops it where the example changes. As in
mamba_ssm, tokens are joined by seq_idx equality (give it non-decreasing along the row) and an
``initial_states`` belongs to the row's tokens with seq_idx 0.

Shapes (mamba_ssm's): x (b, l, h, p), dt (b, l, h), A (h,), B / C (b, l, g, n) with h % g == 0,
D (h,) or (h, p), z (b, l, h, p), dt_bias (h,), initial_states (b, h, p, n), seq_idx (b, l),
cu_seqlens (S+1,) (only with return_varlen_states, b == 1). Fused: zxbcdt (b, l, 2*d_mlp + dim +
conv_dim + h) with dim = h*p and conv_dim = dim + 2*g*n, conv1d_weight (conv_dim, W). "fp32" below
reads float64 for float64 inputs (:func:`packsim.reference.conv.upcast`).

Lessons: none directly (:mod:`packsim.reference.hybrid_emulation` wires it into transformers).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from packsim.core.errors import PacksimError
from packsim.reference.conv import REFERENCE_KERNEL, causal_conv1d_fn, upcast

__all__ = ["mamba_chunk_scan_combined", "mamba_split_conv1d_scan_combined"]


def _pad_len(t: torch.Tensor, pad: int, dim: int = 1) -> torch.Tensor:
    """Zeros appended along ``dim`` (the sequence)."""
    if pad == 0:
        return t
    shape = list(t.shape)
    shape[dim] = pad
    return torch.cat([t, t.new_zeros(shape)], dim=dim)


def _check_scan(x, dt, A, B, C, seq_idx):
    if x.dim() != 4 or dt.shape != x.shape[:3] or A.shape != (x.shape[2],) or B.dim() != 4 or B.shape != C.shape \
            or B.shape[:2] != x.shape[:2] or x.shape[2] % B.shape[2]:
        raise PacksimError(f"mamba_chunk_scan_combined: x {tuple(x.shape)}, dt {tuple(dt.shape)}, A {tuple(A.shape)}, "
                           f"B {tuple(B.shape)}, C {tuple(C.shape)} do not fit; pass x (b, l, h, p), dt (b, l, h), "
                           "A (h,), B and C (b, l, g, n) with h a multiple of g.")
    if seq_idx is not None and tuple(seq_idx.shape) != tuple(x.shape[:2]):
        raise PacksimError(f"mamba_chunk_scan_combined: seq_idx {tuple(seq_idx.shape)} must be (b, l) = "
                           f"{tuple(x.shape[:2])}; pass one example index per token.")


def _scan(x, dt, A, B, C, chunk_size, initial_states, seq):
    """(y (b, l, h, p) fp32 without D / z, final state (b, h, p, n), per-token state helper)."""
    b, T, h, p = x.shape
    Q = int(chunk_size)
    pad = (-T) % Q
    rep = h // B.shape[2]
    B = upcast(B).repeat_interleave(rep, dim=2)  # (b, l, h, n)
    C = upcast(C).repeat_interleave(rep, dim=2)  # (b, l, h, n)
    n = B.shape[-1]
    xdt = upcast(x) * dt[..., None]  # (b, l, h, p)
    # padding tokens: dt = 0 (no decay, no input) and the row's last example index (no reset)
    seq = torch.cat([seq, seq[:, -1:].expand(b, pad)], dim=1) if pad else seq  # (b, L)
    xdt, dt, B, C = (_pad_len(t, pad) for t in (xdt, dt, B, C))
    c = (T + pad) // Q
    xdt, B, C = (t.reshape(b, c, Q, h, -1) for t in (xdt, B, C))  # (b, c, Q, h, p|n)
    seq = seq.reshape(b, c, Q)  # (b, c, Q)
    Acs = torch.cumsum(dt.reshape(b, c, Q, h) * upcast(A), dim=2)  # (b, c, Q, h): log decay from chunk start

    # 1. inside each chunk: y_t += sum_{s<=t, same example} (C_t . B_s) exp(Acs_t - Acs_s) dt_s x_s
    keep = (seq[:, :, :, None] == seq[:, :, None, :]) & torch.ones(Q, Q, dtype=torch.bool, device=x.device).tril()
    diff = Acs[:, :, :, None, :] - Acs[:, :, None, :, :]  # (b, c, Q_t, Q_s, h)
    decay = torch.exp(diff.masked_fill(~keep[..., None], float("-inf")))  # (b, c, Q, Q, h)
    scores = torch.einsum("bclhn,bcshn->bclsh", C, B) * decay  # (b, c, Q, Q, h)
    y = torch.einsum("bclsh,bcshp->bclhp", scores, xdt)  # (b, c, Q, h, p)

    # 2. what each chunk adds to the state at its last token (only that token's example counts)
    last = seq[:, :, -1]  # (b, c)
    to_end = torch.exp(Acs[:, :, -1:, :] - Acs) * (seq == last[..., None])[..., None]  # (b, c, Q, h)
    added = torch.einsum("bclh,bclhn,bclhp->bchpn", to_end, B, xdt)  # (b, c, h, p, n)

    # 3. hand the state from chunk to chunk, dropped where the example changes
    S = x.new_zeros(b, h, p, n, dtype=xdt.dtype) if initial_states is None else upcast(initial_states)
    owner = torch.zeros(b, dtype=torch.long, device=x.device)  # the example the carried state belongs to
    entering, owners, y_off = [], [], []
    for i in range(c):
        entering.append(S)
        owners.append(owner)
        carry = (seq[:, i] == owner[:, None]).float()  # (b, Q): tokens that continue the carried state
        read = torch.einsum("blhn,bhpn->blhp", C[:, i], S) * torch.exp(Acs[:, i])[..., None]  # (b, Q, h, p)
        y_off.append(read * carry[:, :, None, None])
        goes_on = (last[:, i] == owner).float()[:, None, None, None]  # (b, 1, 1, 1)
        S = S * torch.exp(Acs[:, i, -1])[:, :, None, None] * goes_on + added[:, i]
        owner = last[:, i]
    y = (y + torch.stack(y_off, dim=1)).reshape(b, c * Q, h, p)[:, :T]  # (b, l, h, p)
    parts = dict(decay=decay, B=B, xdt=xdt, Acs=Acs, seq=seq, entering=torch.stack(entering, 1),
                 owners=torch.stack(owners, 1), Q=Q)
    return y, S, parts


def _states_at(parts, pos: torch.Tensor) -> torch.Tensor:
    """The state right after token ``pos`` (N,) of row 0: (N, h, p, n)."""
    ci, t = pos // parts["Q"], pos % parts["Q"]
    inside = torch.einsum("nsh,nshd,nshp->nhpd", parts["decay"][0, ci, t], parts["B"][0, ci], parts["xdt"][0, ci])
    carry = (parts["seq"][0, ci, t] == parts["owners"][0, ci]).float()  # (N,)
    start = parts["entering"][0, ci] * (torch.exp(parts["Acs"][0, ci, t]) * carry[:, None])[:, :, None, None]
    return inside + start


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                              return_final_states=False, return_varlen_states=False):
    """The Mamba2 SSD scan whose state restarts where ``seq_idx`` changes: the reference kernel (packsim,
    pure torch) for ``mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined``.

    dt becomes clamp(softplus?(dt + dt_bias), *dt_limit) in fp32; y = scan + D * x, times silu(z)
    when z is given. Returns y (b, l, h, p) in x's dtype; with ``return_final_states`` also the state
    after the last token (b, h, p, n) fp32; with ``return_varlen_states`` (b == 1, cu_seqlens and
    seq_idx given) also each sequence's last state (S, h, p, n), in mamba_ssm's tuple order.
    """
    _check_scan(x, dt, A, B, C, seq_idx)
    b, T = x.shape[:2]
    dt = upcast(dt)
    if dt_bias is not None:
        dt = dt + upcast(dt_bias)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = dt.clamp(min=dt_limit[0], max=dt_limit[1])  # (b, l, h)
    seq = torch.zeros(b, T, dtype=torch.long, device=x.device) if seq_idx is None else seq_idx.long()
    y, final, parts = _scan(x, dt, A, B, C, chunk_size, initial_states, seq)
    if D is not None:
        Df = upcast(D)
        y = y + upcast(x) * (Df[:, None] if Df.dim() == 1 else Df)
    if z is not None:
        y = y * F.silu(upcast(z))
    out = [y.to(x.dtype).contiguous()]  # contiguous: callers .view it
    if return_final_states:
        out.append(final)
    if return_varlen_states:
        if cu_seqlens is None or seq_idx is None or b != 1:
            raise PacksimError("mamba_chunk_scan_combined: return_varlen_states needs batch 1 with cu_seqlens and "
                               "seq_idx of the same packing; pass both (DataCollatorWithFlattening gives them).")
        ends = torch.as_tensor(cu_seqlens, device=x.device).long()[1:] - 1  # (S,)
        out.append(_states_at(parts, ends))
    return out[0] if len(out) == 1 else tuple(out)


mamba_chunk_scan_combined.__packsim_kernel__ = REFERENCE_KERNEL


def _gated_rmsnorm(y, z, weight, eps, group, norm_before_gate):
    """RMSNorm over groups of ``group`` channels, gated by silu(z) before or after: y, z (b, l, dim) fp32."""
    gate = F.silu(upcast(z))
    if not norm_before_gate:
        y = y * gate
    shaped = y.reshape(*y.shape[:-1], -1, group)  # (b, l, g, dim/g)
    y = (shaped * torch.rsqrt(shaped.pow(2).mean(-1, keepdim=True) + eps)).reshape(y.shape) * upcast(weight)
    return y * gate if norm_before_gate else y


def mamba_split_conv1d_scan_combined(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size,
                                     initial_states=None, seq_idx=None, dt_limit=(0.0, float("inf")),
                                     return_final_states=False, activation="silu", rmsnorm_weight=None,
                                     rmsnorm_eps=1e-6, outproj_weight=None, outproj_bias=None, headdim=None,
                                     ngroups=1, norm_before_gate=True):
    """The fused Mamba2 mixer body (split, conv1d, SSD scan, gated RMSNorm, out projection), each step
    stopping at ``seq_idx`` changes: the reference kernel (packsim, pure torch) for
    ``mamba_ssm.ops.triton.ssd_combined.mamba_split_conv1d_scan_combined``.

    zxbcdt (b, l, 2*d_mlp + dim + conv_dim + h) splits into (MLP part, z, xBC, dt); xBC runs through
    :func:`~packsim.reference.conv.causal_conv1d_fn` with ``seq_idx``, then
    :func:`mamba_chunk_scan_combined` with dt_softplus. Returns (b, l, out_dim) (or (out, final state)).
    """
    if D.dim() == 1 and headdim is None:
        raise PacksimError("mamba_split_conv1d_scan_combined: D is (nheads,), so pass headdim.")
    nheads = D.shape[0]
    headdim = D.shape[1] if D.dim() == 2 else int(headdim)
    b, T, width = zxbcdt.shape
    dim = nheads * headdim
    dstate = (conv1d_weight.shape[0] - dim) // ngroups // 2
    d_mlp = (width - 2 * dim - 2 * ngroups * dstate - nheads) // 2
    if d_mlp < 0 or width != 2 * d_mlp + 2 * dim + 2 * ngroups * dstate + nheads:
        raise PacksimError(f"mamba_split_conv1d_scan_combined: zxbcdt width {width} does not split into z, xBC "
                           f"and dt for {nheads} heads x {headdim}, {ngroups} groups x d_state {dstate}; pass the "
                           "mixer's in_proj output.")
    zx0, z, xBC, dt = torch.split(zxbcdt, [2 * d_mlp, dim, dim + 2 * ngroups * dstate, nheads], dim=-1)
    xBC = causal_conv1d_fn(xBC.transpose(1, 2), conv1d_weight, conv1d_bias, seq_idx=seq_idx,
                           activation=activation).transpose(1, 2)  # (b, l, conv_dim)
    x, B, C = torch.split(xBC, [dim, ngroups * dstate, ngroups * dstate], dim=-1)
    z4 = z.reshape(b, T, nheads, headdim)
    result = mamba_chunk_scan_combined(
        x.reshape(b, T, nheads, headdim), dt, A, B.reshape(b, T, ngroups, dstate), C.reshape(b, T, ngroups, dstate),
        chunk_size, D=D, z=z4 if rmsnorm_weight is None else None, dt_bias=dt_bias, initial_states=initial_states,
        seq_idx=seq_idx, dt_softplus=True, dt_limit=dt_limit, return_final_states=return_final_states)
    y, final = result if return_final_states else (result, None)
    y = upcast(y).reshape(b, T, dim)  # (b, l, dim)
    if rmsnorm_weight is not None:
        y = _gated_rmsnorm(y, z, rmsnorm_weight, rmsnorm_eps, dim // ngroups, norm_before_gate)
    if d_mlp > 0:
        x0, z0 = upcast(zx0).chunk(2, dim=-1)
        y = torch.cat([F.silu(x0) * z0, y], dim=-1)  # (b, l, d_mlp + dim)
    y = y.to(zxbcdt.dtype).contiguous()
    if outproj_weight is not None:
        y = F.linear(y.to(outproj_weight.dtype), outproj_weight, outproj_bias)
    return (y, final) if return_final_states else y


mamba_split_conv1d_scan_combined.__packsim_kernel__ = REFERENCE_KERNEL
