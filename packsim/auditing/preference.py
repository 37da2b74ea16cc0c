"""Audit a TRL ``DPOTrainer`` as it is configured: does it pack, and do its per-sequence log-probs
match each sequence run alone?

A DPO loss is built from the summed completion log-probs of chosen and rejected sequences, so the
check is :func:`packsim.auditing.logprobs.audit_logprobs` on the trainer's own first batch, through
the trainer's model. Before that, :func:`audit_dpo_trainer` reads what the trainer really does
with ``padding_free``: every TRL of the tested window (``trl/trainer/dpo_trainer.py``,
``DPOTrainer.__init__``; the versions read: :mod:`packsim.core.upstream.trl_trainers`) logs a
warning and sets ``self.padding_free = False`` ("Falling back to standard padding"), so rows come
padded, one sequence per row: isolated, and not packed. Batch shapes: input_ids, attention_mask,
completion_mask (2 * pairs, T), chosen rows first.

The forward runs in eval mode under the trainer's own autocast (``trainer.accelerator.autocast()``)
(:func:`trainer_logprobs`, GRPO too): bf16 / fp16 as the step computes under mixed precision, before
``train()`` as inside it (the callback), and the tolerance follows that dtype.

Lessons: none directly.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

from packsim.auditing.logprobs import LogprobReport, audit_logprobs, pair_names
from packsim.auditing.report import Finding
from packsim.core.boundaries import find_boundaries
from packsim.core.errors import PacksimError

__all__ = ["PreferenceAudit", "audit_dpo_trainer", "fallback_finding", "is_dpo", "trainer_logprobs"]


def is_dpo(trainer) -> bool:
    return any(c.__name__ == "DPOTrainer" for c in type(trainer).__mro__)


@dataclass
class PreferenceAudit:
    """``findings`` (what the trainer does with packing) and ``logprobs`` (the per-sequence check);
    :func:`packsim.auditing.grpo.audit_grpo_trainer` returns one too. It answers like an
    :class:`~packsim.auditing.report.AuditReport` (``status``, ``failed``, ``ok``, ``verdict``,
    ``console()``), so the gate and :class:`~packsim.AuditCallback` read either the same way."""

    findings: list[Finding]
    logprobs: LogprobReport

    @property
    def failed(self) -> list[str]:
        """``logprobs`` when a sequence's log-prob moved, then the failed findings."""
        return (["logprobs"] if self.logprobs.status == "leaks" else []) + [f.name for f in self.findings if f.failed]

    @property
    def skipped(self) -> list[str]:
        return (["logprobs"] if self.logprobs.status == "not measured" else []) + \
            [f.name for f in self.findings if f.status == "skipped"]

    @property
    def ok(self) -> bool:
        """True only for a pass (not measured is not ok), as AuditReport.ok."""
        return self.status == "pass"

    @property
    def status(self) -> str:
        """``"fail"``, ``"not measured"`` (nothing failed, the log-probs could not be compared) or ``"pass"``."""
        if self.failed:
            return "fail"
        return "pass" if self.logprobs.status == "isolated" else "not measured"

    @property
    def verdict(self) -> str:
        notices = [f.name for f in self.findings if f.status == "notice"]
        tail = f"; notice: {', '.join(notices)} (see below)" if notices else ""
        if self.status == "fail":
            return f"FAIL ({', '.join(self.failed)}): " + self.logprobs.text().splitlines()[0] + tail
        if self.status == "not measured":
            return f"NOT MEASURED: {self.logprobs.note}; nothing failed, but this is not a pass" + tail
        return "PASS: " + self.logprobs.text().splitlines()[0] + tail

    def text(self) -> str:
        lines = [f"{f.name}: {f.status.upper()}: {f.evidence}" + (f" Fix: {f.fix}" if f.fix and f.status != "pass"
                                                                    else "") for f in self.findings]
        table = self.logprobs.text().splitlines()
        return "\n".join([self.verdict, *lines, *(table if self.status == "not measured" else table[1:])])

    def console(self, stream=None) -> str:
        """The report for printing (``packsim audit --trainer`` prints this)."""
        return self.text()

    def __str__(self) -> str:
        return self.text()


def fallback_finding(name: str, where: str, what: str, fix: str, strict: bool) -> Finding:
    """A setting the trainer did not honour while corrupting nothing: a notice, or a failure when ``strict``."""
    return Finding(name, "fail" if strict else "notice", f"{where}: {what}", fix)


def trainer_logprobs(trainer, rows: dict, **kwargs) -> LogprobReport:
    """:func:`audit_logprobs` through the trainer's model as its step computes (its autocast), in eval
    mode (dropout off: packed and alone must see the same network); the mode is restored."""
    model = trainer.model
    was = model.training
    accelerator = getattr(trainer, "accelerator", None)
    try:
        model.eval()
        with accelerator.autocast() if accelerator is not None else nullcontext():
            return audit_logprobs(model, rows, use_cache=False, **kwargs)
    finally:
        model.train(was)


def audit_dpo_trainer(trainer, *, tol: float | None = None, strict: bool = False) -> PreferenceAudit:
    """The padding-free finding and the log-prob check on the trainer's first training batch.

    TRL's fallback to padding is a notice (throughput, not isolation), a failure when ``strict``.
    """
    if not is_dpo(trainer):
        raise PacksimError(f"audit_dpo_trainer takes a trl.DPOTrainer, got {type(trainer).__name__}: "
                           "use packsim.audit_trainer for Trainer / SFTTrainer.")
    requested = bool(getattr(trainer.args, "padding_free", False))
    actual = bool(getattr(trainer, "padding_free", requested))
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    fields = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor) and v.dim() == 2}
    seq = find_boundaries(fields, missing="rows").seq_ids  # (B, T)
    per_row = max(len(torch.unique(r[r >= 0])) for r in seq)
    shape = tuple(fields["input_ids"].shape)
    where = (f"args.padding_free={requested}, trainer.padding_free={actual}; the first batch is "
             f"{shape[0]} row(s) of {shape[1]} tokens, at most {per_row} sequence(s) per row")
    if requested and not actual:
        finding = fallback_finding("padding_free", where, "TRL fell back to padding (a logged warning only): "
                                   "rows are padded, so nothing leaks, but nothing is packed either",
                                   "expect padded batches (set padding_free=False to say so), or pack with a "
                                   "trainer that supports it and audit that", strict)
    else:
        finding = Finding("padding_free", "pass", f"{where}: the trainer does what its config says")
    names = pair_names(shape[0] // 2) if per_row == 1 and shape[0] % 2 == 0 else None
    return PreferenceAudit([finding], trainer_logprobs(trainer, fields, names=names, tol=tol))
