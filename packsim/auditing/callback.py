"""``packsim.AuditCallback``: audit the first batches when training starts, stop the run on a fault.

::

    trainer = SFTTrainer(..., callbacks=[packsim.AuditCallback()])
    trainer.train()  # raises packsim.AuditFailed (with the report) before the first step on a leak

At ``on_train_begin`` the callback runs :func:`packsim.audit_trainer` on the trainer that is
training: its training batches, its forward, its config. transformers passes callbacks no trainer
(``transformers.trainer_callback.CallbackHandler.call_event`` passes ``model``,
``processing_class``, ``optimizer``, ``lr_scheduler``, ``train_dataloader``, ``eval_dataloader``),
so the callback takes the one given to it (``AuditCallback(trainer)``) or else the ``Trainer``
whose ``train()`` is calling it, found on the call stack: it works for ``Trainer``, TRL's
``SFTTrainer`` and any subclass. The audit's randomness is forked away (torch, Python, NumPy), so
the run trains exactly as it would without the callback.

On a fault it sets ``control.should_training_stop`` and raises :class:`AuditFailed`, because
transformers only reads that flag after a step (``Trainer._run_epoch``) and the point is that no
step trains on a leaking batch; ``warn_only=True`` warns instead and lets the run go on. A
verdict that is not a pass and not a fault -- "not measured" (e.g. one example per batch, or a
hybrid forward transformers refuses here) or "unverified" (isolated as the batch's own boundary
fields mark them, nothing independent locating the examples) -- warns (``UserWarning`` with the
verdict) in both modes and training goes on: the callback stops a run only on a measured fault.
The tolerance follows the dtype the step computes in (bf16 / fp16 under mixed precision, even
though accelerate returns float32 logits once ``train()`` has prepared the model).
``callback.report`` keeps the report. A DPO / GRPO trainer gets the log-prob audit
(:mod:`packsim.auditing.preference`), read the same way.

Lessons: none directly.
"""

from __future__ import annotations

import inspect
import random
import warnings
from contextlib import contextmanager

import torch
from transformers import Trainer, TrainerCallback

from packsim.auditing.trainer import audit_trainer
from packsim.core.errors import PacksimError

__all__ = ["AuditCallback", "AuditFailed"]


class AuditFailed(RuntimeError):
    """Raised by :class:`AuditCallback` when the audit of the first batches fails; ``.report`` has it."""

    def __init__(self, report):
        self.report = report
        super().__init__("packsim.AuditCallback stopped training before the first step: the audit\n"
                         "of the training batches failed.\n" + str(report))


@contextmanager
def _own_randomness():
    """Leave the torch (CPU and CUDA), Python and NumPy generators as they were."""
    py = random.getstate()
    try:
        import numpy as np
        state = np.random.get_state()
    except ImportError:  # pragma: no cover - numpy ships with torch's usual installs
        np, state = None, None
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(py)
            if np is not None:
                np.random.set_state(state)


def _calling_trainer():
    """The Trainer whose train() is running this callback (the nearest ``self`` up the stack)."""
    frame = inspect.currentframe()
    try:
        while frame is not None:
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, Trainer):
                return candidate
            frame = frame.f_back
    finally:
        del frame
    return None


class AuditCallback(TrainerCallback):
    """Audit the trainer's first ``batches`` training batches at ``on_train_begin``.

    Args:
        trainer: the trainer to audit; None (default) takes the one whose ``train()`` calls back.
        batches: how many training batches to audit (as :func:`packsim.audit_trainer`).
        warn_only: on a fault, warn (``UserWarning`` with the report) instead of stopping the run.
        **audit_kwargs: ``max_examples``, ``tol``, ``seed`` for :func:`packsim.audit_trainer`.
    """

    def __init__(self, trainer=None, *, batches: int = 1, warn_only: bool = False, **audit_kwargs):
        self.trainer, self.batches, self.warn_only = trainer, batches, warn_only
        self.audit_kwargs = audit_kwargs
        self.report = None

    def on_train_begin(self, args, state, control, **kwargs):
        trainer = self.trainer or _calling_trainer()
        if trainer is None:
            raise PacksimError("AuditCallback found no Trainer calling it: pass it one, "
                               "AuditCallback(trainer), or add it to a transformers Trainer's callbacks.")
        if state.global_step > 0:  # resumed from a checkpoint: the first batches were audited then
            return control
        with _own_randomness():
            self.report = audit_trainer(trainer, batches=self.batches, **self.audit_kwargs)
        if self.report.status == "fail":
            if self.warn_only:
                warnings.warn("packsim.AuditCallback (warn_only): the audit of the training batches failed; "
                              "training goes on.\n" + str(self.report), UserWarning, stacklevel=2)
                return control
            control.should_training_stop = True
            raise AuditFailed(self.report)
        if self.report.status in ("not measured", "unverified"):
            warnings.warn("packsim.AuditCallback: " + self.report.verdict, UserWarning, stacklevel=2)
        return control
