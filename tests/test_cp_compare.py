"""Context parallelism on 2 gloo ranks (torchrun) against one process, and the audit of both layouts.

One launch for the module (two fresh Pythons): ``packsim.scaling.cp_compare`` on a packed row of
256 tokens, the committed trained model. Equal means: logits within 1e-4 (float32 summation order;
the audit's float32 tolerance), the step-0 loss within 1e-5, every gradient entry within 1e-5 of the
largest one. The ground truth of the broken layout is computed on one process in the same launch: a
plain causal mask over the whole row, which the ring must reproduce exactly while it differs from
every document alone.
"""

from __future__ import annotations

import os

import pytest

from packsim.core.errors import PacksimError
from packsim.scaling.cp_compare import launch, main, summary

EQUAL_LOGITS, EQUAL_LOSS, EQUAL_GRAD = 1e-4, 1e-5, 1e-5


@pytest.fixture(scope="module")
def result():
    return launch(nproc=2, tokens=256, quiet=True, timeout=300)


def test_documents_layout_equals_one_process_logits_loss_and_gradients(result):
    r = result["layouts"]["documents"]
    assert result["world_size"] == 2 and result["backend"] == "gloo" and result["tokens"] == 256
    assert r["max_logit_diff_one_process"] < EQUAL_LOGITS and r["max_logit_diff_alone"] < EQUAL_LOGITS, r
    assert r["max_logit_diff_flex_vs_dense"] < EQUAL_LOGITS  # torch's flex kernel = the backward's kernel
    assert abs(r["loss"] - r["loss_one_process"]) < EQUAL_LOSS
    assert r["max_grad_diff"] < EQUAL_GRAD * r["max_grad"], r


def test_documents_layout_passes_the_audit(result):
    a = result["layouts"]["documents"]["audit"]
    assert a["status"] == "pass" and a["finding"] == "pass" and a["failed"] == [], a["verdict"]
    assert a["perturbation"] < EQUAL_LOGITS
    assert "rank 0 holds pieces of" in a["evidence"] and "rank 1 holds pieces of" in a["evidence"]


def test_causal_ring_is_the_causal_row_leaks_and_fails_the_audit_naming_context_parallelism(result):
    r = result["layouts"]["ring_causal"]
    # torch's ring over the 2 ranks computes exactly the one-process plain causal mask over the row ...
    assert r["max_logit_diff_one_process"] < EQUAL_LOGITS and abs(r["loss"] - r["loss_one_process"]) < EQUAL_LOSS
    assert r["max_grad_diff"] < EQUAL_GRAD * r["max_grad"], r
    # ... which is not the documents alone: the leak, and the step-0 loss it costs
    assert r["max_logit_diff_alone"] > 1.0 and r["loss_ratio"] > 1.5, r
    a = r["audit"]
    assert a["status"] == "fail" and a["finding"] == "fail" and a["failed"][:1] == ["perturbation"], a
    assert "context_parallel" in a["failed"] and a["cause"].startswith("context parallelism: the attention across the 2 ranks")
    assert a["perturbation"] > 1.0


def test_the_probe_records_what_torch_runs_here(result):
    probe = result["probe"]
    assert probe["ring attention forward + backward (CPU flash op)"] == "ok"
    assert probe["flex_attention forward, context-parallel BlockMask"] == "ok"
    # what torch's CP cannot do on a CPU: if a torch release lifts these, update cp_attention's docstring
    assert probe["flex_attention backward"].startswith("NotImplementedError")
    assert probe["context_parallel() + SDPA (causal)"].startswith("NotImplementedError")
    text = summary(result)
    assert "ring_causal" in text and "audit documents" in text and "FAIL" in text


def test_main_outside_a_launcher_is_a_one_line_error(monkeypatch, tmp_path):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(PacksimError, match="runs under torchrun"):
        main(["--out", str(tmp_path / "x.json")])
    assert "RANK" not in os.environ
