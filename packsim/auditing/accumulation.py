"""Does a trainer's loss weigh every counted token the same across gradient accumulation? Measured.

Over one optimizer step of G micro-batches the loss that should reach ``backward`` is the mean
over all counted labels: sum of token losses / total count. A trainer that divides each
micro-batch by its own count and then by G computes a mean of per-micro-batch means, which
over-weights the tokens of short micro-batches. :func:`loss_over_accumulation`
runs the trainer's own ``compute_loss`` on G real micro-batches, with the ``num_items_in_batch``
its ``get_batch_samples`` counts and the scaling its ``training_step`` applies, and compares the
sum with that token mean computed from the logits. Where they differ because ``num_items_in_batch``
counts other labels than the loss predicts (transformers counts position-0 labels for models whose
``loss_type`` is None, e.g. GPT-2), the finding says so and how to fix it. Used by
:func:`packsim.audit_trainer` (lesson 07).

Lessons: none directly.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from packsim.auditing.report import Finding
from packsim.core.loss import IGNORE_INDEX, accumulated_loss, count_targets, token_losses
from packsim.core.upstream.trl_trainers import kept_metrics, without_aux_loss

_REL_TOL = {torch.float32: 1e-4, torch.float64: 1e-8}  # else (half precision, autocast): 1e-2


def _is_scaled(trainer, num_items) -> bool:
    """Whether Trainer.training_step leaves the loss as is (True) or divides it by G (False)."""
    flag = getattr(trainer, "loss_is_scaled_for_ga", None)
    if flag is not None:
        return bool(flag)
    return bool((getattr(trainer, "model_accepts_loss_kwargs", False) and num_items is not None)
                or getattr(trainer, "compute_loss_func", None) is not None)


def _miscount(trainer, evidence: str, items: int, predicted: int, row_starts: int) -> tuple[str, str]:
    """num_items_in_batch counts other labels than the loss predicts: say which, and why.

    transformers' Trainer counts ``labels[..., 1:]`` only when ``model.loss_type`` maps to
    ``ForCausalLMLoss`` (``Trainer.__init__``'s ``_loss_shifts_labels``, read by
    ``Trainer._get_num_items_in_batch``); ``PreTrainedModel.__init__`` derives ``loss_type`` from
    the class name, so ``GPT2LMHeadModel`` (and CTRL, OpenAI-GPT, XLNet, XLM ... *LMHeadModel
    classes) get ``None``, and the Trainer counts every label, while the loss still shifts
    (``loss_function`` falls back to ``ForCausalLMLoss``) and never predicts position 0.
    """
    model = getattr(trainer, "model", None)
    loss_type = getattr(model, "loss_type", "?")
    shifts = getattr(trainer, "_loss_shifts_labels", None)
    evidence += (f"; but num_items_in_batch is {items} while the loss predicts {predicted} labels "
                 f"(labels[..., 1:] != -100)")
    if items - predicted == row_starts and shifts is False:
        evidence += (f": the difference is the {row_starts} label(s) at position 0 of a row, which no token "
                     f"predicts; {type(model).__name__}.loss_type is {loss_type!r}, so the Trainer "
                     "(_get_num_items_in_batch, _loss_shifts_labels) counts labels unshifted, while the "
                     "loss shifts, and every step's loss is scaled by "
                     f"{predicted}/{items}")
        fix = ("set model.loss_type = 'ForCausalLM' before building the Trainer (it then counts "
               "labels[..., 1:]), or have the collator set the label at each row's position 0 to -100")
    else:
        fix = ("make num_items_in_batch count exactly the labels the loss predicts: labels[..., 1:] != -100 "
               "for a loss that shifts, or pass shift_labels in the batch")
    return evidence, fix


@contextmanager
def _in_the_step(trainer, steps: int):
    """``trainer.current_gradient_accumulation_steps`` as the training loop sets it for the step
    (transformers' ``Trainer._inner_training_loop``: ``len(batch_samples)``, on both ends of the tested
    window, which .ci/window runs), which ``compute_loss`` may read before any training (TRL's
    SFTTrainer divides a MoE aux loss by it: :mod:`packsim.core.upstream.trl_trainers` names the
    versions); put back, or removed again, afterwards."""
    missing = object()
    before = getattr(trainer, "current_gradient_accumulation_steps", missing)
    trainer.current_gradient_accumulation_steps = steps
    try:
        yield
    finally:
        if before is missing:
            del trainer.current_gradient_accumulation_steps
        else:
            trainer.current_gradient_accumulation_steps = before


def loss_over_accumulation(trainer, raw_batches: list, forward, autocast,
                           compute: torch.dtype | None = None) -> Finding:
    """Run ``trainer.compute_loss`` over one accumulation step of ``raw_batches`` and compare.

    ``forward(inputs) -> logits`` is the audit's forward (no labels); ``autocast()`` the trainer's
    autocast context; ``compute`` the dtype the step computes in
    (:func:`packsim.auditing.tolerance.compute_dtype`). The relative tolerance is the coarser of the
    logits' dtype and ``compute``: the trainer's loss need not come from the logits the audit sees.
    TRL's SFTTrainer computes it from the hidden states, through its chunked-CE forward or its fused
    LM head depending on the TRL version (:mod:`packsim.core.upstream.trl_trainers` says which). Under
    bf16 the two may then differ by bf16 rounding (tests/test_audit_callback.py measures how much per
    TRL version), while accelerate returns the audit's logits as float32. Returns a :class:`Finding` named
    ``loss_over_accumulation``.
    """
    G = max(int(getattr(trainer.args, "gradient_accumulation_steps", 1) or 1), 1)
    micro = raw_batches[:G]
    samples, num_items = trainer.get_batch_samples(iter(micro), len(micro), trainer.args.device)
    scaled = _is_scaled(trainer, num_items)
    got, sums, counts, dtype, row_starts = 0.0, [], [], torch.float32, 0
    with kept_metrics(trainer), _in_the_step(trainer, len(samples)), without_aux_loss(trainer) as aux, \
            torch.no_grad():
        for batch in samples:
            inputs = trainer._prepare_inputs(batch)
            with autocast():
                loss = trainer.compute_loss(trainer.model, dict(inputs), num_items_in_batch=num_items)
                logits = forward(inputs)
            dtype = logits.dtype
            got += float(loss) / (1 if scaled else G)
            sums.append(float(token_losses(logits, inputs["labels"]).sum()))
            counts.append(count_targets(inputs["labels"]))
            row_starts += int((torch.as_tensor(inputs["labels"]).reshape(-1, inputs["labels"].shape[-1])[:, 0]
                               != IGNORE_INDEX).sum())  # labels at a row's position 0: never predicted
    want = float(accumulated_loss(sums, counts))  # the mean over all counted labels
    rel = abs(got - want) / max(abs(want), 1e-12)
    tol = max(_REL_TOL.get(d, 1e-2) for d in (dtype, compute or dtype))
    short = f" (only {len(micro)} micro-batch(es) in the data)" if len(micro) < G else ""
    how = ("num_items_in_batch divides every micro-batch by the step's total count" if scaled else
           f"each micro-batch's loss is a mean over its own labels, then divided by {G}")
    evidence = (f"gradient_accumulation_steps={G}{short}, labels counted per micro-batch {counts}: the "
                f"trainer's loss is {got:.6g}, the mean over all counted labels is {want:.6g} "
                f"(relative difference {rel:.1e}, tolerance {tol:.0e}); {how}"
                + ("; the MoE router aux loss the trainer adds (a load-balancing term, not a token mean) was "
                   "switched off for this comparison, so it is not checked" if aux else ""))
    fix = ("let the loss see num_items_in_batch: a model forward with **kwargs (transformers models "
           "have it), or a compute_loss_func / compute_loss that divides by num_items_in_batch")
    items = None if num_items is None else int(round(float(torch.as_tensor(num_items).float().sum())))
    if scaled and items is not None and items != sum(counts):
        evidence, fix = _miscount(trainer, evidence, items, sum(counts), row_starts)
    mean_of_means = G > 1 and not scaled
    if rel > tol or mean_of_means:
        if mean_of_means and rel <= tol:
            evidence += ("; these micro-batches happen to agree, the steps with unequal label counts "
                         "will not")
        return Finding("loss_over_accumulation", "fail", evidence, fix)
    return Finding("loss_over_accumulation", "pass", evidence)
