"""Facts about the installed transformers, measured here (not read from packsim), for the tests whose
expectation differs per version in the supported window."""

from __future__ import annotations

from functools import cache


@cache
def mamba2_drops_seq_idx() -> bool:
    """Whether ``Mamba2ForCausalLM`` drops ``seq_idx`` before its mixers: on the reference kernels, its
    logits with seq_idx are bit-equal to those without (True on transformers <= 5.24, False on 5.25)."""
    import torch

    from packsim.core.reference_hybrid import emulate_hybrid_kernels
    from packsim.exhibits.hybrid_traps import build_frontier, frontier_batch

    model = build_frontier("mamba2").eval()
    batch, seq = frontier_batch("positions")
    ids = batch["input_ids"]
    with torch.no_grad(), emulate_hybrid_kernels():
        with_idx = model(input_ids=ids, seq_idx=seq.to(torch.int32), use_cache=False).logits
        without = model(input_ids=ids, use_cache=False).logits
    return bool(torch.equal(with_idx, without))
