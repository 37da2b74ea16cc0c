"""The trap-table rows for hybrid state-space models and an mRoPE text stack: every cell's verdict
against an independent perturbation computed here, and packsim.audit agreeing with it. The hybrid
table runs on packsim's reference kernels (emulate_hybrid_kernels, undone after); with
reference_kernels=False the seq_idx cells are transformers' refusal ("needs CUDA"), as before."""

import pytest
import torch
from installed import mamba2_drops_seq_idx as measured_mamba2_drops
from installed import reads_seq_idx, wrapper_refuses

from packsim import audit
from packsim.auditing.hybrid_findings import stateful_layers
from packsim.core.errors import PacksimError
from packsim.exhibits.hybrid_sources import mamba2_drops_seq_idx
from packsim.exhibits.hybrid_traps import (
    CUDA_REFUSAL,
    FRONTIER_FAMILIES,
    FRONTIER_TOL,
    build_frontier,
    frontier_batch,
    frontier_cell,
    frontier_needs,
    frontier_table,
)
from packsim.exhibits.trap_cases import VOCAB
from packsim.reference.conv import REFERENCE_KERNEL
from packsim.reference.hybrid_emulation import emulate_hybrid_kernels, kernels_in_use

HYBRID = [f for f, spec in FRONTIER_FAMILIES.items() if spec[0] == "hybrid"]
MAMBA2_DROPS = measured_mamba2_drops()  # True on transformers <= 5.24 (measured: tests/installed.py)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()  # tiny matrices: one thread beats two fighting on a 2-core machine
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _perturbed_change(model, batch, seq) -> float:
    """Max |logit change| of the other examples when one example's tokens change, each example in turn
    (independent of the table and of the audit)."""
    ids = batch["input_ids"]
    rest = {k: v for k, v in batch.items() if k != "input_ids"}
    gen = torch.Generator().manual_seed(7)
    worst = 0.0
    with torch.no_grad():
        base = model(input_ids=ids, **rest, use_cache=False).logits
        for e in seq[0].unique().tolist():
            mine = seq == e  # (1, T)
            new = ids.clone()
            new[mine] = (ids[mine] + torch.randint(1, VOCAB - 3, (int(mine.sum()),), generator=gen)) % (VOCAB - 3) + 3
            moved = model(input_ids=new, **rest, use_cache=False).logits
            worst = max(worst, float((moved - base).abs()[~mine].max()))
    return worst


def _alone_change(model, batch, seq) -> float:
    """Max |packed logits - logits of each example run alone (input_ids (1, L) only)|: the ground truth."""
    with torch.no_grad():
        packed = model(**batch, use_cache=False).logits[0]  # (T, V)
        return max(float((packed[seq[0] == e] - model(input_ids=batch["input_ids"][:, seq[0] == e],
                                                      use_cache=False).logits[0]).abs().max())
                   for e in seq[0].unique().tolist())


@pytest.fixture(scope="module", params=["hybrid", "mrope"])
def table(request):
    before = kernels_in_use()
    made = frontier_table(request.param)
    assert kernels_in_use() == before  # the table's wiring is undone: no global state changed
    return made


def test_every_cell_agrees_with_an_independent_perturbation(table):
    assert table.disagreements() == []
    tol = FRONTIER_TOL["hybrid" if table.families[0] in HYBRID else "mrope"]
    with emulate_hybrid_kernels():  # the kernels the table ran on
        for family in table.families:
            model = build_frontier(family, "sdpa")
            for condition in table.conditions:
                cell = table.cell(family, "sdpa", condition)
                assert cell.measured, cell  # no "needs CUDA" left on the reference kernels
                moved = _perturbed_change(model, *frontier_batch(condition))
                assert (moved > tol) == (cell.status == "leaks"), (family, condition, moved, cell)
                assert cell.agrees, cell
                if family in HYBRID:
                    assert cell.kernel.startswith(f"conv / scan kernels on the {REFERENCE_KERNEL} ("), cell.kernel


def test_what_the_installed_transformers_does(table):
    if table.families[0] == "qwen2_vl":  # only the 4-row layout builds the packed mask
        status = {c: table.cell("qwen2_vl", "sdpa", c).status for c in table.conditions}
        assert status == {"positions_2d": "leaks", "positions_3d": "leaks", "positions_4rows": "isolated",
                          "ones_mask_4rows": "leaks"}
        return
    isolated = {f: {c for c in table.conditions if table.cell(f, "sdpa", c).status == "isolated"}
                for f in table.families}
    seq_idx_families = {"seq_idx", "seq_idx_cu_seq_lens", "seq_idx_block_mask"}
    expected = {"bamba": seq_idx_families, "lfm2": seq_idx_families, "zamba2": seq_idx_families,
                "falcon_h1": seq_idx_families, "qwen3_next": {"seq_idx_cu_seq_lens"},
                "granitemoehybrid": {"seq_idx_block_mask"}, "mamba2": seq_idx_families}
    # where seq_idx never reaches the state (measured: Mamba2ForCausalLM <= 5.24, Falcon-H1 in 5.16.1) nothing isolates
    dropped = {f for f in expected if not reads_seq_idx(f)}
    assert isolated == {f: set() if f in dropped else cells for f, cells in expected.items()}
    needs = frontier_needs(table)
    assert all(needs[f] == "seq_idx" for f in ("bamba", "lfm2", "zamba2", "falcon_h1", "mamba2") if f not in dropped)
    for family in dropped:
        assert needs[family].startswith("nothing in this table isolates it: "), needs[family]
        assert "without seq_idx or **kwargs (transformers/models/" in needs[family]
    assert needs["qwen3_next"].startswith("seq_idx + cu_seq_lens_q/k: Qwen3NextGatedDeltaNet hands cu_seq_lens_q")
    assert needs["granitemoehybrid"].startswith("seq_idx + a 4D block-diagonal attention_mask: "
                                                "GraniteMoeHybridModel.forward builds its attention mask without")
    if MAMBA2_DROPS:
        assert needs["mamba2"].startswith("nothing in this table isolates it: Mamba2ForCausalLM.forward calls "
                                          "self.backbone without seq_idx")
    assert "sdpa kernel: conv / scan kernels on the reference kernel (packsim, pure torch)" in table.text()


def test_the_cells_that_cannot_isolate_say_why_with_the_transformers_line():
    """Mamba2ForCausalLM's cells name the file:line of the backbone call that drops seq_idx: read it here.
    Where the installed transformers passes it (5.25), the cell isolates and names no such line."""
    from pathlib import Path

    from transformers.models.mamba2 import modeling_mamba2

    table = frontier_table("hybrid", families="mamba2", run_audit=False)
    kernel = table.cell("mamba2", "sdpa", "seq_idx").kernel
    assert mamba2_drops_seq_idx() == MAMBA2_DROPS  # the source reading agrees with the measurement
    if not MAMBA2_DROPS:
        assert "(transformers/" not in kernel and table.cell("mamba2", "sdpa", "seq_idx").status == "isolated"
        return
    path, line = kernel.split("(transformers/")[1].split(")")[0].rsplit(":", 1)
    assert modeling_mamba2.__file__.endswith(path)
    text = Path(modeling_mamba2.__file__).read_text().splitlines()
    call = " ".join(text[int(line) - 1:int(line) + 9]).split(")")[0]  # the backbone call's arguments
    assert "self.backbone(" in text[int(line) - 1] and "seq_idx" not in call and "**kwargs" not in call


@pytest.mark.parametrize("family", ["bamba"])
def test_bamba_on_the_reference_kernel_against_each_example_alone(family):
    """Ground truth here: each example run alone. seq_idx isolates on the reference kernel; position_ids
    only leaks; the table's cells say so and name the kernel."""
    model = build_frontier(family)
    with emulate_hybrid_kernels():
        assert _alone_change(model, *frontier_batch("seq_idx")) <= FRONTIER_TOL["hybrid"]
        assert _alone_change(model, *frontier_batch("positions")) > 1e-2
    small = frontier_table("hybrid", families=family)
    assert small.cell(family, "sdpa", "seq_idx").status == "isolated"
    assert small.cell(family, "sdpa", "positions").status == "leaks"
    assert all(REFERENCE_KERNEL in c.kernel for c in small.cells) and small.disagreements() == []


def test_one_cell_measures_on_the_reference_kernels_as_the_table_does():
    """frontier_cell (A8's drill) on a model built outside any wiring: each cell equals the table's cell
    (status, value, kernel), agrees with a perturbation computed here and with the audit; nothing stays
    wired; reference_kernels=False is transformers as loaded (seq_idx refused)."""
    before = kernels_in_use()
    bamba = build_frontier("bamba")
    small = frontier_table("hybrid", families="bamba", run_audit=False)
    status = {}
    for condition in ("positions", "seq_idx"):
        cell = frontier_cell(bamba, "bamba", condition)
        assert kernels_in_use() == before  # the cell's wiring is undone
        twin = small.cell("bamba", "sdpa", condition)
        assert (cell.status, cell.change, cell.kernel) == (twin.status, twin.change, twin.kernel), (cell, twin)
        assert cell.kernel.startswith(f"conv / scan kernels on the {REFERENCE_KERNEL} ("), cell.kernel
        assert cell.agrees, cell
        with emulate_hybrid_kernels():
            moved = _perturbed_change(bamba, *frontier_batch(condition))
        assert (moved > FRONTIER_TOL["hybrid"]) == (cell.status == "leaks"), (condition, moved, cell)
        status[condition] = cell.status
    assert status == {"positions": "leaks", "seq_idx": "isolated"}
    refused = frontier_cell(bamba, "bamba", "seq_idx", run_audit=False, reference_kernels=False)
    if wrapper_refuses():  # transformers 5.24 on: the torch fallback refuses seq_idx
        assert refused.status == "needs CUDA" and CUDA_REFUSAL in refused.note
        assert "emulate_hybrid_kernels" in refused.note
    else:  # 5.16.1: it drops seq_idx silently, and the cell measures the leak
        assert refused.status == "leaks", refused
        assert _perturbed_change(bamba, *frontier_batch("seq_idx")) > FRONTIER_TOL["hybrid"]  # ground truth
    with pytest.raises(PacksimError, match="unknown family"):
        frontier_cell(bamba, "mamba3", "seq_idx")


def test_without_the_reference_kernels_seq_idx_is_refused():
    """reference_kernels=False: transformers as loaded; seq_idx reaches its torch fallback and is refused."""
    old = frontier_table("hybrid", families=("bamba", "mamba2"), reference_kernels=False)
    bamba = build_frontier("bamba")
    batch, seq = frontier_batch("seq_idx")
    if not wrapper_refuses():  # transformers 5.16.1: the fallback drops seq_idx silently, the cells leak
        assert old.cell("bamba", "sdpa", "seq_idx").status == old.cell("mamba2", "sdpa", "seq_idx").status == "leaks"
        assert _perturbed_change(bamba, batch, seq) > FRONTIER_TOL["hybrid"] and "needs CUDA" not in old.text()
        return
    assert old.cell("bamba", "sdpa", "seq_idx").status == "needs CUDA"
    # seq_idx never reaches the mixer where the ForCausalLM drops it; else transformers refuses it as for bamba
    assert old.cell("mamba2", "sdpa", "seq_idx").status == ("leaks" if MAMBA2_DROPS else "needs CUDA")
    assert "needs CUDA: `causal_conv1d_fn` can't keep packed sequences apart" in old.text()
    assert "needs CUDA" in old.to_html()
    with pytest.raises(ValueError, match=CUDA_REFUSAL):
        _perturbed_change(bamba, batch, seq)
    report = audit(bamba, batch, use_cache=False)  # never PASS, never the ValueError
    finding = next(f for f in report.findings if f.name == "hybrid_state")
    assert report.status == "not measured" and finding.status == "skipped", report.verdict
    assert "needs a kernel that reads seq_idx" in finding.evidence and "emulate_hybrid_kernels()" in finding.fix
    assert all(layer in finding.evidence for layer in stateful_layers(bamba)), finding.evidence
    assert "transformers' torch fallback" in old.cell("bamba", "sdpa", "positions").kernel


def test_bad_input():
    with pytest.raises(PacksimError, match="kind="):
        frontier_table("vision")
    with pytest.raises(PacksimError, match="not of kind"):
        frontier_table("mrope", families=["bamba"])
    with pytest.raises(PacksimError, match="unknown family"):
        build_frontier("nope")
    assert set(FRONTIER_FAMILIES) >= {"bamba", "qwen3_next", "lfm2", "qwen2_vl", "zamba2", "granitemoehybrid", "falcon_h1"}


def test_a_transformers_the_wiring_does_not_fit_says_so_and_the_cell_still_runs(monkeypatch):
    """Outside the window (the wrappers moved): one warning naming the version, and the cell is measured on
    transformers as loaded (refused or leaking, per version), never a crash."""
    import packsim.core.upstream.hub_kernels as hk

    monkeypatch.setattr(hk, "CELLS", (*hk.CELLS, "a_name_transformers_never_had"))
    with pytest.warns(UserWarning, match=r"transformers \S+ moved.*as loaded"):
        cell = frontier_cell(build_frontier("bamba"), "bamba", "seq_idx", run_audit=False)
    assert cell.status == ("needs CUDA" if wrapper_refuses() else "leaks"), cell
