"""packsim.auditing.context_parallel on one process: one rank's shard simulated, every case the audit
must tell apart, each with its ground truth computed here independently of the audit.

The shard is rank 0 of 2 under the zigzag split (chunks i and 2cp-1-i of every document, so every
document is cut across the ranks: packsim.scaling.context_parallel.zigzag_split); its
"context-parallel forward" is the committed trained model on the whole row under a mask chosen per
case, read at those positions. The real 2-rank runs are in tests/test_cp_compare.py.
"""

from __future__ import annotations

import pytest
import torch

from packsim.auditing.context_parallel import audit_context_parallel
from packsim.core.data import make_examples
from packsim.core.errors import PacksimError
from packsim.core.masks import to_additive_4d
from packsim.experiment.committed_models import load_committed_model
from packsim.scaling.context_parallel import zigzag_split
from packsim.scaling.cp_attention import document_row


@pytest.fixture(scope="module")
def setting():
    model = load_committed_model("correct")
    model.set_attn_implementation("sdpa")
    row = document_row(make_examples(80, seed=7), T=256, cp_size=2)
    starts = torch.tensor([0, *row.lengths]).cumsum(0)
    held = torch.tensor([int(starts[d]) + p for d, a, b in zigzag_split(row.lengths, 2)[0] for p in range(a, b)])  # (128,)
    return model, row, held


def _masks(row, held):
    doc = row.doc_ids[0]
    i = torch.arange(row.T)
    causal = i[:, None] >= i[None, :]  # (T, T)
    on_shard = torch.zeros(row.T, dtype=torch.bool)
    on_shard[held] = True
    return {"documents": causal & (doc[:, None] == doc[None, :]),
            "causal_row": causal,
            # each rank sees only the keys it holds: a document cut across ranks loses its other chunks
            "local_keys": causal & (doc[:, None] == doc[None, :]) & (on_shard[None, :] == on_shard[:, None])}


def _forward(model, row, held, mask):
    add = to_additive_4d(mask[None])  # (1, 1, T, T)

    def cp_forward(ids):
        return model(input_ids=ids, position_ids=row.position_ids, attention_mask=add, use_cache=False).logits[:, held]

    return cp_forward


def _alone_gap(model, row, held, mask) -> float:
    """Ground truth: max |logits under ``mask`` - every document alone| over the held real tokens."""
    full = _forward(model, row, torch.arange(row.T), mask)(row.input_ids)[0]  # (T, V)
    gap, start = 0.0, 0
    real = row.real_mask()
    for length in row.lengths:
        alone = model(input_ids=row.input_ids[:, start : start + length], use_cache=False).logits[0]
        pos = [p for p in held.tolist() if start <= p < start + length and real[p]]
        if pos:
            gap = max(gap, float((full[pos] - alone[[p - start for p in pos]]).abs().max()))
        start += length
    return gap


def _audit(model, row, held, mask, **kw):
    kw.setdefault("position_ids", row.position_ids[:, held])
    kw.setdefault("targets", row.targets[:, held])
    return audit_context_parallel(model, _forward(model, row, held, mask), row.input_ids, row.lengths, held, **kw)


@torch.no_grad()
def test_documents_mask_passes_and_equals_the_documents_alone(setting):
    model, row, held = setting
    mask = _masks(row, held)["documents"]
    assert _alone_gap(model, row, held, mask) < 1e-4  # ground truth: isolated
    report = _audit(model, row, held, mask)
    assert report.status == "pass" and report.ok, report.verdict
    assert report.findings[0].name == "context_parallel" and report.findings[0].status == "pass"
    assert report.skipped == ["gradient", "attention_mass"]
    assert report.probes["loss_coverage"].status == report.probes["positions"].status == "pass"


@torch.no_grad()
def test_plain_causal_mask_across_the_shards_fails_with_the_context_parallel_cause(setting):
    model, row, held = setting
    mask = _masks(row, held)["causal_row"]
    truth = _alone_gap(model, row, held, mask)
    assert truth > 1.0  # ground truth: the documents read the ones before them
    report = _audit(model, row, held, mask)
    assert report.status == "fail"
    assert report.failed == ["perturbation", "context_parallel"]
    assert report.causes[0].startswith("context parallelism: the attention across the 1 ranks' shards ignores")
    assert "context parallelism" in report.verdict and "_PerDocumentHeadTailLoadBalancer" in report.findings[0].fix
    wp = report.worst_pair
    assert wp is not None and wp.perturbed < wp.affected  # causal: an earlier document moves a later one
    gap = float(report.findings[0].evidence.split("max ")[1].split(" ")[0])
    assert gap == pytest.approx(truth, rel=5e-3)  # the finding prints the ground truth (3 digits)


@torch.no_grad()
def test_keys_kept_on_their_own_shard_lose_context_without_leaking(setting):
    model, row, held = setting
    mask = _masks(row, held)["local_keys"]
    assert _alone_gap(model, row, held, mask) > 1e-2  # ground truth: documents cut across ranks changed
    report = _audit(model, row, held, mask)
    assert report.probes["perturbation"].status == "pass"  # no document moves another
    assert report.failed == ["context_parallel"]
    assert "lost their own context" in report.causes[0]


@torch.no_grad()
def test_positions_that_do_not_restart_and_targets_shifted_on_the_shard_fail(setting):
    model, row, held = setting
    mask = _masks(row, held)["documents"]
    report = _audit(model, row, held, mask, position_ids=held[None],  # row offsets, not document offsets
                    targets=torch.roll(row.input_ids[:, held], -1, dims=1))  # shifted after sharding
    assert report.probes["positions"].failed and report.probes["loss_coverage"].failed
    wrong_pos = int((held != row.position_ids[0, held]).sum())  # the row's own restarting positions
    assert wrong_pos > 0 and report.probes["positions"].value == wrong_pos
    assert any("shift the labels once over the whole row" in c for c in report.causes)


def test_bad_input(setting):
    model, row, held = setting
    fwd = _forward(model, row, held, _masks(row, held)["documents"])
    with pytest.raises(PacksimError, match="sum to the row's 256 tokens"):
        audit_context_parallel(model, fwd, row.input_ids, row.lengths[:-1], held)
    with pytest.raises(PacksimError, match="one packed row"):
        audit_context_parallel(model, fwd, row.input_ids[0], row.lengths, held)
    with pytest.raises(PacksimError, match="this rank holds 10 tokens"):
        audit_context_parallel(model, fwd, row.input_ids, row.lengths, held[:10])
