"""Audit a TRL ``GRPOTrainer`` as it is configured: does it pack, and do the summed log-probs of its
own generated completions match each completion run alone?

GRPO weighs each completion's log-probs by its advantage, so the check is
:func:`packsim.auditing.logprobs.audit_logprobs` on a batch the trainer generates itself. What TRL's
GRPOTrainer does on every TRL of the tested window (``trl/trainer/grpo_trainer.py``; the versions
read and what differs between them: :mod:`packsim.core.upstream.trl_trainers`): ``GRPOConfig`` has
no ``padding_free`` / ``packing`` field; ``_compute_loss`` concatenates ``prompt_ids`` (left-padded)
and ``completion_ids`` (right-padded) into one row per completion with ``attention_mask =
cat(prompt_mask, completion_mask)``, and ``_get_per_token_logps_and_entropies`` runs the model on
those rows: padded, one sequence per row, never packed, whether it asks the model for a fused LM
head's log-probs or for logits it log-softmaxes itself. The audit runs the same rows through the
model's plain forward (a fused head only fuses ``lm_head`` with the log-softmax). Batch
shapes: prompt_ids (B, P), completion_ids (B, C), the audited rows (B, P + C), B = prompts x
``num_generations``, grouped by prompt.

Lessons: none directly.
"""

from __future__ import annotations

import torch

from packsim.auditing.logprobs import group_names
from packsim.auditing.preference import PreferenceAudit, fallback_finding, trainer_logprobs
from packsim.auditing.report import Finding
from packsim.core.boundaries import find_boundaries
from packsim.core.errors import PacksimError
from packsim.core.upstream.trl_trainers import kept_metrics

__all__ = ["audit_grpo_trainer", "grpo_rows", "is_grpo"]


def is_grpo(trainer) -> bool:
    return any(c.__name__ == "GRPOTrainer" for c in type(trainer).__mro__)


def grpo_rows(trainer) -> dict:
    """One batch the trainer generates itself, as ``_compute_loss`` feeds it to the model:
    input_ids, attention_mask, completion_mask (B, P + C).

    Generated in eval mode (no buffering, rows stay grouped by prompt) under a forked RNG, and the
    trainer's logged metrics are restored, so a run after the audit is the run it would have been.
    """
    model = trainer.model
    was = model.training
    try:
        model.eval()
        device = next(model.parameters()).device
        with kept_metrics(trainer), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            raw = next(iter(trainer.get_train_dataloader()))
            out = trainer._prepare_inputs(raw)
    finally:
        model.train(was)
    prompt, completion = out["prompt_mask"], out["completion_mask"]
    return {"input_ids": torch.cat([out["prompt_ids"], out["completion_ids"]], 1),  # (B, P + C)
            "attention_mask": torch.cat([prompt, completion], 1),
            "completion_mask": torch.cat([torch.zeros_like(prompt), completion], 1)}


def audit_grpo_trainer(trainer, *, tol: float | None = None, strict: bool = False) -> PreferenceAudit:
    """The packing finding and the log-prob check on completions the trainer generates (CPU is fine)."""
    if not is_grpo(trainer):
        raise PacksimError(f"audit_grpo_trainer takes a trl.GRPOTrainer, got {type(trainer).__name__}.")
    args = trainer.args
    requested = {k: getattr(args, k) for k in ("padding_free", "packing") if hasattr(args, k)}
    rows = grpo_rows(trainer)
    fields = {k: v for k, v in rows.items() if k != "completion_mask"}
    seq = find_boundaries(fields, missing="rows").seq_ids  # (B, T): attention_mask zeros are padding
    per_row = max(len(torch.unique(r[r >= 0])) for r in seq)
    B, T = rows["input_ids"].shape
    asked = ", ".join(f"args.{k}={v}" for k, v in requested.items()) or \
        f"{type(args).__name__} has no padding_free / packing option"
    where = (f"{asked}; the first generated batch is {B} row(s) of {T} tokens (prompt left-padded, completion "
             f"right-padded), at most {per_row} sequence(s) per row")
    if any(requested.values()) and per_row == 1:
        finding = fallback_finding("packing", where, "packing was asked for and the rows are padded (nothing "
                                   "leaks; nothing is packed)", "expect padded rows (turn the option off to say "
                                   "so), or pack with a trainer that supports it and audit that", strict)
    else:
        finding = Finding("packing", "pass", f"{where}: {'packed' if per_row > 1 else 'padded, not packed'}, "
                                             "as configured")
    size = int(getattr(args, "num_generations", 0) or 0)
    names = group_names(B // size, size) if per_row == 1 and size and B % size == 0 else None
    # one completion per row is how TRL builds these rows (the module doc), not a guess from the
    # tokens: a generated completion may hold a BOS / EOS id the special-token rule would split at;
    # under the trainer's autocast, so the tolerance follows the dtype its step computes in
    return PreferenceAudit([finding], trainer_logprobs(trainer, rows, seq=seq, names=names, tol=tol))
