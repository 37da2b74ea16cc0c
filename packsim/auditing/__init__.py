"""The contamination audit (lesson 06): does a packed pipeline keep its examples apart?

=============  ===================================================================
module         idea
=============  ===================================================================
``auditor``    :func:`audit`: run the probes on one model and one batch
``pipeline``   the forward under audit and what it knows about the batch
``probes``     perturbation, gradient, attention mass, loss coverage, positions
``causes``     which field or kwarg most likely breaks isolation
``report``     :class:`AuditReport`: the verdict, the table, the HTML
``command``    ``packsim audit``
=============  ===================================================================
"""

from packsim.auditing.auditor import audit
from packsim.auditing.report import PROBES, AuditReport, ProbeResult, WorstPair

__all__ = ["PROBES", "AuditReport", "ProbeResult", "WorstPair", "audit"]
