"""The verdict matrix (issue 30): every pipeline of tests/verdict_matrix.py through every entry point
(audit_trainer, the --trainer gate, AuditCallback, assert_isolated, audit_logprobs), each verdict
against the ground truth that module computes without packsim. A PASS on a fault or a FAIL on a
correct pipeline fails the test; NOT MEASURED / UNVERIFIED on a fault is allowed only where the
entry point has no independent evidence to locate the examples (the dict-batch entry points on
positions that EOS tokens or a cut-off BOS cannot tie to examples), and pinned here so a change shows.
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")  # a dev dependency: CI installs it

import verdict_matrix as vm  # noqa: E402
from pipelines import one_thread  # noqa: E402, F401

# (pipeline, entry point) -> the no-verdict answer it gives on a fault, and why it is not a FAIL
NO_VERDICT = {
    ("continuous_qwen3", "assert_isolated"): "NOT MEASURED",  # one position run, EOS pieces untied
    ("continuous_qwen3", "audit_logprobs"): "UNVERIFIED",
    ("split_first_llama", "assert_isolated"): "UNVERIFIED",  # fields mark 16 starts, BOS 8: nothing ties
    ("split_first_llama", "audit_logprobs"): "UNVERIFIED",
}


@pytest.mark.parametrize("name", list(vm.PIPELINES))
def test_every_entry_point_agrees_with_the_ground_truth(name):
    truth = vm.truth(vm.make(name))
    for entry in vm.cells(name):
        got = vm.ENTRY_POINTS[entry](name)
        code = None
        if isinstance(got, tuple):
            got, code = got
        want = vm.expected(entry, truth)
        allowed = NO_VERDICT.get((name, entry), want)
        assert got == allowed, f"{name} via {entry}: {got}, ground truth {want} ({truth})"
        if code is not None:
            assert code == {"PASS": 0, "FAIL": 1, "NOT MEASURED": 3, "UNVERIFIED": 3}[got]


def test_the_ground_truth_sees_each_fault():
    """Negative controls of the truth itself: each fault moves the number it should, the fix does not."""
    flat, cont, late = (vm.truth(vm.make(f"{k}_llama")) for k in ("flat", "continuous", "late"))
    assert flat["leak"] <= 1e-5 and flat["alone"] <= vm.ALONE_TOL and flat["labels_ok"]
    assert cont["leak"] > 1e-3 and late["alone"] > 1e-3
    assert vm.truth(vm.make("all_labels_llama"))["labels_ok"] is False
