"""A context-parallel ``Trainer`` audited as its step runs: the attention accelerate's hooks leave it.

A transformers ``Trainer`` with ``TrainingArguments(parallelism_config=ParallelismConfig(cp_size=N))``
trains through accelerate's torch context parallelism: at ``prepare`` accelerate hooks every
``self_attn`` module to drop its attention mask and attend ``is_causal`` (what each fact rests on, and
the versions it was read from: :mod:`packsim.core.upstream.accelerate_cp`). The hooks are attached
inside ``trainer.train()``, after :func:`packsim.audit_trainer` runs, so an audit of the bare model
would measure the packed mask the step never uses. :func:`as_cp_step` attaches accelerate's own hooks
for the audit's forwards (one process, the whole row: torch's ring with ``is_causal`` computes causal
attention over the row, sharded; RESULTS.md §9 measures that ring equal to one process), and removes
them after. :func:`cp_finding` turns the probes' isolation verdict under them into the
``context_parallel`` finding, which names context parallelism as the cause.

Inputs: the trainer, its model, and ``seq`` (B, T), the example of every token the audit located
(-1 padding), of a batch of input_ids (B, T) with position_ids (B, T) restarting per example.

Lessons: none directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from packsim.auditing.report import AuditReport, Finding
from packsim.core.upstream.accelerate_cp import context_parallel_size, cp_attention_hooks

__all__ = ["CP_FIX", "as_cp_step", "cp_finding"]

CP_FIX = ("accelerate's context parallelism drops the attention mask: under cp_size > 1 give each row one "
          "document (no packing), or shard the packed row by document with torch's context_parallel and a "
          "flex document BlockMask (packsim.scaling.cp_attention, checked by packsim.audit_context_parallel)")
_ISOLATION = ("perturbation", "gradient", "attention_mass")


@contextmanager
def as_cp_step(trainer, model) -> Iterator[dict]:
    """Inside the block the model attends as the trainer's context-parallel step would (nothing where it is
    not context-parallel). Yields ``{"cp_size": N, "hooked": [module names], "refused": str | None}``."""
    size = context_parallel_size(trainer)
    if size <= 1:
        yield {"cp_size": 1, "hooked": [], "refused": None}
        return
    try:
        hooks = cp_attention_hooks(model)
        hooked = hooks.__enter__()
    except ValueError as err:  # accelerate refuses the model (sliding-window, chunked or recurrent layers)
        yield {"cp_size": size, "hooked": [], "refused": str(err).splitlines()[0][:300]}
        return
    try:
        yield {"cp_size": size, "hooked": hooked, "refused": None}
    finally:
        hooks.__exit__(None, None, None)


def _rows(seq: torch.Tensor) -> tuple[int, int]:
    """(most examples in one row, rows with padding before a real token) of seq (B, T) (-1 padding)."""
    most = max((int(row[row >= 0].unique().numel()) for row in seq), default=0)
    real = seq >= 0  # (B, T)
    later_real = real.flip(1).cummax(1).values.flip(1)  # (B, T): a real token at or after t
    return most, int(((~real) & later_real).any(1).sum())


def cp_finding(step: dict, report: AuditReport, seq: torch.Tensor) -> Finding | None:
    """The ``context_parallel`` finding of a context-parallel trainer's audit (None where it is not one).

    ``seq`` (B, T): the example of every token the audit located (-1 padding). With the mask dropped a
    row is causal over all its tokens, so it keeps its examples apart only with one example and no
    padding before it (``Trainer._prepare_context_parallel_inputs`` accepts every 2D mask as causal)."""
    size = step["cp_size"]
    if size <= 1:
        return None
    where = f"cp_size {size}, torch backend (accelerate)"
    if step["refused"]:
        return Finding("context_parallel", "fail", f"{where}: accelerate refuses this model under context "
                       f"parallelism ({step['refused']}); trainer.train() would stop there", CP_FIX)
    if not step["hooked"]:
        return Finding("context_parallel", "skipped", f"not measured: {where}, but the model has no module named "
                       "*self_attn for accelerate's hook; whether its attention keeps examples apart under the "
                       "ring depends on how the model passes its mask", "audit the context-parallel forward itself "
                       "with packsim.audit_context_parallel")
    head = (f"{where}: the probes ran with accelerate's context-parallel hooks on the {len(step['hooked'])} "
            "self_attn modules (attention_mask dropped, is_causal=True), the attention each rank's ring computes")
    failed = [report.probes[n] for n in _ISOLATION if n in report.probes and report.probes[n].failed]
    most, padded_first = _rows(seq)
    if failed:
        worst = ", ".join(f"{p.name} {p.value:.3g} (limit {p.threshold:.0e})" for p in failed)
        return Finding("context_parallel", "fail", f"{head}: the examples of a packed row attend each other "
                       f"across it ({worst})", CP_FIX)
    if padded_first:
        return Finding("context_parallel", "fail", f"{head}: {padded_first} row(s) hold padding before an example; "
                       "with the mask dropped its tokens attend that padding", "pad on the right under context "
                       f"parallelism; {CP_FIX}")
    if most <= 1:
        return Finding("context_parallel", "pass", f"{head}: each row holds one example with no padding before "
                       "it, so causal attention over a row is its example's own")
    if not any(n in report.probes and report.probes[n].status == "pass" for n in _ISOLATION):
        return Finding("context_parallel", "skipped", f"not measured: {head}, but no isolation probe measured "
                       f"the rows of {most} examples")
    return Finding("context_parallel", "pass", f"{head}: no example's logits move another's under them")
