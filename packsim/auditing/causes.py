"""Likely causes, read from the probes and the batch: which field or kwarg breaks isolation.

Lessons: none directly (packsim.audit fills report.causes).
"""

from __future__ import annotations

import torch

from packsim.auditing.hybrid_findings import stateful_layers
from packsim.auditing.pipeline import ForwardOutput, Pipeline
from packsim.auditing.report import ProbeResult

_FA_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
# where seq_idx is read: the CUDA packages, or packsim's reference kernels on any CPU (the gate wires them)
_KERNELS = ("causal_conv1d and mamba_ssm, flash-linear-attention for gated DeltaNet, on a GPU; on CPU packsim's "
            "reference kernels: `packsim audit --model` wires them, in Python audit inside "
            "`with packsim.reference.hybrid_emulation.emulate_hybrid_kernels():`")


def likely_causes(p: Pipeline, probes: dict[str, ProbeResult], base_out: ForwardOutput) -> list[str]:
    causes = []
    leak = any(probes[n].failed for n in ("perturbation", "gradient", "attention_mass"))
    if leak:
        causes += _packed_leak_causes(p) if p.context["kind"] == "packed" else _dict_leak_causes(p, probes, base_out)
        causes += _layer_cause(probes["attention_mass"])
    causes += _loss_causes(probes["loss_coverage"])
    pos = probes["positions"]
    if pos.failed:
        how = pos.details.get("how", "do not restart at each example")
        causes.append(f"position_ids {how}, and this model uses absolute positions, so the examples "
                      "are computed at positions they never have alone: " + _POSITIONS_FIX)
    return causes


_POSITIONS_FIX = ("rebuild position_ids from the example lengths, 0 on each example's first token "
                  "(DataCollatorWithFlattening does).")
# what transformers does with position_ids that restart at the wrong token (masking_utils.
# find_packed_sequence_indices starts a sequence wherever position_ids[t] != position_ids[t-1] + 1)
_WRONG_RESTART = {
    "early": "the last token of each example is attended with the next example, and reads it",
    "late": "the first token of each example is attended with the previous example, and reads it",
    "wrong": "the sequences it attends within are not the examples",
    "values": "the examples are split where they start, but computed at positions they never have alone",
}


def _packed_leak_causes(p: Pipeline) -> list[str]:
    setup = p.context["setup"]
    if setup.mask == "causal" and setup.packed:
        return [f"setup {setup.name!r} uses mask='causal': one causal mask over the whole pack lets "
                "each example read the ones packed before it. Use a block-diagonal setup (e.g. "
                "'correct')."]
    return ["the setup is block-diagonal, yet attention still crosses examples: some attention "
            "call ignores the segments it is given (custom attention code, a patched layer)."]


def _dict_leak_causes(p: Pipeline, probes, base_out: ForwardOutput) -> list[str]:
    fields, impl = p.context["fields"], p.context["impl"] or "unknown"
    mask = fields.get("attention_mask")
    mask = mask if isinstance(mask, torch.Tensor) else None
    causes = []
    if mask is not None and mask.dim() == 4:
        if mask.dtype == torch.bool and impl == "eager":
            causes.append("a boolean 4D attention_mask reached eager attention, which ADDS the mask to "
                          "the scores (True/False become +1/+0), so it masks nothing: pass a float "
                          "mask with 0 where allowed and -inf (or finfo.min) elsewhere.")
        else:
            causes.append("the 4D attention_mask passed with the batch lets examples see each other: "
                          "check the boundaries it was built from (an off-by-one puts an example's "
                          "first token in the previous block).")
    elif impl.startswith("flash"):
        if mask is not None and bool((mask == 0).any()):
            causes.append("an attention_mask with zeros was passed, so flash attention unpadded from "
                          "it and ignored position_ids: drop it for a padding-free batch.")
    elif mask is not None:
        causes.append("an attention_mask was passed, so position_ids were ignored: transformers "
                      "finds packed examples from position_ids only when attention_mask is None "
                      "(even an all-ones mask turns that off). Drop attention_mask from the batch.")
    elif base_out.cache is not None:
        causes.append("transformers skipped packed-sequence detection because a cache was created "
                      "(use_cache is true in the call or in model.config, the default for a "
                      "hand-built config): pass use_cache=False.")
    elif not probes["positions"].details.get("reset"):
        pos = probes["positions"].details
        restart = pos.get("restart")
        if restart in _WRONG_RESTART:
            causes.append(f"position_ids {pos['how']}: transformers starts a sequence wherever position_ids "
                          f"restart (masking_utils.find_packed_sequence_indices), so {_WRONG_RESTART[restart]}: "
                          + _POSITIONS_FIX)
        else:
            causes.append("position_ids do not restart at each example, so transformers sees one long "
                          "sequence per row and applies a plain causal mask: pass per-example "
                          "position_ids (DataCollatorWithFlattening does).")
        if any(k in fields for k in _FA_KWARGS) and not impl.startswith("flash"):
            # the batch's cu_seq_lens_* mark the examples, but this path reads position_ids
            causes.append(f"note: the batch's cu_seq_lens_*/max_length_* do not isolate here: only flash "
                          f"attention reads them; {impl!r} isolates through position_ids or a mask.")
    causes += _state_causes(p, explained=bool(causes))
    if not causes and _no_pair_leaks(probes):
        causes.append(_numerical_cause(probes["perturbation"]))
    if not causes:
        causes.append("the batch looks right, yet attention crosses examples: check custom "
                      "attention code or patched layers.")
    return causes


def _state_causes(p: Pipeline, explained: bool) -> list[str]:
    """A conv / SSM state running across a boundary: the cause of a hybrid model's leak (with the
    boundary kwargs given, only when nothing else ``explained`` it)."""
    layers = stateful_layers(p.model)
    if not layers:
        return []
    fields = p.context["fields"]
    given = [k for k in ("seq_idx", "cu_seqlens") if fields.get(k) is not None]
    names = ", ".join(layers)
    if given and explained:
        return []
    if given:
        return [f"{names} carry a conv / SSM state along the row and the batch gives {', '.join(given)}, yet "
                "the examples leak: it does not reach a kernel that reads it on this path (the real packages or "
                "packsim's reference kernels; kernels_in_use(model) says which run): check that the forward "
                "passes it to every stateful layer (gated DeltaNet also needs cu_seq_lens_q)."]
    return [f"{names} carry a conv / SSM state along the row, and the batch gives no seq_idx: the state of "
            "one example runs into the next whatever the attention mask says. Pass seq_idx "
            f"(DataCollatorWithFlattening(return_seq_idx=True)) to kernels that read it ({_KERNELS}), or put "
            "one example per row (padding) instead of packing."]


def _no_pair_leaks(probes) -> bool:
    """Only the packed-vs-alone comparison failed: no example's tokens moved another's logits."""
    pert = probes["perturbation"]
    return (pert.failed and pert.details.get("leaking_pairs") == 0
            and not probes["gradient"].failed and not probes["attention_mass"].failed)


def _numerical_cause(pert: ProbeResult) -> str:
    worst = max(pert.details.get("alone", [0.0]), default=0.0)
    return (f"no example's tokens move another example's logits (0 leaking pairs), yet the examples packed "
            f"differ from the same examples alone by up to {worst:.3g} (tolerance {pert.threshold:.0e}): the "
            "difference does not come from another example: the packed forward computes them differently "
            "(round-off of a lower precision, a kernel that treats the row differently from its pieces); "
            "compare with a tolerance for the dtype the step computes in (tol=).")


def _layer_cause(attn: ProbeResult) -> list[str]:
    leaky, n = attn.details.get("leaking_layers"), attn.details.get("n_layers")
    if attn.failed and leaky and len(leaky) < n:
        return [f"only layer(s) {leaky} of {n} leak: look at what attention those layers receive "
                "(a patched or differently configured layer)."]
    return []


def _loss_causes(loss: ProbeResult) -> list[str]:
    fixes = {
        "shifted": "labels are shifted by one in the collator (labels[t] = input_ids[t+1]) and the model "
                   "shifts again inside its loss, so it learns to predict two tokens ahead: give labels "
                   "aligned with input_ids (labels[t] = input_ids[t], -100 where ignored) and let the "
                   "loss shift them (transformers' causal LMs do).",
        "across": "an example's last token is labelled with the next example's first token, so the loss "
                  "trains each example to predict the next one: label it with its own token (the loss "
                  "shifts) or -100.",
        "wrong_token": "some counted labels are neither their own token nor the next one: the labels were "
                       "built from other tokens (a different tokenization, truncation or row order); "
                       "build labels from the same input_ids.",
        "prompt": "labels count prompt tokens: set them to -100 (completion-only loss).",
        "padding": "labels count padding: set the labels of padding tokens to -100.",
        "boundary": "labels count the first token of each later example, predicted from the previous "
                    "example's last token: set it to -100 (DataCollatorWithFlattening does).",
        "response": "some response tokens are not counted: only prompt, padding and boundary "
                    "tokens should be -100.",
        "EOS": "the EOS label is -100, so the model never learns to stop: keep EOS counted.",
        "every": "every token inside the examples is counted, so prompts are in the loss: mask them "
                 "with -100; for language modelling (pretraining-style data, every token a target) "
                 "audit with objective='lm' (packsim.audit(..., objective='lm'), "
                 "audit_trainer(..., objective='lm'), packsim audit --objective lm).",
        "no_label": "no label in the batch is counted, so the step trains nothing: keep at least one "
                    "response token per example (raise max_length, drop prompt-only records).",
    }
    return [fixes[key] for key in loss.details.get("problems", [])]


