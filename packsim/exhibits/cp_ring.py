"""A context-parallel ring over a packed row, in one process: what each rank's attention computes
when the ring masks by document, and when it ignores the documents (axolotl#3608's trap).

Ring attention (context parallelism) splits the sequence over R ranks: rank r keeps the queries of
its shard, the key/value shards travel round the ring, and at step i rank r attends to the shard
of rank (r - i) % R, merging each block's output into what it has by the blocks' log-sum-exp.
:func:`ring_attention` runs exactly that schedule for every rank in one process (contiguous
shards, ``torch.tensor_split``), merging with torch's own merger (``_SDPAMerger`` of
``torch.distributed.tensor.experimental._context_parallel._attention`` in the installed torch); across
real processes the same schedule needs a process group (torch's ``context_parallel``). Each block is masked causal by position in the row,
and with ``documents=True`` also to the same document (the documents read from the restarting
``position_ids`` by transformers' own ``masking_utils.find_packed_sequence_indices``). In the
installed torch the SDPA ring takes ``is_causal`` and no mask (its efficient-attention ring raises
``NotImplementedError`` for an ``attn_bias``), so a ring built on it computes the causal mask over
the whole packed row: documents attend across each other, within a shard and across shard
boundaries. A document mask over a ring needs the flex path (a BlockMask).

:func:`on_ring` puts a transformers model on either ring (registered as attention implementations
``packsim_ring_documents_<R>`` / ``packsim_ring_causal_<R>``, no mask function: the ring masks),
:func:`step0_losses` measures a model's loss before any step under both.

Shapes: q (B, H, T, D), k/v (B, H_kv, T, D) (grouped-query heads expanded), position_ids (B, T),
R query shards of about T/R tokens, blocks (B, H, T/R, T/R), output (B, T, H, D).

Lessons: A6.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

__all__ = ["RING_RANKS", "on_ring", "ring_attention", "ring_name", "step0_losses"]

RING_RANKS = 2  # context-parallel ranks the ring emulates by default


def ring_attention(query, key, value, position_ids, *, ranks: int = RING_RANKS, documents: bool = True,
                   scaling: float | None = None) -> torch.Tensor:
    """Attention as a context-parallel ring of ``ranks`` computes it -> (B, T, H, D) (module doc).

    A block whose mask allows nothing is skipped, as the ring skips it; rank r's own block (step 0)
    always holds each query's own key, so every merge starts from a finite log-sum-exp.
    """
    from torch.distributed.tensor.experimental._context_parallel._attention import _SDPAMerger
    from transformers.masking_utils import find_packed_sequence_indices

    B, H, T, D = query.shape
    k = key.repeat_interleave(H // key.shape[1], dim=1)  # (B, H, T, D): GQA heads expanded
    v = value.repeat_interleave(H // value.shape[1], dim=1)
    docs = find_packed_sequence_indices(position_ids) if documents and position_ids is not None else None
    docs = torch.zeros(B, T, dtype=torch.long, device=query.device) if docs is None else docs  # (B, T)
    scale = D ** -0.5 if scaling is None else scaling
    shards = torch.arange(T, device=query.device).tensor_split(ranks)
    outs = []
    for r, qi in enumerate(shards):
        merger = _SDPAMerger(convert_to_f32=True, seq_dim=2)
        for step in range(ranks):
            ki = shards[(r - step) % ranks]  # the key/value shard that reaches rank r at this step
            allowed = (qi[:, None] >= ki[None, :])[None] & (docs[:, qi, None] == docs[:, None, ki])  # (B, Tq, Tk)
            if not bool(allowed.any()):
                continue
            scores = (query[:, :, qi] @ k[:, :, ki].transpose(-1, -2)).float() * scale  # (B, H, Tq, Tk)
            scores = scores.masked_fill(~allowed[:, None], float("-inf"))
            lse = scores.logsumexp(-1)  # (B, H, Tq); -inf where a query sees nothing in this block
            probs = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
            merger.step((probs @ v[:, :, ki].float()).to(query.dtype), lse, partial=False)
        outs.append(merger.results()[0])  # (B, H, Tq, D)
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous()  # (B, T, H, D)


def ring_name(documents: bool, ranks: int = RING_RANKS) -> str:
    """The attention implementation name of a ring, registered with transformers on first use."""
    from transformers import AttentionInterface

    name = f"packsim_ring_{'documents' if documents else 'causal'}_{ranks}"

    def attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        return ring_attention(query, key, value, kwargs.get("position_ids"), ranks=ranks, documents=documents,
                              scaling=scaling), None

    if name not in AttentionInterface._global_mapping:
        AttentionInterface.register(name, attend)
    return name


@contextmanager
def on_ring(model, documents: bool, ranks: int = RING_RANKS):
    """Inside: ``model`` (a transformers model) attends through the ring, masking by document or
    causal over the row; its attention implementation is put back on exit."""
    name = ring_name(documents, ranks)
    before = model.config._attn_implementation
    model.config._attn_implementation = name
    try:
        yield model
    finally:
        model.config._attn_implementation = before


def step0_losses(model, batch: dict, ranks: int = RING_RANKS) -> dict:
    """The loss of ``model`` on ``batch`` (a flattening collator's dict with labels (1, N)) before any
    step, through the ring causal over the row and the ring masking by document, and their ratio."""
    from packsim.core.loss import packed_cross_entropy

    fields = {k: v for k, v in batch.items() if k not in ("labels", "completion_mask")}
    losses = {}
    for documents in (False, True):
        with on_ring(model, documents, ranks), torch.no_grad():
            logits = model(**fields, use_cache=False).logits  # (1, N, V)
            losses[documents] = float(packed_cross_entropy(logits, batch["labels"]))
    return {"causal_ring": losses[False], "document_ring": losses[True], "ratio": losses[False] / losses[True]}
