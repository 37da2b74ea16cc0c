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

The packed shape can grow during training (a later batch packs more tokens per row, or more
rows): a framework's packing verifier re-checks then, and so does this callback. Once training
runs it watches the batches ``trainer.compute_loss`` receives; when one holds more tokens than
any batch audited so far, it audits that batch before its step trains (at most ``reaudits``
times, default 2, so the cost stays bounded; not for DPO / GRPO, whose audit reads the trainer's
own first batch), with the same rules: a fault stops the run there,
"not measured" / "unverified" warn. ``callback.reports`` keeps every report, first to last.

Lessons: none directly.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping

import torch
from transformers import Trainer, TrainerCallback

from packsim.auditing.auditor import check_probe_options
from packsim.auditing.grpo import is_grpo
from packsim.auditing.no_trace import random_generators
from packsim.auditing.pipeline import check_objective
from packsim.auditing.preference import is_dpo
from packsim.auditing.tolerance import given_tolerance
from packsim.auditing.trainer import audit_trainer
from packsim.core.errors import PacksimError

__all__ = ["AuditCallback", "AuditFailed"]


class AuditFailed(RuntimeError):
    """Raised by :class:`AuditCallback` when the audit of the first batches fails; ``.report`` has it."""

    def __init__(self, report):
        self.report = report
        super().__init__("packsim.AuditCallback stopped training before the first step: the audit\n"
                         "of the training batches failed.\n" + str(report))


# audit_trainer's options the callback passes on, with their defaults (trainer, batches and the batch
# re-audited are the callback's own)
_AUDIT_OPTIONS = {n: p.default for n, p in inspect.signature(audit_trainer).parameters.items()
                  if n not in ("trainer", "batches", "batch")}


def _check_options(batches, reaudits, audit_kwargs: dict) -> None:
    """The callback's options, checked as :func:`packsim.audit_trainer` checks them: one line each."""
    unknown = sorted(set(audit_kwargs) - set(_AUDIT_OPTIONS))
    if unknown:
        raise PacksimError(f"AuditCallback got {', '.join(unknown)}: it takes trainer, batches, warn_only, "
                           f"reaudits and audit_trainer's {', '.join(_AUDIT_OPTIONS)}.")
    for name, value, low in (("batches", batches, 1), ("reaudits", reaudits, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise PacksimError(f"AuditCallback({name}={value!r}): give an int >= {low}.")
    options = {**_AUDIT_OPTIONS, **audit_kwargs}
    check_probe_options(options["max_examples"], options["seed"])
    given_tolerance(options["tol"])
    check_objective(options["objective"])


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
        reaudits: how many later batches, each larger than any audited before, to audit during
            training (0: only at ``on_train_begin``).
        **audit_kwargs: ``max_examples``, ``tol``, ``seed``, ``strict``, ``trust_boundaries``,
            ``objective`` (``"lm"`` for language modelling) for :func:`packsim.audit_trainer`.

    Example::

        >>> import contextlib, io, tempfile
        >>> import datasets
        >>> from transformers import Trainer, TrainingArguments
        >>> from packsim import AuditCallback, PackingCollator, build_model, make_examples
        >>> features = [{"prompt_ids": ex.tokens[:ex.n_prompt], "response_ids": ex.tokens[ex.n_prompt:]}
        ...             for ex in make_examples(8, seed=0)]
        >>> args = TrainingArguments(tempfile.mkdtemp(), per_device_train_batch_size=4, max_steps=1, use_cpu=True,
        ...                          report_to="none", save_strategy="no", remove_unused_columns=False)
        >>> callback = AuditCallback()
        >>> trainer = Trainer(model=build_model("tiny", seed=0), args=args, data_collator=PackingCollator(),
        ...                   train_dataset=datasets.Dataset.from_list(features), callbacks=[callback])
        >>> with contextlib.redirect_stdout(io.StringIO()):  # the Trainer's own log lines
        ...     out = trainer.train()
        >>> callback.report.status, out.global_step
        ('pass', 1)
    """

    def __init__(self, trainer=None, *, batches: int = 1, warn_only: bool = False, reaudits: int = 2,
                 **audit_kwargs):
        _check_options(batches, reaudits, audit_kwargs)  # here, not when train() has set everything up
        self.trainer, self.batches, self.warn_only = trainer, batches, warn_only
        self.audit_kwargs, self.reaudits = audit_kwargs, reaudits
        self.report, self.reports = None, []
        self._largest, self._busy = 0, False

    def on_train_begin(self, args, state, control, **kwargs):
        trainer = self.trainer or _calling_trainer()
        if trainer is None:
            raise PacksimError("AuditCallback found no Trainer calling it: pass it one, "
                               "AuditCallback(trainer), or add it to a transformers Trainer's callbacks.")
        if self.reaudits > 0:
            self._watch(trainer)
        if state.global_step > 0:  # resumed from a checkpoint: the first batches were audited then
            return control
        self._audit(trainer, control)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        trainer = self.trainer or _calling_trainer()
        if trainer is not None and "compute_loss" in vars(trainer):  # our watcher: the class method again
            del trainer.compute_loss
        return control

    def _audit(self, trainer, control, batch=None) -> None:
        self._busy = True
        try:
            with random_generators():  # the sampler's shuffle draws from torch's generator: fork it away
                self.report = audit_trainer(trainer, batches=self.batches, batch=batch, **self.audit_kwargs)
                first = batch if batch is not None else next(iter(trainer.get_train_dataloader()), None)
                self._largest = max(self._largest, _tokens(first))
        finally:
            self._busy = False
        self.reports.append(self.report)
        when = "" if batch is None else f" (re-audit of a batch of {_tokens(batch)} tokens, step {trainer.state.global_step})"
        if self.report.status == "fail":
            if self.warn_only:
                warnings.warn("packsim.AuditCallback (warn_only): the audit of the training batches failed"
                              f"{when}; training goes on.\n" + str(self.report), UserWarning, stacklevel=3)
                return
            control.should_training_stop = True
            raise AuditFailed(self.report)
        if self.report.status in ("not measured", "unverified"):
            warnings.warn(f"packsim.AuditCallback{when}: " + self.report.verdict, UserWarning, stacklevel=3)

    def _watch(self, trainer) -> None:
        """Wrap ``trainer.compute_loss`` (this trainer only): audit a batch larger than any audited.

        Not for DPO / GRPO: their audit reads the trainer's own first batch, not a given one."""
        if "compute_loss" in vars(trainer) or is_dpo(trainer) or is_grpo(trainer):
            return
        original = trainer.compute_loss

        def compute_loss(model, inputs, *args, **kwargs):
            n = _tokens(inputs)
            if not self._busy and self.reaudits > len(self.reports) - 1 and n > self._largest > 0:
                self._largest = n
                self._audit(trainer, trainer.control, batch=inputs)
            return original(model, inputs, *args, **kwargs)

        trainer.compute_loss = compute_loss


def _tokens(batch) -> int:
    """Tokens a collated batch holds (rows x columns of input_ids), 0 for None or a batch that is not a
    mapping (GRPOTrainer's dataloader yields the raw prompt records, a list of dicts)."""
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    return int(ids.numel()) if isinstance(ids, torch.Tensor) else 0
