"""Does a trainer's loss weigh every counted token the same across gradient accumulation? Measured.

Over one optimizer step of G micro-batches the loss that should reach ``backward`` is the mean
over all counted labels: sum of token losses / total count. A trainer that divides each
micro-batch by its own count and then by G computes a mean of per-micro-batch means, which
over-weights the tokens of short micro-batches. :func:`loss_over_accumulation`
runs the trainer's own ``compute_loss`` on G real micro-batches, with the ``num_items_in_batch``
its ``get_batch_samples`` counts and the scaling its ``training_step`` applies, and compares the
sum with that token mean computed from the logits. Used by :func:`packsim.audit_trainer` (lesson 07).

Lessons: none directly.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager

import torch

from packsim.auditing.report import Finding
from packsim.core.loss import accumulated_loss, count_targets, token_losses

_REL_TOL = {torch.float32: 1e-4, torch.float64: 1e-8}  # else (half precision, autocast): 1e-2


@contextmanager
def _kept_state(trainer):
    """compute_loss logs metrics (TRL: _metrics, _total_train_tokens): restore them afterwards."""
    saved = {k: copy.deepcopy(getattr(trainer, k)) for k in ("_metrics", "_total_train_tokens")
             if hasattr(trainer, k)}
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(trainer, k, v)


def _is_scaled(trainer, num_items) -> bool:
    """Whether Trainer.training_step leaves the loss as is (True) or divides it by G (False)."""
    flag = getattr(trainer, "loss_is_scaled_for_ga", None)
    if flag is not None:
        return bool(flag)
    return bool((getattr(trainer, "model_accepts_loss_kwargs", False) and num_items is not None)
                or getattr(trainer, "compute_loss_func", None) is not None)


def loss_over_accumulation(trainer, raw_batches: list, forward, autocast) -> Finding:
    """Run ``trainer.compute_loss`` over one accumulation step of ``raw_batches`` and compare.

    ``forward(inputs) -> logits`` is the audit's forward (no labels); ``autocast()`` the trainer's
    autocast context. Returns a :class:`Finding` named ``loss_over_accumulation``.
    """
    G = max(int(getattr(trainer.args, "gradient_accumulation_steps", 1) or 1), 1)
    micro = raw_batches[:G]
    samples, num_items = trainer.get_batch_samples(iter(micro), len(micro), trainer.args.device)
    scaled = _is_scaled(trainer, num_items)
    got, sums, counts, dtype = 0.0, [], [], torch.float32
    with _kept_state(trainer), torch.no_grad():
        for batch in samples:
            inputs = trainer._prepare_inputs(batch)
            with autocast():
                loss = trainer.compute_loss(trainer.model, dict(inputs), num_items_in_batch=num_items)
                logits = forward(inputs)
            dtype = logits.dtype
            got += float(loss) / (1 if scaled else G)
            sums.append(float(token_losses(logits, inputs["labels"]).sum()))
            counts.append(count_targets(inputs["labels"]))
    want = float(accumulated_loss(sums, counts))  # the mean over all counted labels
    rel = abs(got - want) / max(abs(want), 1e-12)
    tol = _REL_TOL.get(dtype, 1e-2)
    short = f" (only {len(micro)} micro-batch(es) in the data)" if len(micro) < G else ""
    how = ("num_items_in_batch divides every micro-batch by the step's total count" if scaled else
           f"each micro-batch's loss is a mean over its own labels, then divided by {G}")
    evidence = (f"gradient_accumulation_steps={G}{short}, labels counted per micro-batch {counts}: the "
                f"trainer's loss is {got:.6g}, the mean over all counted labels is {want:.6g} "
                f"(relative difference {rel:.1e}); {how}")
    fix = ("let the loss see num_items_in_batch: a model forward with **kwargs (transformers models "
           "have it), or a compute_loss_func / compute_loss that divides by num_items_in_batch")
    mean_of_means = G > 1 and not scaled
    if rel > tol or mean_of_means:
        if mean_of_means and rel <= tol:
            evidence += ("; these micro-batches happen to agree, the steps with unequal label counts "
                         "will not")
        return Finding("loss_over_accumulation", "fail", evidence, fix)
    return Finding("loss_over_accumulation", "pass", evidence)
