"""The contamination audit (lesson 06): does a packed pipeline keep its examples apart?

===============  ===================================================================
module           idea
===============  ===================================================================
``auditor``      :func:`audit`: run the probes on one model and one batch
``pipeline``     the forward under audit and what it knows about the batch
``probes``       perturbation, gradient, attention mass, loss coverage, positions
``causes``       which field or kwarg most likely breaks isolation
``report``       :class:`AuditReport`: the verdict, the table, the HTML
``command``      ``packsim audit``
``trap_table``   :func:`trap_table`: is a packed row isolated, per family x attention x condition
``museum``       :func:`museum_table`: real-world packing bugs, planted and caught
``loss_checks``  batches that count no label; token weights under gradient accumulation
===============  ===================================================================
"""

from packsim.auditing.auditor import audit
from packsim.auditing.museum import EXHIBITS, museum_table
from packsim.auditing.report import PROBES, AuditReport, ProbeResult, WorstPair
from packsim.auditing.trap_table import TrapTable, trap_table

__all__ = ["EXHIBITS", "PROBES", "AuditReport", "ProbeResult", "TrapTable", "WorstPair", "audit",
           "museum_table", "trap_table"]
