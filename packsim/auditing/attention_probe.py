"""The attention-mass probe: the share of each query's attention that lands outside its example.

Attention probabilities (L, B, H, T, T) come from packsim's own attention for a PackedBatch
(:func:`packsim.core.model.attention_maps`, dense, so capped at ``B*T*T`` = 16M per head), or from
the pipeline's forward with ``output_attentions=True`` for a collator dict: the baseline forward
itself when it was recorded with them (:mod:`packsim.auditing.shared_pass`), else one more forward
whose logits must equal the baseline's. sdpa and flash return no probabilities: the probe is
skipped and says to use eager. Result: (L, H) largest outside share per layer and head.

Lessons: none directly (they call packsim.audit, which runs the probe).
"""

from __future__ import annotations

import torch

from packsim.auditing.pipeline import ForwardOutput, Pipeline
from packsim.auditing.report import ProbeResult
from packsim.core.attention_share import outside_share
from packsim.core.upstream.loggers import quiet_no_attention_weights

_MAX_DENSE = 2**24  # attention_maps builds (L, B, H, T, T) densely: cap B*T*T (16M floats per head)


def _attention_probs(p: Pipeline, base: torch.Tensor, tol,
                     recorded: ForwardOutput | None) -> tuple[torch.Tensor | None, str, str]:
    """Attention probabilities (L, B, H, T, T) of the pipeline's forward, or (None, why, source).

    ``recorded``: the baseline forward's own output, run with ``output_attentions=True`` (so it is
    the same forward by construction); None runs one more forward asking for them.
    """
    if p.context["kind"] == "packed":
        from packsim.core.model import attention_maps

        B, T = p.input_ids.shape
        if B * T * T > _MAX_DENSE:
            return None, (f"rows of {T} tokens are too long for dense attention maps (B*T*T = "
                          f"{B * T * T:.1e} per head); audit a shorter batch for this probe"), ""
        try:
            return attention_maps(p.model, p.context["batch"]), "", "packsim.core.model.attention_maps"
        except Exception as err:  # noqa: BLE001 - any model that cannot run packsim's attention
            return None, f"packsim.core.model.attention_maps failed: {type(err).__name__}: {err}", ""
    impl = p.context["impl"]
    out = recorded if recorded is not None and _probabilities(recorded.attentions, p.seq) else None
    if out is None:
        try:
            with torch.no_grad(), quiet_no_attention_weights():
                out = p.run(output_attentions=True)
        except Exception as err:  # noqa: BLE001 - report, don't crash: this probe is optional
            return None, f"output_attentions=True failed: {type(err).__name__}: {err}", ""
    att = out.attentions
    if not att or any(a is None for a in att):
        return None, (f"attn_implementation={impl!r} returns no attention probabilities "
                      "(run the model with attn_implementation='eager' to get this probe)"), ""
    if out is not recorded and (out.logits.float() - base).abs().max() > tol:
        return None, "output_attentions=True changed the logits, so it is not the same forward", ""
    return torch.stack([a.detach().float() for a in att]), "", "output_attentions=True"


def _probabilities(att, seq: torch.Tensor) -> bool:
    """Whether recorded attention weights (L x (B, H, T, T)) are probabilities: each real query's sum 1.

    Dropout in train mode rescales the weights a forward returns (kept ones / (1 - p)); those
    maps are not shares, so the probe asks a forward of its own then, as without a recorded one.
    """
    if not att or any(a is None for a in att):
        return True  # nothing recorded: the probe says so
    real = (seq >= 0).to(att[0].device)  # (B, T)
    for a in att:
        if a.dim() != 4 or tuple(a.shape[::2]) != tuple(seq.shape):  # not (B, H, T, T): the probe's own forward
            return False
        sums = a.detach().float().sum(-1).transpose(1, 2)[real]  # (n_real, H)
        half = a.dtype in (torch.float16, torch.bfloat16)
        if sums.numel() and float((sums - 1).abs().max()) > (1e-2 if half else 1e-4):
            return False
    return True


def attention_mass(p: Pipeline, base, tol,
                   recorded: ForwardOutput | None = None) -> tuple[ProbeResult, torch.Tensor | None]:
    """Per (layer, head): the largest share of one query's attention on keys outside its example.

    ``recorded``: the baseline's output when it ran with ``output_attentions=True`` (dict pipelines).
    """
    probs, why, source = _attention_probs(p, base, tol, recorded)
    if probs is None:
        return ProbeResult("attention_mass", "skipped", None, tol, why), None
    seq = p.seq.to(probs.device)  # (B, T)
    outside = outside_share(probs, seq, real_only=True)  # (L, B, H, T): padding queries 0
    per_lh = outside.amax(dim=(1, 3)).cpu()  # (L, H)
    worst = float(per_lh.max())
    L, H = per_lh.shape
    leaky = [int(layer) for layer in range(L) if per_lh[layer].max() > tol]
    flat = int(per_lh.argmax())
    where = f"worst: layer {flat // H} head {flat % H}" if worst > tol else "no layer leaks"
    summary = (f"largest share of a query's attention outside its example ({source}, {L} layers x "
               f"{H} heads; {where})")
    return ProbeResult("attention_mass", "fail" if worst > tol else "pass", worst, tol, summary,
                       {"leaking_layers": leaky, "n_layers": L}), per_lh
