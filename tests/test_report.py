"""``AuditReport``: ``ok``, ``status``, the gate's exit code and the headline agree, for every status.

Each report is built by hand (no model), one per way a verdict can come out: a pass, a pass with a
notice beside it, a pass with skipped probes, a pass whose loss masking was not measured, a failure
(a probe, a finding, a notice made strict), not measured (one example; the launched attention path
not run here) and unverified (isolated only as the batch's own boundary fields say). ``ok`` is True
exactly for a pass, which is exactly exit 0 and exactly a headline starting with ``PASS``.
"""

from __future__ import annotations

import pytest
import torch

from packsim.auditing.command import exit_code
from packsim.auditing.report import PROBES, AuditReport, Finding, ProbeResult

HEAD = {"pass": "PASS", "fail": "FAIL", "not measured": "NOT MEASURED", "unverified": "UNVERIFIED"}
FIELDS_OK = Finding("boundary_fields", "pass", "cu_seq_lens_q agrees with the examples given")
FIELDS_ONLY = Finding("boundary_fields", "skipped", "nothing independent locates the examples")
NO_SPLIT = {"not_measured": "no prompt/response split", "measured": "every example -100 on a leading run"}


def report(statuses: dict | None = None, findings=(FIELDS_OK,), details=None, n=3, **kw) -> AuditReport:
    """A report whose probes pass except where ``statuses`` says otherwise."""
    statuses = statuses or {}
    probes = {name: ProbeResult(name, statuses.get(name, "pass"), 0.0, 1e-5, f"{name} measured",
                                dict((details or {}).get(name, {}))) for name in PROBES}
    return AuditReport(probes=probes, boundaries="cu_seq_lens_q", example_ids=list(range(n)), forward="model(**batch)",
                       logit_change=torch.zeros(n, n), gradient_ratio=None, attention_outside=None, worst_pair=None,
                       causes=[], seconds=0.1, findings=list(findings), **kw)


LEAK_SKIPPED = {"perturbation": "skipped", "gradient": "skipped", "attention_mass": "skipped"}
CASES = {
    "pass": (report(), "pass"),
    "pass with a notice": (report(findings=[FIELDS_OK, Finding("padding_free", "notice", "fell back to padding")]),
                           "pass"),
    "pass, probes skipped": (report({"attention_mass": "skipped", "positions": "skipped"}), "pass"),
    "pass, loss masking not measured": (report({"loss_coverage": "skipped"}, details={"loss_coverage": NO_SPLIT}),
                                        "pass"),
    "pass, no labels": (report({"loss_coverage": "skipped"}), "pass"),
    "fail (probe)": (report({"perturbation": "fail"}), "fail"),
    "fail (finding)": (report(findings=[FIELDS_OK, Finding("cache", "fail", "use_cache=True", "use_cache=False")]),
                       "fail"),
    "fail (a notice under strict)": (report(findings=[FIELDS_OK, Finding("padding_free", "fail", "fell back")]),
                                     "fail"),
    "not measured (one example)": (report(LEAK_SKIPPED, n=1), "not measured"),
    "not measured (path not run)": (report(path_not_run="flash_attention_2 needs CUDA"), "not measured"),
    "not measured, findings skipped": (report(LEAK_SKIPPED, findings=[FIELDS_OK, Finding("x", "skipped", "no GPU")]),
                                       "not measured"),
    "unverified": (report(findings=[FIELDS_ONLY]), "unverified"),
    "unverified, trusted": (report(findings=[FIELDS_ONLY], trust_boundaries=True), "pass"),
}


@pytest.mark.parametrize("case", CASES)
def test_ok_status_exit_code_and_headline_agree(case):
    rep, status = CASES[case]
    assert rep.status == status, rep.verdict
    assert rep.ok == (status == "pass") == (exit_code(rep) == 0)
    assert exit_code(rep) == {"pass": 0, "fail": 1, "not measured": 3, "unverified": 3}[status]
    head = rep.verdict
    assert head.startswith(HEAD[status]) and "\n" not in head, head
    assert head.startswith("PASS") == rep.ok, head


def test_a_pass_that_did_not_measure_the_loss_masking_says_so_first():
    masked = CASES["pass, loss masking not measured"][0].verdict
    assert masked.startswith("PASS (isolation; loss masking not measured: pass examples= / response_mask=):"), masked
    unlabelled = CASES["pass, no labels"][0].verdict
    assert unlabelled.startswith("PASS (isolation; loss not checked: audit a batch that carries labels):"), unlabelled
    assert CASES["pass"][0].verdict.startswith("PASS: 3 examples isolated and the loss counts only responses")


def test_not_measured_is_not_ok():
    """The false PASS this guards against: nothing failed, nothing was measured either."""
    rep = CASES["not measured (one example)"][0]
    assert not rep.failed and not rep.ok and exit_code(rep) == 3 and rep.verdict.startswith("NOT MEASURED")


def test_a_preference_audit_not_measured_is_not_ok():
    from packsim.auditing.logprobs import LogprobReport
    from packsim.auditing.preference import PreferenceAudit

    rep = PreferenceAudit([], LogprobReport([], "not measured", "float32", "model(**batch)", "a hybrid refused"))
    assert rep.status == "not measured" and exit_code(rep) == 3 and rep.verdict.startswith("NOT MEASURED")
    assert not rep.ok
