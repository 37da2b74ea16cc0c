"""Which float tolerance judges "unchanged" in a trainer's audit, and the note the report gives on it.

The tolerance (``packsim.auditing.auditor.TOLERANCE``, by dtype) follows the dtype the training
step computes in: the autocast dtype under mixed precision (bf16 / fp16), else the model's
parameters' dtype, whatever dtype the forward returns its logits in (:func:`compute_dtype`).
:func:`tolerance_note` is the line the report's ``forward`` text ends with. Where no trainer says
how the step computes (``packsim.audit_logprobs`` on a model, autocast or an accelerate-prepared
forward around it), :func:`watch_dtypes` records the dtypes the model's leaf modules really output
during the forward and :func:`least_precise` picks the one the tolerance follows. A tolerance the
user gives passes :func:`given_tolerance` first (finite, not negative), so ``tol=nan`` can never
read every change as "unchanged".

Lessons: none directly (A6 reaches it through packsim.audit_trainer).
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch

from packsim.auditing.report import AuditReport
from packsim.core.errors import PacksimError

__all__ = ["compute_dtype", "given_tolerance", "least_precise", "tolerance_note", "watch_dtypes"]


def given_tolerance(tol) -> float | None:
    """``tol`` as a float, or None for the dtype's default; PacksimError for anything not a finite
    number >= 0 (a NaN tolerance would pass every comparison, a negative one fail every one)."""
    if tol is None:
        return None
    try:
        value = float(tol)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise PacksimError(f"tol={tol!r}: give a finite tolerance >= 0, or leave it out for the dtype's default.")
    return value


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


@contextmanager
def watch_dtypes(model):
    """Yield a set that collects the floating dtypes the model's leaf modules output inside the block:
    bf16 from a Linear under bf16 autocast, even when the forward returns float32 logits."""
    seen: set = set()

    def hook(_module, _args, out):
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            seen.add(out.dtype)

    leaves = [m for m in model.modules() if next(m.children(), None) is None]
    handles = [m.register_forward_hook(hook) for m in leaves]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def least_precise(dtypes) -> torch.dtype:
    """The floating dtype with the coarsest rounding (largest eps): bf16 over fp16 over fp32."""
    return max(dtypes, key=lambda d: torch.finfo(d).eps)


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
