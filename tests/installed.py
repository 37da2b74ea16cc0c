"""Facts about the installed transformers, measured here (not read from packsim's verdicts), for the
tests whose expectation differs per version in the supported window (5.16.1 ... 5.25.0)."""

from __future__ import annotations

from functools import cache


@cache
def wrapper_refuses() -> bool:
    """Whether transformers' kernel wrapper raises when seq_idx reaches its torch fallback (5.24 on);
    5.16.1 drops it silently."""
    import torch
    from transformers.integrations.hub_kernels import use_kernel_func_from_hub_with_fallback

    wrapper = use_kernel_func_from_hub_with_fallback("causal_conv1d_fn", "packsim_no_such_package")(
        lambda x, seq_idx=None: x)
    try:
        wrapper(torch.zeros(1), seq_idx=torch.zeros(1))
    except ValueError:
        return True
    return False


@cache
def reads_seq_idx(family: str, backbone: bool = False) -> bool:
    """Whether seq_idx reaches ``family``'s stateful layers through its ForCausalLM forward (or, with
    ``backbone``, its base model's): on the reference kernels, the logits with seq_idx differ from those
    without. False: bit-equal, the field never arrives (Mamba2ForCausalLM <= 5.24; Mamba2 and Falcon-H1
    in 5.16.1 drop it before their mixers)."""
    import torch

    from packsim.exhibits.hybrid_traps import build_frontier, frontier_batch
    from packsim.reference.hybrid_emulation import emulate_hybrid_kernels

    model = build_frontier(family).eval()
    batch, seq = frontier_batch("positions")
    forward = (lambda **b: model.lm_head(model.base_model(**b)[0])) if backbone else (lambda **b: model(**b).logits)
    with torch.no_grad(), emulate_hybrid_kernels():
        with_idx = forward(input_ids=batch["input_ids"], seq_idx=seq.to(torch.int32), use_cache=False)
        without = forward(input_ids=batch["input_ids"], use_cache=False)
    return not torch.equal(with_idx, without)


def mamba2_drops_seq_idx() -> bool:
    """Mamba2ForCausalLM's forward never gets seq_idx to a mixer (measured)."""
    return not reads_seq_idx("mamba2")


@cache
def trl_padding_free_emits_seq_idx() -> bool:
    """Whether TRL's own padding-free collator (trl.trainer.sft_trainer.DataCollatorForLanguageModeling,
    padding_free=True) returns seq_idx: TRL 1.16 does, 1.9 gives position_ids only."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    out = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)([{"input_ids": [5, 6, 7]},
                                                                              {"input_ids": [8, 9]}])
    return "seq_idx" in out
