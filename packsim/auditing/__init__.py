"""The contamination audit (lesson 07): does a packed pipeline keep its examples apart?

===============  ===================================================================
module           idea
===============  ===================================================================
``auditor``      :func:`audit`: run the probes on one model and one batch
``pipeline``     the forward under audit and what it knows about the batch
``probes``       perturbation, gradient, attention mass, loss coverage, positions
``alone``        every example packed vs alone: the isolation check of constant cost
``evidence``     where the examples are, independently of the batch's boundary fields
``locate``       the collator's examples found in its batch, whole or cut short
``label_values`` every counted label checked by value (shifted, across a boundary, wrong)
``causes``       which field or kwarg most likely breaks isolation
``report``       :class:`AuditReport`: the verdict, the table, the HTML
``command``      ``packsim audit``
``traps``        :func:`trap_table`: is a packed row isolated, per family x attention x condition
``trap_cases``   what a trap-table cell runs: the tiny family models, the packed-row conditions
``trap_results`` :class:`TrapTable`: the measured cells as text, HTML or a heatmap
``museum``       :func:`museum_table`: real-world packing bugs, planted and caught
``loss_checks``  batches that count no label; token weights under gradient accumulation
``trainer``      :func:`audit_trainer`: a Trainer / SFTTrainer's own batches, forward, findings
``findings``     configuration findings (wrapped packing, padding-free support, flash rows, ...)
``accumulation`` the trainer's loss over one accumulation step vs the mean over counted labels
``features``     :func:`response_mask_from_features`: prompt/completion split of collator rows
``preflight``    ``packsim audit --model DIR --data FILE``: the pre-flight gate
``factory``      ``packsim audit --trainer FILE.py:FUNC``: import the user's trainer factory, call it
``callback``     :class:`AuditCallback`: the audit at ``on_train_begin``, stopping a run on a fault
``truncation``   examples cut by truncation (records past max_length, examples counting no label)
===============  ===================================================================

Importing the package loads none of them: each public name loads its module on first use.

Lessons: none directly (lessons 07 and 09 call :func:`packsim.audit`).
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
    "AuditCallback": "packsim.auditing.callback",
    "AuditFailed": "packsim.auditing.callback",
    "response_mask_from_features": "packsim.auditing.features",
    "EXHIBITS": "packsim.auditing.museum",
    "museum_table": "packsim.auditing.museum",
    "museum_2026_table": "packsim.auditing.museum_2026",
    "TrapTable": "packsim.auditing.trap_results",
    "trap_table": "packsim.auditing.traps",
}

__all__ = sorted(_HOMES)


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())
