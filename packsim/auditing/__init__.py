"""The contamination audit (lesson 07): does a packed pipeline keep its examples apart?

Everything a practitioner calls (:func:`packsim.audit`, :func:`audit_trainer`, :func:`audit_logprobs`,
:class:`AuditCallback`, :func:`packsim.testing.assert_isolated`, ``packsim audit``) lives here, on
five floors; a module imports only from its own floor and the floors below it (and from
:mod:`packsim.core`), which ``tests/test_layering.py`` reads from this table:

==========  ===================  ====================================================================
floor       module               idea
==========  ===================  ====================================================================
verdict     ``report``           :class:`AuditReport`: the verdict, the table, the HTML
evidence    ``locate``           the collator's examples found in its batch, whole or cut short
evidence    ``evidence``         where the examples are, independently of the batch's boundary fields
evidence    ``features``         :func:`response_mask_from_features`: prompt/completion split of rows
evidence    ``label_values``     every counted label checked by value (shifted, across a boundary)
evidence    ``truncation``       examples cut by truncation (records past max_length, no label left)
evidence    ``loss_checks``      batches that count no label; token weights under accumulation
evidence    ``accumulation``     the trainer's loss over one accumulation step vs the counted mean
evidence    ``findings``         configuration findings (wrapped packing, padding-free, flash rows)
evidence    ``loss_findings``    the loss settings' findings (completion-only loss, across devices)
evidence    ``trainer_batch``    a Trainer's batches drawn with their features, their examples located
forward     ``pipeline``         the forward under audit and what it knows about the batch
forward     ``packed_vs_alone``  every example packed vs alone: the isolation check of constant cost
forward     ``probes``           the pair probes (perturbation, gradient), loss coverage, positions
forward     ``attention_probe``  attention mass: each query's share of attention outside its example
forward     ``shared_pass``      the leak probes from the floor's shared forwards, on a clean batch
forward     ``tolerance``        the float tolerance of a trainer's audit, from the step's dtype
forward     ``causes``           which field or kwarg most likely breaks isolation
forward     ``hybrid_findings``  stateful layers (Mamba2, short conv, DeltaNet) and kernel refusals
forward     ``no_trace``         the audit leaves no trace: RNG, train/eval flags, hooks restored
forward     ``trainer_cp``       a context-parallel Trainer: the audit attends as accelerate's hooks make it
entry       ``auditor``          :func:`audit`: run the probes on one model and one batch
entry       ``logprobs``         :func:`audit_logprobs`: per-sequence log-probs packed vs alone
entry       ``preference``       DPO pairs: chosen / rejected log-probs through the packed call
entry       ``grpo``             GRPO groups: per-token log-probs of a group's completions
entry       ``trainer``          :func:`audit_trainer`: a Trainer / SFTTrainer's own batches
entry       ``callback``         :class:`AuditCallback`: the audit at ``on_train_begin``
entry       ``context_parallel`` :func:`audit_context_parallel`: each CP rank's shard vs its documents alone
gate        ``factory``          ``packsim audit --trainer FILE.py:FUNC``: import and call the factory
gate        ``records``          the gate's JSONL records, and the bound on a record's length
gate        ``checkpoint_checks`` weights that did not load, a model that is not a causal LM (the gate's findings)
gate        ``preflight``        ``packsim audit --model DIR --data FILE``: the pre-flight gate
gate        ``command``          ``packsim audit``: options, exit codes
==========  ===================  ====================================================================

The course's exhibits that run the audit (trap tables, the museum) are one layer up, in
:mod:`packsim.exhibits`. Importing the package loads none of them: each public name loads its
module on first use.

Lessons: A8.
"""

from packsim.core.lazy import lazy_names

# public name -> the module that defines it (imported on first access, PEP 562)
_HOMES = {
    "audit": "packsim.auditing.auditor",
    "AuditReport": "packsim.auditing.report",
    "Finding": "packsim.auditing.report",
    "ProbeResult": "packsim.auditing.report",
    "audit_trainer": "packsim.auditing.trainer",
    "audit_logprobs": "packsim.auditing.logprobs",
    "LOGPROB_TOL": "packsim.auditing.logprobs",
    "pair_names": "packsim.auditing.logprobs",
    "AuditCallback": "packsim.auditing.callback",
    "audit_context_parallel": "packsim.auditing.context_parallel",
    "AuditFailed": "packsim.auditing.callback",
    "response_mask_from_features": "packsim.auditing.features",
}

__all__ = sorted(_HOMES)


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())
