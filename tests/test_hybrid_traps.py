"""The trap-table rows for hybrid state-space models and an mRoPE text stack: every cell's verdict
against an independent perturbation computed here, and packsim.audit agreeing with it."""

import pytest
import torch

from packsim import audit
from packsim.auditing.hybrid_findings import stateful_layers
from packsim.core.errors import PacksimError
from packsim.exhibits.hybrid_traps import (
    CUDA_REFUSAL,
    FRONTIER_FAMILIES,
    build_frontier,
    frontier_batch,
    frontier_table,
)
from packsim.exhibits.trap_cases import VOCAB

TOL = 1e-5


def _perturbed_change(model, batch, seq) -> float:
    """Max |logit change| on examples 1.. when example 0's tokens change (independent of the table)."""
    first = seq == 0  # (1, T)
    ids = batch["input_ids"]
    new = ids.clone()
    gen = torch.Generator().manual_seed(7)
    new[first] = (ids[first] + torch.randint(1, VOCAB - 3, (int(first.sum()),), generator=gen)) % (VOCAB - 3) + 3
    rest = {k: v for k, v in batch.items() if k != "input_ids"}
    with torch.no_grad():
        a = model(input_ids=ids, **rest, use_cache=False).logits
        b = model(input_ids=new, **rest, use_cache=False).logits
    return float((a - b).abs()[~first].max())


@pytest.fixture(scope="module", params=["hybrid", "mrope"])
def table(request):
    return frontier_table(request.param)


def test_every_cell_agrees_with_an_independent_perturbation(table):
    assert table.disagreements() == []
    for family in table.families:
        model = build_frontier(family, "sdpa")
        for condition in table.conditions:
            cell = table.cell(family, "sdpa", condition)
            batch, seq = frontier_batch(condition)
            if cell.status == "needs CUDA":
                with pytest.raises(ValueError, match=CUDA_REFUSAL):
                    _perturbed_change(model, batch, seq)
                report = audit(model, batch, use_cache=False)  # never PASS, never the ValueError
                finding = next(f for f in report.findings if f.name == "hybrid_state")
                assert report.status == "not measured" and finding.status == "skipped", report.verdict
                assert "needs the CUDA kernel" in finding.evidence
                assert all(layer in finding.evidence for layer in stateful_layers(model)), finding.evidence
                continue
            moved = _perturbed_change(model, batch, seq)
            assert (moved > TOL) == (cell.status == "leaks"), (family, condition, moved, cell)
            assert cell.agrees, cell


def test_what_the_installed_transformers_does(table):
    if table.families[0] == "qwen2_vl":  # only the 4-row layout builds the packed mask
        status = {c: table.cell("qwen2_vl", "sdpa", c).status for c in table.conditions}
        assert status == {"positions_2d": "leaks", "positions_3d": "leaks", "positions_4rows": "isolated",
                          "ones_mask_4rows": "leaks"}
        return
    for family in table.families:  # no CPU path isolates a hybrid model's packed row
        assert all(table.cell(family, "sdpa", c).status in ("leaks", "needs CUDA") for c in table.conditions)
    assert table.cell("bamba", "sdpa", "seq_idx").status == "needs CUDA"
    assert table.cell("mamba2", "sdpa", "seq_idx").status == "leaks"  # seq_idx never reaches the mixer
    assert "needs CUDA: `causal_conv1d_fn` can't keep packed sequences apart" in table.text()
    assert "needs CUDA" in table.to_html()


def test_bad_input():
    with pytest.raises(PacksimError, match="kind="):
        frontier_table("vision")
    with pytest.raises(PacksimError, match="not of kind"):
        frontier_table("mrope", families=["bamba"])
    with pytest.raises(PacksimError, match="unknown family"):
        build_frontier("nope")
    assert set(FRONTIER_FAMILIES) >= {"bamba", "qwen3_next", "lfm2", "qwen2_vl", "zamba2", "granitemoehybrid", "falcon_h1"}
