"""The contamination audit (lesson 07): does a packed pipeline keep its examples apart?

===============  ===================================================================
module           idea
===============  ===================================================================
``auditor``      :func:`audit`: run the probes on one model and one batch
``pipeline``     the forward under audit and what it knows about the batch
``probes``       perturbation, gradient, attention mass, loss coverage, positions
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
``forensics``    evidence a contaminated run leaves in the weights, against a control
===============  ===================================================================

Lessons: none directly (lessons 07 and 09 call :func:`packsim.audit`).
"""

from packsim.auditing.auditor import audit
from packsim.auditing.features import response_mask_from_features
from packsim.auditing.museum import EXHIBITS, museum_table
from packsim.auditing.report import PROBES, AuditReport, Finding, ProbeResult, WorstPair
from packsim.auditing.trainer import audit_trainer
from packsim.auditing.trap_results import TrapTable
from packsim.auditing.traps import trap_table

__all__ = ["EXHIBITS", "PROBES", "AuditReport", "Finding", "ProbeResult", "TrapTable", "WorstPair",
           "audit", "audit_trainer", "museum_table", "response_mask_from_features", "trap_table"]
