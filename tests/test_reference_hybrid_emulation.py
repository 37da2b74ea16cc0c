"""packsim.reference.hybrid_emulation: the reference kernels behind transformers' own kernel wrappers.

Pins what the wiring relies on in transformers (fails naming what moved), the real package winning
(stand-in modules), idempotence and undo; then per hybrid family (tiny models from
:func:`packsim.exhibits.hybrid_traps.build_frontier`) a packed row of three examples against each
example run alone (ground truth computed here): isolated with the family's fields under the
reference kernels, leaking with position_ids only, and which field each family needs.
"""

import sys
import types
import warnings

import pytest
import torch
from installed import mamba2_drops_seq_idx, reads_seq_idx, wrapper_refuses

from packsim.auditing.hybrid_findings import CUDA_REFUSAL, stateful_layers
from packsim.core.errors import PacksimError
from packsim.core.segments import cu_seqlens_from_lengths
from packsim.core.upstream.hub_kernels import wrapper_cells
from packsim.exhibits.hybrid_traps import build_frontier, frontier_batch
from packsim.exhibits.trap_cases import ROWS
from packsim.reference.conv import REFERENCE_KERNEL
from packsim.reference.conv import causal_conv1d_fn as ref_conv
from packsim.reference.hybrid_emulation import (
    HYBRID_MODULES,
    REFERENCES,
    emulate_hybrid_kernels,
    kernel_sites,
    kernels_in_use,
)

TOL = 1e-5
LENGTHS = ROWS[0]  # three examples of 10, 13 and 9 tokens in one row of 32
# the sites each family's modeling module must hold (transformers' kernel names)
EXPECTED = {
    "bamba": {"causal_conv1d_fn", "causal_conv1d_update", "mamba_chunk_scan_combined",
              "mamba_split_conv1d_scan_combined", "selective_state_update"},
    "qwen3_next": {"causal_conv1d_fn", "causal_conv1d_update", "chunk_gated_delta_rule",
                   "fused_recurrent_gated_delta_rule"},
    "lfm2": {"causal_conv1d_fn", "causal_conv1d_update"},
}
FAMILIES = ["bamba", "qwen3_next", "lfm2", "zamba2", "granitemoehybrid", "falcon_h1"]  # mamba2: its own tests
# what each family needs next to position_ids to keep the three examples apart under the reference kernels
NEEDS = {"bamba": ("seq_idx",), "qwen3_next": ("seq_idx", "cu_seq_lens"), "lfm2": ("seq_idx",),
         "zamba2": ("seq_idx",), "granitemoehybrid": ("seq_idx", "block_mask"), "falcon_h1": ("seq_idx",)}


@pytest.fixture(autouse=True)
def _quiet():
    import transformers

    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    transformers.logging.set_verbosity(level)


@pytest.fixture
def wired():
    with emulate_hybrid_kernels() as kernels:
        yield kernels


_MODELS = {}


def _model(family):
    if family not in _MODELS:
        _MODELS[family] = build_frontier(family)
    return _MODELS[family].eval()


def _batch(*fields):
    """(batch, seq): the frontier row (position_ids restarting per example) plus ``fields``."""
    batch, seq = frontier_batch("positions")
    T = seq.shape[1]
    cu = cu_seqlens_from_lengths(LENGTHS)
    for f in fields:
        if f == "seq_idx":
            batch["seq_idx"] = seq.to(torch.int32)
        elif f == "cu_seq_lens":
            batch.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(LENGTHS), max_length_k=max(LENGTHS))
        elif f == "block_mask":  # (1, 1, T, T) additive: causal inside each example, -inf elsewhere
            keep = (seq[0][:, None] == seq[0][None, :]) & torch.ones(T, T, dtype=torch.bool).tril()
            batch["attention_mask"] = torch.where(keep, 0.0, float("-inf"))[None, None]
    return batch, seq


def _logits(model):
    return lambda **b: model(**b, use_cache=False).logits


def _change(forward, batch, seq) -> float:
    """Max |packed output - the example run alone (input_ids (1, L) only)| over the three examples."""
    with torch.no_grad():
        packed = forward(**batch)[0]
        return max(float((packed[seq[0] == e] - forward(input_ids=batch["input_ids"][:, seq[0] == e])[0]).abs().max())
                   for e in range(len(LENGTHS)))


def _on_the_fallback(forward, batch, seq):
    """seq_idx on transformers' torch fallback, per version: 5.24 on refuse it (ValueError); 5.16.1 drops it
    silently, so the state crosses (measured against each example alone)."""
    if wrapper_refuses():
        with pytest.raises(ValueError, match=CUDA_REFUSAL):
            _change(forward, batch, seq)
    else:
        assert _change(forward, batch, seq) > TOL


def _sharpened(family):
    """A fresh model of ``family`` whose stateful layers' input projections are x4 (and gated DeltaNet's
    decay slowed to A = 0.01), so a state crossing shows on the logits at the 1e-3 scale: the tiny random
    init makes LFM2's 3-tap conv leak only ~4e-5 and gated DeltaNet forget within a token or two."""
    model = build_frontier(family).eval()
    names = set(stateful_layers(model))
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__ in names:
                for child_name, child in module.named_children():
                    if child_name.startswith("in_proj"):
                        child.weight.mul_(4)
                if type(module).__name__.endswith("GatedDeltaNet"):
                    module.A_log.fill_(torch.log(torch.tensor(0.01)))
    return model


# ---- transformers internals the wiring relies on (the wrapper itself: tests/test_upstream_hub_kernels.py) ---

@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_pin_each_family_calls_its_kernels_through_module_level_wrappers(family):
    import importlib

    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    found = {s.func_name for s in kernel_sites([module])}
    assert EXPECTED[family] <= found, (f"transformers moved: models/{family}/modeling_{family}.py no longer holds "
                                       f"module-level kernel wrappers for {sorted(EXPECTED[family] - found)}")


# ---- the wiring ---------------------------------------------------------------------------------------

def test_wires_every_hybrid_module_idempotent_and_undoable():
    before = kernels_in_use()
    assert before and not any(v == REFERENCE_KERNEL for v in before.values())
    first = emulate_hybrid_kernels()
    try:
        assert first.kernel == REFERENCE_KERNEL and REFERENCE_KERNEL in str(first)
        modules = {w.rsplit(".", 2)[0] for w in first.wired}
        assert {f"transformers.models.{f}" for f in HYBRID_MODULES} <= modules
        used = kernels_in_use()
        assert set(REFERENCES) <= set(used) and all(used[k] == REFERENCE_KERNEL for k in REFERENCES)
        assert kernels_in_use()["selective_state_update"].startswith("transformers' torch fallback")  # left alone
        second = emulate_hybrid_kernels()
        assert second.wired == () and set(second.already) == set(first.wired)
        second.undo()  # wired nothing, restores nothing
        assert kernels_in_use()["causal_conv1d_fn"] == REFERENCE_KERNEL
    finally:
        first.undo()
        first.undo()
    assert kernels_in_use() == before
    _on_the_fallback(_logits(_model("lfm2")), *_batch("seq_idx"))  # transformers' own behaviour is back


def test_the_wrapper_filters_keywords_as_for_the_real_package(wired):
    from transformers.models.bamba import modeling_bamba as mb

    x, w, bias = torch.randn(1, 6, 32), torch.randn(6, 4), torch.randn(6)
    batch, seq = _batch("seq_idx", "cu_seq_lens")
    extra = {k: v for k, v in batch.items() if k not in ("input_ids",)}
    out = mb.causal_conv1d_fn(x, w, bias, activation="silu", **extra)  # cu_seq_lens_q & co are dropped
    assert torch.equal(out, ref_conv(x, w, bias, seq_idx=batch["seq_idx"], activation="silu"))
    assert kernels_in_use(_model("bamba"))["mamba_chunk_scan_combined"] == REFERENCE_KERNEL


def test_an_installed_package_wins(monkeypatch):
    """A (stand-in) causal_conv1d importable: packsim does not stand in for it, the other packages get wired."""
    standin = types.ModuleType("causal_conv1d")
    monkeypatch.setitem(sys.modules, "causal_conv1d", standin)
    with emulate_hybrid_kernels() as kernels:
        assert kernels.kept and all("causal_conv1d is installed" in k for k in kernels.kept)
        assert not any(w.endswith(("causal_conv1d_fn", "causal_conv1d_update")) for w in kernels.wired)
        used = kernels_in_use(_model("bamba"))
        assert used["causal_conv1d_fn"].startswith("transformers' torch fallback")
        assert used["mamba_chunk_scan_combined"] == REFERENCE_KERNEL
        _on_the_fallback(_logits(_model("bamba")), *_batch("seq_idx"))  # the conv is transformers' fallback


def test_a_package_transformers_bound_wins(monkeypatch):
    """transformers bound a (stand-in) real causal_conv1d at import: the site is kept and calls it."""
    from transformers.integrations.hub_kernels import use_kernel_func_from_hub_with_fallback

    standin = types.ModuleType("causal_conv1d")
    standin.causal_conv1d_fn = lambda x, weight, bias=None, seq_idx=None, activation=None: "the real package"
    monkeypatch.setitem(sys.modules, "causal_conv1d", standin)
    wrapper = use_kernel_func_from_hub_with_fallback("causal_conv1d_fn", "causal_conv1d")(lambda x, **kw: "fallback")
    monkeypatch.delitem(sys.modules, "causal_conv1d")  # bound, no longer importable: the binding alone decides
    modeling = types.ModuleType("standin_modeling")
    modeling.causal_conv1d_fn = wrapper
    with emulate_hybrid_kernels(modules=[modeling]) as kernels:
        assert kernels.wired == () and kernels.kept == (
            "standin_modeling.causal_conv1d_fn (causal_conv1d (the real package), bound by transformers)",)
        args = (torch.zeros(1, 2, 3), torch.zeros(2, 4))
        if "supported_devices" in wrapper_cells(wrapper):  # transformers 5.25: causal_conv1d runs on CUDA only,
            with pytest.raises(ValueError, match=CUDA_REFUSAL):  # so CPU inputs meet the refusal
                wrapper(*args, seq_idx=torch.zeros(1, 3))
        else:  # 5.24: the bound package gets every input
            assert wrapper(*args, seq_idx=torch.zeros(1, 3)) == "the real package"
        assert kernels_in_use(modeling) == {"causal_conv1d_fn": "causal_conv1d (the real package)"}


def test_a_transformers_without_the_wrappers_fails_loudly(monkeypatch):
    import packsim.core.upstream.hub_kernels as hk

    monkeypatch.setattr(hk, "CELLS", (*hk.CELLS, "a_name_transformers_never_had"))
    with pytest.raises(PacksimError, match="transformers .* moved"):
        emulate_hybrid_kernels()


# ---- per family: packed vs each example alone ----------------------------------------------------------

def test_without_the_reference_kernels_seq_idx_is_refused_or_leaks():
    """transformers as loaded, the cells the wiring turns into measurements: refused from 5.24 on, a silent
    leak in 5.16.1."""
    for family in FAMILIES:
        _on_the_fallback(_logits(_model(family)), *_batch(*NEEDS[family]))


@pytest.mark.parametrize("family", FAMILIES)
def test_family_isolates_with_its_fields_and_leaks_with_positions_only(family, wired):
    model = _model(family)
    if not reads_seq_idx(family):  # transformers 5.16.1's Falcon-H1 drops seq_idx before its mixer
        assert _change(_logits(model), *_batch(*NEEDS[family])) > TOL
        return
    assert _change(_logits(model), *_batch(*NEEDS[family])) <= TOL
    assert _change(_logits(model), *_batch()) > TOL  # as built: position_ids only leaks
    sharp = _sharpened(family)
    assert _change(_logits(sharp), *_batch(*NEEDS[family])) <= TOL
    assert _change(_logits(sharp), *_batch()) > 1e-3


@pytest.mark.parametrize("family", ["bamba", "zamba2", "granitemoehybrid", "falcon_h1"])
def test_training_mode_fused_path_isolates(family, wired, monkeypatch):
    """In train mode the Mamba2 mixers call mamba_split_conv1d_scan_combined (the fused kernel)."""
    import packsim.reference.ssm as rs

    calls = []
    monkeypatch.setattr(rs, "causal_conv1d_fn", lambda *a, **k: calls.append(1) or ref_conv(*a, **k))
    model = _model(family).train()
    try:
        isolated = _change(_logits(model), *_batch(*NEEDS[family]))
        assert (isolated <= TOL) == reads_seq_idx(family), isolated  # Falcon-H1 in 5.16.1 drops seq_idx
        assert calls, "the fused kernel did not run"
        assert _change(_logits(model), *_batch()) > TOL
    finally:
        model.eval()


@pytest.mark.parametrize("family", [*FAMILIES, "mamba2"])
def test_one_sequence_runs_as_on_transformers_fallback(family):
    """Where the fallback is right (one example, no boundary), the reference kernels change nothing."""
    model = _model(family)
    ids = {"input_ids": _batch()[0]["input_ids"][:, :13]}
    with torch.no_grad():
        fallback = model(**ids, use_cache=False).logits
        with emulate_hybrid_kernels():
            reference = model(**ids, use_cache=False).logits
    assert (reference - fallback).abs().max() <= TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_every_field_the_family_needs_is_needed(family, wired):
    sharp = _sharpened(family)
    needs = NEEDS[family]
    for dropped in needs:
        rest = [f for f in needs if f != dropped]
        assert _change(_logits(sharp), *_batch(*rest)) > 1e-3, f"{family} isolates without {dropped}"
    if "cu_seq_lens" not in needs:  # cu_seq_lens_* never stands in for seq_idx (the real conv kernel ignores it too)
        assert _change(_logits(sharp), *_batch("cu_seq_lens")) > 1e-3


def test_granitemoehybrid_mamba_layer_isolates_but_its_attention_needs_a_mask(wired):
    """GraniteMoeHybridModel builds the attention mask without position_ids
    (models/granitemoehybrid/modeling_granitemoehybrid.py, mask_kwargs), so restarting positions do not
    make it block-diagonal: the Mamba layer (layer 0) isolates with seq_idx, the logits leak."""
    model = _model("granitemoehybrid")
    after_mamba = lambda **b: model(**b, use_cache=False, output_hidden_states=True).hidden_states[1]  # noqa: E731
    assert _change(after_mamba, *_batch("seq_idx")) <= TOL
    assert _change(after_mamba, *_batch()) > 1e-3
    assert _change(_logits(model), *_batch("seq_idx")) > 1e-3


def test_mamba2_for_causal_lm_and_its_backbone_with_seq_idx(wired):
    """Up to transformers 5.24 Mamba2ForCausalLM.forward calls its backbone without **kwargs
    (models/mamba2/modeling_mamba2.py), so seq_idx never reaches a mixer through it; 5.25 passes it on.
    Mamba2Model (the backbone) isolates with seq_idx from 5.24 on, with the fused kernel too; in 5.16.1
    Mamba2Block drops it as well."""
    model = _model("mamba2")
    batch, seq = _batch()
    ids = {"input_ids": batch["input_ids"]}
    through_head = _change(_logits(model), {**ids, "seq_idx": seq.int()}, seq)
    if mamba2_drops_seq_idx():
        with torch.no_grad():
            assert torch.equal(model(**ids, seq_idx=seq.int()).logits, model(**ids).logits)
        assert through_head > 1e-3
    else:
        assert through_head <= TOL
    head = lambda **b: model.lm_head(model.backbone(**b, use_cache=False)[0])  # noqa: E731
    assert _change(head, ids, seq) > 1e-3
    if not reads_seq_idx("mamba2", backbone=True):  # 5.16.1: Mamba2Block drops it before the mixer too
        assert _change(head, {**ids, "seq_idx": seq.int()}, seq) > 1e-3
        return
    assert _change(head, {**ids, "seq_idx": seq.int()}, seq) <= TOL
    model.train()
    try:
        assert _change(head, {**ids, "seq_idx": seq.int()}, seq) <= TOL  # the fused kernel
    finally:
        model.eval()
