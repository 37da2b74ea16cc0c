"""Context parallelism over packed documents, run on torch's own implementation (lesson 10).

One packed row of ``D`` documents, ``(1, T)``, is cut along ``T`` over the ``R`` ranks of a 1-D
``DeviceMesh``. Every rank holds the whole model and computes the logits of its ``T/R`` tokens,
``(1, T/R, V)``; inside each attention layer its queries ``(1, H, T/R, Dh)`` need the keys and
values of the whole row, and torch's context-parallel code (``torch.distributed.tensor.experimental``,
``_context_parallel/_attention.py`` and ``_load_balancer.py``) brings them in. Two layouts
(:data:`LAYOUTS`):

- ``"documents"`` (correct): torch's ``_PerDocumentHeadTailLoadBalancer`` cuts every document into
  ``2R`` chunks (so each is first padded to a multiple of ``2R``:
  :func:`~packsim.scaling.context_parallel.pad_lengths`) and orders them; each rank takes ``T/R`` of
  that order (:func:`rank_positions`). With one document that is
  :func:`packsim.scaling.context_parallel.zigzag_split`. With several, the order depends on the
  torch release (:mod:`packsim.core.upstream.torch_cp`): rank after rank, chunks ``r`` and
  ``2R-1-r`` of every document (``zigzag_split``), or, in the older release read, document after
  document, so that a rank holds the chunks of a few whole documents. ``_context_parallel_shard``
  shards the tokens, positions, targets and the document mask, a flex ``BlockMask`` that torch's
  ``_create_cp_block_mask`` rewrites for the rank's queries; in every layer torch's
  ``_ContextParallel`` flex hook all-gathers K and V (``flex_cp_allgather``: all-gather forward,
  reduce-scatter of their gradients backward).
- ``"ring_causal"`` (the trap of axolotl#3608, whose ``batch_ring`` path has no ``cu_seqlens``):
  torch's ring attention (``_templated_ring_attention`` and its backward) over torch's head-tail
  split of the whole row (``_HeadTailLoadBalancer``) with a plain causal mask. Positions still
  restart, but every document attends to the documents before it.

What of it runs on a CPU with gloo is measured by :func:`probe_torch_cp` on the installed torch (the
benchmark and the lesson print it; ``benchmarks/RESULTS.md`` records the versions it was read on):
``context_parallel()`` with SDPA raises (the CPU SDPA op has no context-parallel sharding
strategy; the dispatcher handles only the CUDA flash / efficient / cuDNN ops, none of which takes a
mask); flex attention's forward on the context-parallel ``BlockMask`` runs; its backward raises
(flex attention has no backward on CPU, compiled or not). So the ``"documents"`` run has two
kernels: ``"flex"`` (torch's flex attention, no gradient) and ``"dense"`` (the same context-parallel
``BlockMask``'s ``mask_mod`` evaluated per element and run through SDPA, differentiable); everything
around the kernel is torch's. The ring runs its forward and backward on torch's CPU flash op
(``aten._scaled_dot_product_flash_attention_for_cpu`` and its ``_backward``), tied to autograd here.

Shapes: a :class:`DocumentRow` is ``(1, T)``; a :class:`Shard` holds ``(1, T/R)`` tensors and
``held`` ``(T/R,)``: the row positions this rank holds.

Lessons: 10.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from transformers import AttentionInterface

from packsim.core.errors import PacksimError
from packsim.core.loss import IGNORE_INDEX
from packsim.scaling.context_parallel import pad_lengths

__all__ = ["LAYOUTS", "ATTN_NAME", "DocumentRow", "Shard", "document_row", "load_balancer", "rank_positions",
           "shard_row", "cp_logits", "cp_loss_backward", "unshard", "probe_torch_cp"]

LAYOUTS = ("documents", "ring_causal")
ATTN_NAME = "packsim_cp"  # the transformers attention implementation that calls Shard.attend
BLOCK = 128  # torch's _create_cp_block_mask needs T divisible by R x flex's default block size


@dataclass
class DocumentRow:
    """A packed row: documents padded to multiples of ``2R``, then one padding filler to ``T``.

    ``input_ids``, ``position_ids`` (restarting at 0 in every document), ``doc_ids`` and ``targets``
    are ``(1, T)``; ``targets[0, p]`` is the token position ``p`` predicts (shifted once, before any
    sharding: a shard's last token predicts a token another rank holds), -100 where not counted
    (prompts, padding, a document's last token). ``lengths`` (padded, filler last) and ``real``
    (the documents' own lengths) are per document.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    doc_ids: torch.Tensor
    targets: torch.Tensor
    lengths: list[int]
    real: list[int]
    cp_size: int

    @property
    def T(self) -> int:
        return int(self.input_ids.shape[1])

    def real_mask(self) -> torch.Tensor:
        """(T,) bool: the documents' own tokens (not their padding, not the filler)."""
        out = torch.zeros(self.T, dtype=torch.bool)
        start = 0
        for length, real in zip(self.lengths, self.real, strict=False):
            out[start : start + real] = True
            start += length
        return out


def document_row(examples, T: int, cp_size: int, pad_id: int = 0) -> DocumentRow:
    """The first examples (``.tokens``, ``.n_prompt``) that fit ``T`` once each is padded to a multiple
    of ``2 * cp_size``; completion-only targets (response and EOS). ``T`` must be a multiple of
    ``cp_size * 128`` (torch's context-parallel BlockMask)."""
    if isinstance(cp_size, bool) or not isinstance(cp_size, int) or cp_size < 1:
        raise PacksimError(f"cp_size must be a positive int (ranks sharing the row), got {cp_size!r}.")
    if T % (cp_size * BLOCK):
        raise PacksimError(f"T={T} must be a multiple of cp_size x {BLOCK} = {cp_size * BLOCK} "
                           "(torch's _create_cp_block_mask shards whole flex blocks).")
    ids, labels, lengths, real = [], [], [], []
    for ex in examples:
        tokens = list(ex.tokens)
        padded = int(pad_lengths([len(tokens)], cp_size)[0])
        if sum(lengths) + padded > T:
            break
        ids += tokens + [pad_id] * (padded - len(tokens))
        labels += [t if i >= ex.n_prompt else IGNORE_INDEX for i, t in enumerate(tokens)]
        labels += [IGNORE_INDEX] * (padded - len(tokens))
        lengths.append(padded)
        real.append(len(tokens))
    if not lengths:
        raise PacksimError(f"no example fits a row of {T} tokens once padded to a multiple of {2 * cp_size}.")
    filler = T - sum(lengths)
    if filler:
        ids += [pad_id] * filler
        labels += [IGNORE_INDEX] * filler
        lengths.append(filler)
    lens = torch.tensor(lengths)
    doc = torch.repeat_interleave(torch.arange(len(lengths)), lens)  # (T,)
    starts = torch.cumsum(lens, 0) - lens
    pos = torch.arange(T) - starts[doc]  # (T,): restarts at every document
    lab = torch.tensor(labels)
    targets = torch.full((T,), IGNORE_INDEX)
    same = doc[1:] == doc[:-1]
    targets[:-1] = torch.where(same, lab[1:], torch.tensor(IGNORE_INDEX))  # shifted inside a document only
    return DocumentRow(torch.tensor(ids)[None], pos[None], doc[None], targets[None], lengths, real, cp_size)


@dataclass
class Shard:
    """This rank's part of a row under one layout: ``input_ids``, ``position_ids``, ``targets`` and
    ``held`` (the row positions it holds, (T/R,)) plus what its attention needs."""

    layout: str
    mesh: object
    balancer: object
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    targets: torch.Tensor
    held: torch.Tensor
    block_mask: object = None
    kernel: str = "flex"
    _module: object = None
    _dense: torch.Tensor | None = field(default=None, repr=False)

    def reshard_ids(self, input_ids: torch.Tensor) -> Shard:
        """The same shard over other tokens ``(1, T)`` (the audit's perturbed rows)."""
        from torch.distributed.tensor.experimental._attention import _context_parallel_shard

        (ids,) = _context_parallel_shard(self.mesh, [input_ids], [1], load_balancer=self.balancer)
        return replace(self, input_ids=ids)

    def attend(self, query, key, value, scale):
        """(1, H, T/R, Dh) queries against the whole row's keys and values -> (1, H, T/R, Dh)."""
        if key.shape[1] != query.shape[1]:  # grouped-query attention: expand the K/V heads
            key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
            value = value.repeat_interleave(query.shape[1] // value.shape[1], dim=1)
        if self.layout == "ring_causal":
            return _RingCausal.apply(query, key, value, self.mesh.get_group(), scale)
        return self._module(query, key, value, self.block_mask, scale, self)


class _CPFlex(torch.nn.Module):
    """The attention call torch's ``_ContextParallel`` (flex) hooks: its pre-hook all-gathers K and V."""

    def forward(self, query, key, value, block_mask, scale, shard):
        if shard.kernel == "flex":
            from torch.nn.attention.flex_attention import flex_attention

            return flex_attention(query, key, value, block_mask=block_mask, scale=scale)
        if shard._dense is None:  # the context-parallel BlockMask, element by element: (1, 1, T/R, T)
            from torch.nn.attention.flex_attention import create_mask

            shard._dense = create_mask(block_mask.mask_mod, 1, 1, query.shape[2], key.shape[2], device=query.device)
        return F.scaled_dot_product_attention(query, key, value, attn_mask=shard._dense, scale=scale)


class _RingCausal(torch.autograd.Function):
    """torch's ring attention (forward and backward) on the CPU flash op, as one autograd node."""

    @staticmethod
    def forward(ctx, query, key, value, group, scale):
        from torch.distributed.tensor.experimental._attention import _templated_ring_attention

        op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        out, lse = _templated_ring_attention(group, 2, op, query, key, value, is_causal=True, dropout_p=0.0,
                                             scale=scale)[:2]
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.group, ctx.scale = group, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        from torch.distributed.tensor.experimental._context_parallel._attention import (
            _templated_ring_attention_backward,
        )

        query, key, value, out, lse = ctx.saved_tensors
        op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
        dq, dk, dv = _templated_ring_attention_backward(
            ctx.group, 2, op, grad_out.contiguous(), "grad_out", query, key, value, out, lse, True,
            dropout_p=0.0, scale=ctx.scale)[:3]
        return dq, dk, dv, None, None


def _cp_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention function: q (1, H, T/R, Dh) -> ((1, T/R, H, Dh), None) through the shard."""
    shard = kwargs.get("packsim_cp")
    if shard is None:
        raise PacksimError(f"attn_implementation={ATTN_NAME!r} needs packsim_cp=<Shard> (cp_logits passes it).")
    return shard.attend(query, key, value, scaling).transpose(1, 2).contiguous(), None


def load_balancer(lengths, cp_size: int, layout: str = "documents"):
    """torch's load balancer of ``layout`` for a row of documents ``lengths`` (each a multiple of 2 x cp)."""
    from torch.distributed.tensor.experimental._attention import (
        _HeadTailLoadBalancer,
        _PerDocumentHeadTailLoadBalancer,
    )

    if layout not in LAYOUTS:
        raise PacksimError(f"unknown layout {layout!r}: use one of {list(LAYOUTS)}.")
    lengths = [int(x) for x in lengths]
    if layout == "ring_causal":
        return _HeadTailLoadBalancer(sum(lengths), cp_size, "cpu")
    return _PerDocumentHeadTailLoadBalancer([lengths], cp_size, "cpu")


def rank_positions(lengths, cp_size: int, layout: str = "documents") -> list[list[int]]:
    """The row positions each rank holds under torch's balancer: its ``(1, T)`` indices cut in ``cp``."""
    index = load_balancer(lengths, cp_size, layout)._generate_indices()[0]  # (T,) rearranged row order
    return [chunk.tolist() for chunk in index.chunk(cp_size)]


def shard_row(row: DocumentRow, mesh, layout: str = "documents", kernel: str = "flex") -> Shard:
    """This rank's :class:`Shard` of ``row`` over ``mesh`` (R ranks), cut by torch's load balancer."""
    from torch.distributed.tensor.experimental._attention import (
        _context_parallel_shard,
        _ContextParallel,
    )
    from torch.distributed.tensor.parallel import parallelize_module

    balancer = load_balancer(row.lengths, row.cp_size, layout)
    R = mesh.size()
    if row.cp_size != R:
        raise PacksimError(f"the row was padded for cp_size={row.cp_size}, the mesh has {R} ranks.")
    held = torch.arange(row.T)[None]  # (1, T): sharded like the tokens, it says which positions a rank holds
    buffers = [row.input_ids, row.position_ids, row.targets, held]
    if layout == "ring_causal":
        ids, pos, tgt, held = _context_parallel_shard(mesh, buffers, [1] * 4, load_balancer=balancer)
        return Shard(layout, mesh, balancer, ids, pos, tgt, held[0], kernel="ring")
    from torch.nn.attention.flex_attention import create_block_mask

    doc = row.doc_ids[0]

    def document_causal(b, h, q_idx, kv_idx):  # global row positions: same document, causal
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    mask = create_block_mask(document_causal, 1, 1, row.T, row.T, device="cpu")
    ids, pos, tgt, held, cp_mask = _context_parallel_shard(mesh, [*buffers, mask], [1] * 4 + [2],
                                                           load_balancer=balancer)
    module = parallelize_module(_CPFlex(), mesh, _ContextParallel(
        seq_dim=2, attention_type=_ContextParallel.AttentionType.FLEX))
    return Shard(layout, mesh, balancer, ids, pos, tgt, held[0], cp_mask, kernel, module)


def cp_logits(model, shard: Shard, kernel: str | None = None) -> torch.Tensor:
    """This rank's logits (1, T/R, V): the model's own forward, attention through ``shard``."""
    AttentionInterface.register(ATTN_NAME, _cp_attention)
    if kernel is not None:
        shard.kernel = kernel
    previous = model.config._attn_implementation
    model.set_attn_implementation(ATTN_NAME)
    try:
        return model(input_ids=shard.input_ids, position_ids=shard.position_ids, use_cache=False,
                     packsim_cp=shard).logits
    finally:
        model.set_attn_implementation(previous)


def cp_loss_backward(model, shard: Shard) -> tuple[float, torch.Tensor]:
    """One step's loss on R ranks: every rank's summed token loss over the step's global count.

    Each rank backpropagates its part (the K/V gradients reach their owners inside torch's
    collectives); the parameter gradients are then summed over the ranks, as FSDP over the
    context-parallel mesh would. Returns (the loss, the same on every rank; this rank's logits).
    """
    kernel = "dense" if shard.layout == "documents" else "ring"
    logits = cp_logits(model, shard, kernel)  # (1, T/R, V)
    counted = shard.targets != IGNORE_INDEX
    local = F.cross_entropy(logits[0].float(), shard.targets[0], ignore_index=IGNORE_INDEX, reduction="sum")
    sums = torch.tensor([float(local.detach()), float(counted.sum())], dtype=torch.float64)
    group = shard.mesh.get_group()
    dist.all_reduce(sums, group=group)
    (local / sums[1].item()).backward()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
    return float(sums[0] / sums[1]), logits.detach()


def unshard(shard: Shard, local: torch.Tensor) -> torch.Tensor:
    """Every rank's ``(1, T/R, ...)`` gathered back into row order ``(1, T, ...)`` (torch's unshard)."""
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard

    return context_parallel_unshard(shard.mesh, [local.contiguous()], [1], load_balancer=shard.balancer)[0]


def probe_torch_cp(mesh) -> dict[str, str]:
    """Which parts of torch's context parallelism run here: ``"ok"`` or the exception, one line each.

    A collective: every rank of ``mesh`` calls it. Small random q, k, v ``(1, 2, 128 R, 16)``.
    """
    import torch.distributed.distributed_c10d as c10d
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import (
        _context_parallel_shard,
        _PerDocumentHeadTailLoadBalancer,
    )
    from torch.distributed.tensor.experimental._context_parallel import flex_cp_allgather
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    R, T = mesh.size(), BLOCK * mesh.size()
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, T, 16, generator=gen) for _ in range(3))
    out: dict[str, str] = {}

    def attempt(name, fn):
        try:
            fn()
            out[name] = "ok"
        except Exception as err:  # noqa: BLE001 - the probe reports what torch raised
            out[name] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"

    def sdpa():
        bufs = [q.clone(), k.clone(), v.clone()]
        with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2, 2, 2]):
            F.scaled_dot_product_attention(*bufs, is_causal=True)

    attempt("context_parallel() + SDPA (causal)", sdpa)
    lengths = [T // 2, T // 2]
    doc = torch.repeat_interleave(torch.arange(2), torch.tensor(lengths))
    mask = create_block_mask(lambda b, h, i, j: (doc[i] == doc[j]) & (i >= j), 1, 1, T, T, device="cpu")
    lb = _PerDocumentHeadTailLoadBalancer([lengths], R, "cpu")
    qs, ks, vs, cp_mask = _context_parallel_shard(mesh, [q, k, v, mask], [2, 2, 2, 2], load_balancer=lb)
    pg = c10d._get_process_group_name(mesh.get_group())
    kv = flex_cp_allgather(ks, vs, 2, pg)  # torch's K/V all-gather, as its _ContextParallel flex hook calls it
    attempt("flex_attention forward, context-parallel BlockMask", lambda: flex_attention(qs, *kv, block_mask=cp_mask))
    attempt("flex_attention backward", lambda: flex_attention(qs.requires_grad_(), *kv, block_mask=cp_mask).sum().backward())
    qr = q.chunk(R, dim=2)[dist.get_rank(mesh.get_group())].requires_grad_()
    attempt("ring attention forward + backward (CPU flash op)",
            lambda: _RingCausal.apply(qr, qr.detach(), qr.detach(), mesh.get_group(), None).sum().backward())
    return out
