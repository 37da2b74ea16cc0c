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
from packsim.core.errors import PacksimError

__all__ = ["LOSS_CHECKS", "assert_isolated"]

# The report's names that judge the loss rather than isolation (left out by check_loss=False).
LOSS_CHECKS = ("loss_coverage", "completion_only_loss", "loss_over_accumulation", "loss_across_devices",
               "truncated_examples", "truncation", "counted_labels", "equal_token_weights")


def assert_isolated(model, batch, response_mask=None, *, check_loss: bool = True, **forward_kwargs) -> AuditReport:
    """Audit ``model`` on ``batch``; raise ``AssertionError`` carrying the report unless it passes.

    What it checks (:func:`packsim.audit`'s probes, through the model's real forward):

    - isolation: changing one example's tokens changes no other example's logits (perturbation),
      and no example's loss has a gradient through another's embeddings (gradient); where the
      forward returns attention probabilities, none lands outside the query's example;
    - the loss (``check_loss=True``, the default): which labels are counted (no prompt with a
      ``response_mask``, no padding, no label across a boundary, every response token and EOS,
      at least one label) and that each counted label is the token it should predict;
    - positions: position ids restart per example where this model's positions matter.

    It raises ``AssertionError`` with the report's table when any of these fails, when the batch
    carries no example boundaries the audit can use (so nothing could be compared), and when
    isolation could not be measured (e.g. one example: "not measured" is not a pass), and when the
    verdict rests on the batch's own boundary fields alone (status ``"unverified"``: pass
    ``examples=`` or ``trust_boundaries=True``, which go to :func:`packsim.audit`).

    Args:
        model: the causal LM the pipeline trains (anything :func:`packsim.audit` accepts).
        batch: a ``PackedBatch`` or the collator's dict, exactly as the training step gets it.
        response_mask: optional bool (B, T), True on response tokens and EOS (lets the loss
            probe tell prompt from response in a dict batch).
        check_loss: False leaves the loss checks (:data:`LOSS_CHECKS`) out of the assertion: only
            isolation and positions decide (the returned report still shows the loss rows).
        **forward_kwargs: passed to every forward as the pipeline passes them (``use_cache=False``),
            and the audit's own options (``tol``, ``seed``, ``max_examples``, ``examples``,
            ``trust_boundaries``).

    Returns the :class:`~packsim.auditing.report.AuditReport` when the assertion holds (skipped
    probes other than isolation are not failures: ``report.skipped`` lists them). A batch that is
    not a batch at all (wrong type, mismatched shapes) is a :class:`PacksimError`, not an assertion.
    """
    try:
        report = audit(model, batch, response_mask, **forward_kwargs)
    except PacksimError as err:
        if "no example boundaries" not in str(err):
            raise
        raise AssertionError(f"packsim.audit could not check isolation: {err}") from None
    failed = [n for n in report.failed if check_loss or n not in LOSS_CHECKS]
    if failed:
        what = ", ".join(failed)
        raise AssertionError(f"packsim.audit failed ({what}): examples are not isolated"
                             + (" or the loss counts the wrong tokens" if check_loss else "")
                             + ".\n" + str(report))
    if not report.isolation_measured:
        raise AssertionError("packsim.audit could not measure isolation (not measured is not a pass).\n"
                             + str(report))
    if report.status == "unverified":
        raise AssertionError("packsim.audit found the examples isolated only as the batch's own boundary "
                             "fields mark them (nothing independent locates them): pass examples=, or "
                             "trust_boundaries=True when the fields are the ground truth.\n" + str(report))
    return report
