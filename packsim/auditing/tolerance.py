"""Which float tolerance judges "unchanged" in a trainer's audit, and the note the report gives on it.

The tolerance (``packsim.auditing.auditor.TOLERANCE``, by dtype) follows the dtype the training
step computes in: the autocast dtype under mixed precision (bf16 / fp16), else the model's
parameters' dtype, whatever dtype the forward returns its logits in (:func:`compute_dtype`).
:func:`tolerance_note` is the line the report's ``forward`` text ends with.

Lessons: none directly (A6 reaches it through packsim.audit_trainer).
"""

from __future__ import annotations

import torch

from packsim.auditing.report import AuditReport

__all__ = ["compute_dtype", "tolerance_note"]


def compute_dtype(trainer, model) -> torch.dtype:
    """The dtype the training step computes in: the autocast dtype under mixed precision, else the
    model's. Under accelerate's mixed precision the forward may return float32 logits (its
    ``convert_to_fp32`` wrapper, once ``train()`` has prepared the model) computed in bf16 / fp16:
    the tolerance follows the computation, not the returned dtype."""
    mixed = getattr(getattr(trainer, "accelerator", None), "mixed_precision", None)
    if mixed == "bf16":
        return torch.bfloat16
    if mixed == "fp16":
        return torch.float16
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def tolerance_note(report: AuditReport, base_out, trainer, given, compute: torch.dtype) -> str:
    """Which float tolerance judged "unchanged", and the dtype it follows (the step's computation)."""
    tol = report.probes["perturbation"].threshold
    if given is not None:
        return f"; tolerance {tol:.0e}, as passed (tol=)"
    returned = str(base_out.logits.dtype).replace("torch.", "")
    dtype = str(compute).replace("torch.", "")
    mixed = trainer.accelerator.mixed_precision
    if mixed not in (None, "no"):
        upcast = f"; the forward returns {returned} logits" if returned != dtype else ""
        return (f"; tolerance {tol:.0e}, from the {dtype} logits this forward computes under mixed precision "
                f"{mixed!r}{upcast}")
    return f"; tolerance {tol:.0e}, from the {dtype} logits this forward returns"
