"""Assertions for a user's own test suite: one line that fails a test when packing contaminates.

``assert_isolated(model, batch, **forward_kwargs)`` runs :func:`packsim.audit` on the pipeline's
real forward (``batch``: a :class:`~packsim.core.batch.PackedBatch` or the collator's dict with
``input_ids`` (B, T), ``labels`` (B, T), ``position_ids`` ...) and raises ``AssertionError``
carrying the report's table when any probe fails, so pytest shows the verdict, the evidence and
the likely cause. It returns the report when the audit passes. Example::

    from packsim.testing import assert_isolated

    def test_my_collator_keeps_examples_apart():
        batch = my_collator(my_features)
        assert_isolated(model, batch, response_mask=my_response_mask, use_cache=False)

For docs/audit.md and lesson 07.

Lessons: none directly.
"""

from __future__ import annotations

from packsim.auditing.auditor import audit
from packsim.auditing.report import AuditReport

__all__ = ["assert_isolated"]


def assert_isolated(model, batch, response_mask=None, **forward_kwargs) -> AuditReport:
    """Audit ``model`` on ``batch`` and raise ``AssertionError`` (with the report's table) on a failure.

    Args:
        model: the causal LM the pipeline trains (anything :func:`packsim.audit` accepts).
        batch: a ``PackedBatch`` or the collator's dict, exactly as the training step gets it.
        response_mask: optional bool (B, T), True on response tokens and EOS (lets the loss
            probe tell prompt from response in a dict batch).
        **forward_kwargs: passed to every forward as the pipeline passes them (``use_cache=False``),
            and the audit's own options (``tol``, ``seed``, ``max_examples``).

    Returns the :class:`~packsim.auditing.report.AuditReport` when no probe failed (skipped probes
    are not failures: ``report.skipped`` lists them).
    """
    report = audit(model, batch, response_mask, **forward_kwargs)
    if not report.ok:
        raise AssertionError("packsim.audit failed: examples are not isolated or the loss counts "
                             "the wrong tokens.\n" + report.table())
    return report
