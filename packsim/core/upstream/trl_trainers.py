"""TRL's trainers: what packsim reads of their private machinery, on the installed version.

The forward an SFTTrainer leaves on its model (read from TRL 1.9.0 and 1.16.0,
``trl/trainer/sft_trainer.py`` and ``trl/trainer/utils.py``):

- 1.9.0: ``SFTConfig.__post_init__`` sets ``loss_type="chunked_nll"`` unless ``use_liger_kernel``,
  and ``SFTTrainer.__init__`` then calls ``_patch_chunked_ce_lm_head(model, ...)``, which sets the
  instance's ``model.forward`` to its inner ``_chunked_ce_forward``. Given ``labels`` or
  ``shift_labels``, that forward runs ``model.base_model`` and returns a ``_ChunkedCELMHeadOutput``
  whose loss comes from ``last_hidden_state`` and the ``lm_head`` weight in chunks (``_chunk``:
  ``h.float() @ w.float().t()``, under the trainer's autocast) and whose ``logits`` are None.
  Without both, it calls the model's own forward unchanged (logits);
- 1.16.0: ``"chunked_nll"`` is a deprecated alias of ``"nll"`` (``sft_config.py``) and nothing
  chunks. ``SFTTrainer.__init__`` calls ``add_fused_lm_head`` (``utils.py``), whose
  ``_fused_forward`` takes its fused path only when called with ``fused_lm_head=True`` (what
  ``SFTTrainer.compute_loss`` passes). Any other call, with labels or without, is the model's own
  forward.

accelerate's mixed precision (``Accelerator.prepare_model``, 1.13.0 and 1.16.0) wraps
``model.forward`` again (the autocast decorator, then ``convert_outputs_to_fp32``), and each
wrapper keeps ``__wrapped__``. :func:`chunked_loss_forward` finds TRL 1.9's forward behind those
wrappers by its qualified name, and :func:`logit_fields` drops the fields that switch it to its
loss-only output. The audit's forwards then get the logits of the model's own forward, as TRL 1.9
runs it without labels (and as every call runs on 1.16).

:func:`kept_metrics` puts back the state that SFT / DPO / GRPO ``compute_loss`` and
``_prepare_inputs`` append to (``_metrics``, ``_total_train_tokens``: set in each trainer's
``__init__``, 1.9.0 and 1.16.0). :func:`without_aux_loss` turns off the MoE router load-balancing
term for a call: SFTTrainer sets ``aux_loss_enabled`` (1.9.0: ``is_moe`` and a non-zero
``router_aux_loss_coef``; 1.16.0: a text config with ``output_router_logits``) and sets
``output_router_logits`` on the model's text config, so ``compute_loss`` adds
``router_aux_loss_coef * aux_loss`` to the token mean (and a transformers MoE forward adds it to its
own loss when ``config.output_router_logits``); 1.16.0's ``compute_loss`` divides that term by
``current_gradient_accumulation_steps`` when given ``num_items_in_batch``, which is why
:mod:`packsim.auditing.accumulation` sets that attribute as the training loop does. tests/test_upstream_trl_trainers.py pins each fact per
installed version.

Not reaches, read from 1.9.0 and 1.16.0 for the audits of the trainers that are not packed (the
public behaviour :mod:`packsim.auditing.preference` and :mod:`packsim.auditing.grpo` rely on):
``DPOTrainer.__init__`` (``dpo_trainer.py``) logs a warning and sets ``self.padding_free = False``
("Falling back to standard padding") on both; ``GRPOConfig`` (``grpo_trainer.py``) has no
``padding_free`` / ``packing`` field on both, and ``_get_per_token_logps_and_entropies`` runs the
model on padded rows, one completion per row: 1.16.0 calls ``model(input_ids, attention_mask,
labels, fused_lm_head=True)``, 1.9.0 calls ``model(input_ids, attention_mask, use_cache=False)`` and
takes ``selective_log_softmax`` of the logits.

Lessons: none directly (packsim.auditing.trainer and packsim.auditing.pipeline call it).
"""

from __future__ import annotations

import copy
from contextlib import contextmanager

__all__ = ["CHUNKED_FORWARD", "LOSS_FIELDS", "METRICS", "chunked_loss_forward", "kept_metrics",
           "logit_fields", "without_aux_loss"]

# (module, qualified name) of TRL 1.9's patched forward (_patch_chunked_ce_lm_head's inner function)
CHUNKED_FORWARD = ("trl.trainer.sft_trainer", "_patch_chunked_ce_lm_head.<locals>._chunked_ce_forward")
# the fields that switch it to the loss-only output (logits=None): its keyword parameters, TRL 1.9.0
LOSS_FIELDS = ("labels", "shift_labels")
# the trainer state compute_loss / _prepare_inputs log to (SFT, DPO, GRPO; 1.9.0 and 1.16.0)
METRICS = ("_metrics", "_total_train_tokens")


def _forwards(model):
    """The functions behind ``model.forward`` (the instance's, then each ``__wrapped__`` below it)."""
    fn = getattr(model, "forward", None)
    fn = getattr(fn, "__func__", fn)
    for _ in range(16):  # accelerate stacks two wrappers; a loop would be someone else's bug
        if fn is None:
            return
        yield fn
        fn = getattr(fn, "__wrapped__", None)


def chunked_loss_forward(model) -> bool:
    """Whether ``model`` (or the model inside a PEFT wrapper) runs TRL 1.9's chunked-CE forward."""
    inner = getattr(model, "get_base_model", None)
    models = [model] + ([inner()] if callable(inner) else [])
    return any((getattr(f, "__module__", None), getattr(f, "__qualname__", None)) == CHUNKED_FORWARD
               for m in models for f in _forwards(m))


def logit_fields(model, fields: dict) -> tuple[dict, str]:
    """``fields`` for a forward that must return logits, and the note the report gives ('' if none).

    Where ``model`` runs TRL 1.9's chunked-CE forward, the fields of :data:`LOSS_FIELDS` are left
    out: with them it returns no logits, and without them it runs the model's own forward."""
    dropped = [k for k in LOSS_FIELDS if k in fields]
    if not dropped or not chunked_loss_forward(model):
        return fields, ""
    kept = {k: v for k, v in fields.items() if k not in LOSS_FIELDS}
    return kept, (f" ({' and '.join(dropped)} left out: TRL's chunked-CE forward, loss_type='chunked_nll', "
                  "returns no logits with them, and without them it runs the model's own forward)")


@contextmanager
def kept_metrics(trainer):
    """Put back the metrics a TRL trainer logs (:data:`METRICS`) once the audit's calls are done."""
    saved = {k: copy.deepcopy(getattr(trainer, k)) for k in METRICS if hasattr(trainer, k)}
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(trainer, k, v)


@contextmanager
def without_aux_loss(trainer):
    """Inside: ``trainer.compute_loss`` is the token mean alone, no MoE router aux loss (TRL's
    ``aux_loss_enabled`` off, ``output_router_logits`` off on the model's configs); yields whether
    there was one. Everything is put back on exit."""
    config = getattr(getattr(trainer, "model", None), "config", None)
    configs = [c for c in (config, getattr(config, "text_config", None), getattr(config, "get_text_config",
                                                                              lambda: None)())
               if c is not None and getattr(c, "output_router_logits", False)]
    configs = list({id(c): c for c in configs}.values())
    had = bool(getattr(trainer, "aux_loss_enabled", False)) or bool(configs)
    saved = getattr(trainer, "aux_loss_enabled", None)
    for c in configs:
        c.output_router_logits = False
    if saved is not None:
        trainer.aux_loss_enabled = False
    try:
        yield had
    finally:
        for c in configs:
            c.output_router_logits = True
        if saved is not None:
            trainer.aux_loss_enabled = saved
