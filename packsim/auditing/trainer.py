"""Audit a configured transformers ``Trainer`` or TRL ``SFTTrainer``: its batches, its forward, its config.

``packsim.audit_trainer(trainer, batches=1)`` takes the trainer as the user built it, draws real
batches from ``trainer.get_train_dataloader()`` (input_ids (B, T) plus whatever the collator adds)
and runs the audit's five probes (:mod:`packsim.auditing.probes`) through the trainer's own model
and the call its ``compute_loss`` makes: ``model(**batch)`` for the Trainer (which has set
``model.config.use_cache`` from ``TrainingArguments.use_cache``), ``model(**batch, use_cache=False)``
for SFTTrainer, in train mode, under ``trainer.accelerator.autocast()``, with the model's dtype and
attention implementation. Labels are left out of the probes' forwards (they change the loss, not
the logits), and so are ``shift_labels`` where the model runs the chunked-CE forward an older TRL
leaves on it, which returns no logits with them (:mod:`packsim.core.upstream.trl_trainers` names the
versions). It then adds configuration findings (:mod:`packsim.auditing.findings`) and measures
the loss normalisation over gradient accumulation (:mod:`packsim.auditing.accumulation`).

Where the examples are, and which tokens are the response: from evidence the collator did not
write, else the batch's own fields (:mod:`packsim.auditing.trainer_batch`); the report says which.
Used by lesson 07 and ``packsim audit --model``.

Lessons: A6.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from packsim.auditing.accumulation import loss_over_accumulation
from packsim.auditing.auditor import TOLERANCE, audit_pipeline, check_probe_options
from packsim.auditing.findings import BatchView, cache, is_sft, static_findings
from packsim.auditing.grpo import audit_grpo_trainer, is_grpo
from packsim.auditing.hybrid_findings import (
    MEASURE_IT,
    hybrid_state,
    kernel_refusal,
    scans_layers_once,
)
from packsim.auditing.loss_findings import (
    completion_only_loss,
    loss_across_devices,
    sft_language_modelling,
)
from packsim.auditing.no_trace import leaves_no_trace
from packsim.auditing.pipeline import (
    ForwardOutput,
    Pipeline,
    check_objective,
    dict_roles,
    logits_of,
)
from packsim.auditing.preference import audit_dpo_trainer, is_dpo
from packsim.auditing.report import AuditReport, Finding
from packsim.auditing.tolerance import compute_dtype, given_tolerance, tolerance_note
from packsim.auditing.trainer_batch import (
    batch_evidence,
    batch_fields,
    batch_view,
    draw_batches,
    is_wrapped,
    response_mask,
    same_fields,
)
from packsim.auditing.trainer_cp import as_cp_step, cp_finding
from packsim.auditing.truncation import truncated_examples
from packsim.core.boundaries import text_positions
from packsim.core.errors import PacksimError
from packsim.core.loss import Role
from packsim.core.segments import example_positions
from packsim.core.upstream.trl_trainers import logit_fields
from packsim.core.upstream.window import warn_outside

__all__ = ["audit_trainer"]


def _pipeline(trainer, model, view: BatchView, features, forward_kwargs, autocast,
              objective: str = "sft") -> tuple[Pipeline, str | None]:
    fields = view.fields
    ids = fields["input_ids"]
    rest, dropped = logit_fields(model, {k: v for k, v in fields.items() if k not in ("input_ids", "labels")})

    def run(input_ids=None, inputs_embeds=None, output_attentions=False) -> ForwardOutput:
        extra = {"output_attentions": True} if output_attentions else {}
        x = {"inputs_embeds": inputs_embeds} if inputs_embeds is not None else \
            {"input_ids": ids if input_ids is None else input_ids}
        with autocast():
            return logits_of(model(**x, **rest, **forward_kwargs, **extra))

    def run_alone(x, positions, mask) -> torch.Tensor:  # (R, L) rows of single examples, padded right
        with autocast():
            return logits_of(model(input_ids=x, position_ids=positions, attention_mask=mask,
                                   **forward_kwargs)).logits

    seq, S = view.seq, int(view.seq.max()) + 1 if bool((view.seq >= 0).any()) else 0
    mask, note = response_mask(trainer, view, features, objective)
    roles, notes = dict_roles(model, fields, seq, mask)
    if note:
        notes[0] = f"prompt/response from {note}"
    pos = fields.get("position_ids")
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    kw = "".join(f", {k}={v!r}" for k, v in forward_kwargs.items())
    dtype = next(model.parameters()).dtype
    forward = (f"{type(trainer).__name__}.compute_loss's call model(**batch{kw}) without labels, batch "
               f"keys {sorted(fields)}{dropped}, attn_implementation={impl!r}, dtype {dtype}, mixed precision "
               f"{trainer.accelerator.mixed_precision!r}")
    p = Pipeline(
        model=model, run=run, input_ids=ids, seq=seq, example_ids=list(range(S)), boundaries=view.source,
        labels=fields.get("labels"), roles=roles, role_notes=notes,
        positions=None if pos is None else text_positions(pos, *ids.shape),
        expected_positions=example_positions(seq), forward=forward,
        context={"kind": "dict", "fields": fields, "impl": impl, "forward_kwargs": forward_kwargs},
        run_alone=run_alone, objective="lm" if objective == "lm" or sft_language_modelling(trainer) else "sft",
    )
    return p, note


def _probe(p: Pipeline, view: BatchView, seed: int, max_examples: int, tol,
           findings=None) -> tuple[AuditReport, ForwardOutput]:
    """The five probes of :func:`packsim.audit` on one batch (leak probes skipped for one example)."""
    return audit_pipeline(p, max_examples=max_examples, tol=tol, seed=seed,
                          field_causes=not view.from_tokens, findings=findings)


def _inside_counts(p: Pipeline) -> tuple[int, int]:
    """(counted, total) labels inside the examples: prompt, response, EOS, unknown (not boundaries)."""
    if p.labels is None:
        return 0, 0
    inside = torch.isin(p.roles, torch.tensor([int(Role.PROMPT), int(Role.RESPONSE), int(Role.EOS),
                                               int(Role.UNKNOWN)], device=p.roles.device))
    counted = torch.as_tensor(p.labels).reshape(p.input_ids.shape).to(p.roles.device) != -100
    return int((inside & counted).sum()), int(inside.sum())


def _use_cache(model, forward_kwargs) -> tuple[object, str]:
    if "use_cache" in forward_kwargs:
        return forward_kwargs["use_cache"], "in the call, as compute_loss passes it"
    return getattr(model.config, "use_cache", None), "from model.config (the Trainer sets it from TrainingArguments.use_cache)"


@leaves_no_trace
@scans_layers_once
def audit_trainer(trainer, batches: int = 1, *, max_examples: int = 4, tol: float | None = None,
                  seed: int = 0, strict: bool = False, trust_boundaries: bool = False,
                  batch: dict | None = None, objective: str = "sft") -> AuditReport:
    """Audit a configured ``transformers.Trainer`` / ``trl.SFTTrainer`` before (or instead of) training.

    Args:
        trainer: the trainer as built for the run (model, args, train_dataset, collator). A TRL
            ``DPOTrainer`` / ``GRPOTrainer`` gets the per-sequence log-prob audit instead
            (:mod:`packsim.auditing.preference`, :mod:`packsim.auditing.grpo`).
        batches: how many training batches to audit (the report shows the worst; a ``batches``
            finding lists each). Gradient accumulation draws at least
            ``gradient_accumulation_steps`` batches for the loss-normalisation measurement.
        max_examples, tol, seed: as :func:`packsim.audit`.
        strict: a setting the trainer did not honour while corrupting nothing (DPO's fallback from
            ``padding_free`` to padding) fails the audit instead of being a notice beside a PASS.
        trust_boundaries: the batch's own boundary fields are the ground truth (as :func:`packsim.audit`).
        batch: one collated training batch to audit instead of drawing the first ones (what
            :class:`~packsim.AuditCallback` re-audits when the packed shape grows); its examples
            are located from its tokens and fields (the dataset's features are not known for it),
            and the accumulation check is skipped (it needs a whole accumulation step).
        objective: what the loss should count, as :func:`packsim.audit`: ``"sft"`` (default: the
            completion-only check, prompts -100) or ``"lm"`` (language modelling: every real token
            a target, no prompt/response split expected; padding and cross-boundary labels still
            checked). An SFTTrainer that TRL trains as language modelling (completion_only_loss
            unset on data without prompt/completion fields, or False on a text / messages dataset)
            is audited as ``"lm"`` either way.

    Returns an :class:`~packsim.auditing.report.AuditReport` whose ``findings`` hold the
    configuration checks; ``report.ok`` is True only for a pass (``report.status == "pass"``). The
    audit leaves no trace (:mod:`packsim.auditing.no_trace`): each module's train/eval flag, the
    random generators and the hooks come back as they were, so ``trainer.train()`` after it trains
    as it would without it; the weights are not touched.

    Example::

        >>> import tempfile, transformers, packsim
        >>> model = packsim.build_model("tiny", seed=0, attn_implementation="sdpa")
        >>> args = transformers.TrainingArguments(tempfile.mkdtemp(), per_device_train_batch_size=4, report_to=[],
        ...                                       remove_unused_columns=False, use_cpu=True)
        >>> data = [{"prompt_ids": e.prompt, "response_ids": e.response} for e in packsim.make_examples(8)]
        >>> trainer = transformers.Trainer(model=model, args=args, train_dataset=data,
        ...                                data_collator=packsim.PackingCollator("correct"))
        >>> packsim.audit_trainer(trainer).status
        'pass'
    """
    warn_outside()  # a transformers / TRL outside the tested window: one notice per process
    if not hasattr(trainer, "get_train_dataloader") or not hasattr(trainer, "model"):
        raise PacksimError(f"audit_trainer takes a transformers.Trainer or trl.SFTTrainer, got "
                           f"{type(trainer).__name__}: for a model and one batch use packsim.audit.")
    if not isinstance(batches, int) or isinstance(batches, bool) or batches < 1:
        raise PacksimError(f"batches={batches!r}: audit at least 1 batch.")
    for name, flag in (("strict", strict), ("trust_boundaries", trust_boundaries)):
        if not isinstance(flag, bool):
            raise PacksimError(f"{name}={flag!r}: pass True or False.")
    check_objective(objective)
    max_examples, seed = check_probe_options(max_examples, seed)
    tol = given_tolerance(tol)
    if is_dpo(trainer):  # per-sequence log-probs, not a token loss: auditing/preference.py
        return audit_dpo_trainer(trainer, tol=tol, strict=strict)
    if is_grpo(trainer):  # log-probs of the trainer's own completions: auditing/grpo.py
        return audit_grpo_trainer(trainer, tol=tol, strict=strict)
    start = time.perf_counter()
    model = trainer.model
    ga = max(int(getattr(trainer.args, "gradient_accumulation_steps", 1) or 1), 1)
    drawn = draw_batches(trainer, max(batches, ga)) if batch is None else [(batch_fields(batch, "batch="), None)]
    forward_kwargs = {"use_cache": False} if is_sft(trainer) else {}
    autocast = trainer.accelerator.autocast
    compute = compute_dtype(trainer, model)
    tol_given, tol = tol, (TOLERANCE.get(compute) if tol is None else tol)  # the dtype the step computes in
    impl = getattr(model.config, "_attn_implementation", None)
    was_training = model.training
    model.train()
    try:
        with as_cp_step(trainer, model) as cp_step:  # a context-parallel trainer: attend as its step does
            results = []
            for raw, features in drawn[:batches]:  # a given batch: just it
                fields = trainer._prepare_inputs(raw)
                view = batch_view(trainer, model, fields)
                ev = batch_evidence(trainer, model, view, features)
                p, note = _pipeline(trainer, model, view, features, forward_kwargs, autocast, objective)
                try:
                    report, base_out = _probe(p, view, seed, max_examples, tol, ev.findings)
                except (ImportError, RuntimeError, ValueError) as err:
                    raise PacksimError(f"the trainer's forward failed on batch {len(results)} ({type(err).__name__}: "
                                       f"{str(err).splitlines()[0][:200]}): fix the trainer so one training step "
                                       "runs, then audit it.") from err
                report.trust_boundaries = trust_boundaries  # each batch's own verdict in the batches finding
                results.append((report, view, p, note, base_out))

        known = [(p.context["fields"], out.logits) for _r, _v, p, _n, out in results  # not under CP hooks
                 if out.in_eval and cp_step["cp_size"] == 1]

        def logits(inputs):  # the audit's forward in eval mode: the baseline's logits where they are that
            rest = {k: v for k, v in inputs.items() if k != "labels"}
            hit = next((x for fields, x in known if same_fields(rest, fields)), None)
            return hit if hit is not None else model(**logit_fields(model, rest)[0], **forward_kwargs).logits

        model.eval()  # dropout off: the two forwards compared below must see the same network
        failed = next((f for r, *_ in results for f in r.findings if f.name == "forward"), None)
        try:
            if failed is not None:  # the forward raised in a backend: compute_loss would raise the same
                accumulation = Finding("loss_over_accumulation", "skipped", f"{failed.evidence} (see forward)")
            elif batch is None:
                accumulation = loss_over_accumulation(trainer, [b for b, _ in drawn], logits, autocast, compute)
            else:
                accumulation = Finding("loss_over_accumulation", "skipped", "not measured: a re-audit of one "
                                       "batch seen during training (it needs a whole accumulation step)")
        except ValueError as err:  # a hybrid's torch fallback refusing seq_idx: not measured here
            refused = kernel_refusal(model, err)
            if not refused:
                raise
            accumulation = Finding("loss_over_accumulation", "skipped", f"not measured: the forward is refused "
                                   f"here ({refused})", f"measure it: {MEASURE_IT}")
    finally:
        model.train(was_training)
    worst = max(range(len(results)), key=lambda k: (len(results[k][0].failed), -k))
    report, view, p, note, base_out = results[worst]
    use_cache, where = _use_cache(model, forward_kwargs)
    counts_items = bool(getattr(trainer, "model_accepts_loss_kwargs", False)
                        or getattr(trainer, "compute_loss_func", None) is not None)
    findings = [f for f in [cp_finding(cp_step, report, view.seq)] if f] + static_findings(trainer, view, impl)
    findings += [cache(view, base_out.cache, use_cache, where),
                 completion_only_loss(trainer, note, _inside_counts(p), report.probes["loss_coverage"]),
                 accumulation, loss_across_devices(trainer, counts_items),
                 truncated_examples(trainer, p, drawn[worst][1], cut_across_rows=is_wrapped(trainer))]
    findings += report.findings  # boundary_fields, special_tokens (packsim.auditing.evidence)
    hybrid = hybrid_state(model, view.fields)  # stateful (conv / SSM) layers; None for attention-only models
    if hybrid and not any(f.name == "hybrid_state" for f in findings):  # refused: already there
        findings.append(hybrid)
    if batches > 1:
        verdicts = [f"batch {k}: {'FAIL (' + ', '.join(r.failed) + ')' if r.failed else 'PASS' if r.ok else r.status.upper()}"
                    for k, (r, *_rest) in enumerate(results)]
        bad = sum(bool(r.failed) for r, *_rest in results)
        findings.append(Finding("batches", "fail" if bad else "pass",
                                f"{len(results)} batches audited, {bad} failed ({'; '.join(verdicts)}); "
                                f"the table shows batch {worst}",
                                "see the failing batch's probes and findings"))
    fixes = [f"{f.name}: {f.fix}" for f in findings if f.failed and f.fix and f.name != "batches"]
    return replace(report, findings=findings, causes=fixes + report.causes, trust_boundaries=trust_boundaries,
                   forward=report.forward + tolerance_note(report, base_out, trainer, tol_given, compute),
                   seconds=time.perf_counter() - start)
