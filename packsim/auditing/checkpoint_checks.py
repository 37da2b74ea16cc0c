"""Is the checkpoint the gate loaded the model it says it is? ``packsim audit --model DIR``.

Two ways a directory loads without an error and still is not what trains:

- weights that did not load: ``from_pretrained(..., output_loading_info=True)`` lists the
  parameters the checkpoint lacks (randomly initialised, e.g. a config of 3 layers saved with
  2 layers' weights: layer 2 is noise), the tensors it holds that the model has no place for
  (unused), and the ones whose shapes differ (re-initialised);
- a checkpoint that is not a causal language model: its ``config.architectures`` names no class
  of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` (a ``BertModel`` saved and loaded as
  ``BertLMHeadModel``), or an encoder family (one with a masked-LM head) whose config says
  ``is_decoder=False``, so its "causal" LM attends both ways.

Each is a :class:`~packsim.auditing.report.Finding` beside the verdict: a notice (what was
measured is the architecture, which these do not change), a failure under ``--strict``.

Lessons: none directly.
"""

from __future__ import annotations

__all__ = ["causal_lm_finding", "loading_finding"]


def _keys(keys, limit: int = 3) -> str:
    keys = sorted(str(k if isinstance(k, str) else k[0]) for k in keys)
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def loading_finding(info: dict | None, where: str, strict: bool):
    """The ``checkpoint_weights`` finding from ``from_pretrained``'s loading info; None when all loaded."""
    from packsim.auditing.preference import fallback_finding

    info = info or {}
    parts = []
    for key, what in (("missing_keys", "not in the checkpoint, so randomly initialised"),
                      ("mismatched_keys", "of another shape in the checkpoint, so randomly initialised"),
                      ("unexpected_keys", "in the checkpoint but not in the model, so unused")):
        keys = list(info.get(key) or ())
        if keys:
            parts.append(f"{len(keys)} weight(s) {what} ({_keys(keys)})")
    if not parts:
        return None
    return fallback_finding(
        "checkpoint_weights", where, "; ".join(parts) + ": the audited model is not the trained one (isolation "
        "depends on the architecture, measured as it is; the logits are not the checkpoint's)", "save the model "
        "with model.save_pretrained(DIR) from the model it was trained as, or make config.json match the weights "
        "(e.g. num_hidden_layers)", strict)


def _causal_classes() -> set[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names = set()
    for value in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        names.update((value,) if isinstance(value, str) else value)
    return names


def causal_lm_finding(model, where: str, strict: bool):
    """The ``causal_lm`` finding when the checkpoint is not a causal LM (see the module doc); None when it is."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    from packsim.auditing.preference import fallback_finding

    config = model.config
    saved = list(getattr(config, "architectures", None) or ())
    why = []
    if saved and not set(saved) & _causal_classes():
        why.append(f"it was saved as {', '.join(saved)}, not a causal LM, and AutoModelForCausalLM built "
                   f"{type(model).__name__} from its config")
    if getattr(config, "model_type", None) in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(
            config, "is_decoder", True):
        why.append(f"its config says is_decoder=False, so {type(model).__name__} attends both ways (an encoder)")
    if not why:
        return None
    return fallback_finding("causal_lm", where, "; ".join(why) + ": the audit measured a model this checkpoint "
                            "does not train as a causal LM", "audit a causal-LM checkpoint (config.architectures "
                            "...ForCausalLM), or set is_decoder=True in config.json if it is meant to be one",
                            strict)
