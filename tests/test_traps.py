"""The live trap table: every measured cell agrees with packsim.audit, and pins today's transformers facts.

Like tests/test_transformers_traps.py, the facts below are what the INSTALLED transformers does
(5.24.0 when written; the same on both ends of the tested window, 5.16.1 and 5.25.0, measured); a
failure there means transformers changed behaviour and the course must follow. The agreement test is packsim's own claim: the audit's verdict equals an independent
perturbation in every cell. The flash_attention_2 column runs transformers' own flash path on the
reference kernel (packsim, pure torch), not flash-attn, where flash-attn cannot run; its verdicts
are also checked against each example run alone through the same weights on eager.
"""

from __future__ import annotations

import re
import sys

import pytest
import torch

from packsim import PacksimError
from packsim.core.extras import missing
from packsim.exhibits.trap_cases import (
    CONDITION_OPTIONS,
    CONDITIONS,
    FAMILIES,
    HUB_KERNEL,
    PAD,
    build_family,
    condition_batch,
    condition_of,
    packed_batch,
)
from packsim.exhibits.traps import NO_4D_MASK, for_impl, impl_tol, perturbation_change, trap_table
from packsim.reference.flash import REFERENCE_KERNEL
from packsim.reference.flash_emulation import real_flash_attn

LEAK_MIN = 1e-3  # measured leaks of the tiny families: 2e-2 .. 0.5
# condition -> isolated? on eager and sdpa (transformers 5.16.1, 5.24.0 and 5.25.0; torch 2.13)
FACTS = {"positions": True, "ones_mask": False, "zeros_mask": False, "cache": False, "rows": True,
         "cu_seq_lens": False, "float_4d": True}
BOOL_4D = {"eager": False, "sdpa": True}  # eager ADDS a bool mask (+1/+0): masks nothing
# condition -> isolated? on transformers' flash path (modeling_flash_attention_utils._flash_attention_forward):
# an all-ones mask is dropped (masking_utils.flash_attention_mask) and the cache is not read; a mask
# with zeros is unpadded by (_upad_input: one segment per row, positions ignored); two rows are not
# checked for a pack (_is_packed_sequence: batch size 1 only); cu_seq_lens_* reach the varlen kernel
FLASH_FACTS = {"positions": True, "ones_mask": True, "zeros_mask": False, "cache": True, "rows": False,
               "cu_seq_lens": True}
on_reference = pytest.mark.skipif(real_flash_attn() is not None, reason="a real flash-attn runs the column here")


@pytest.fixture(scope="module")
def table():
    return trap_table(families=("llama", "gpt2"), impls=("eager", "sdpa"))


def test_every_cell_is_measured_and_the_audit_agrees(table):
    assert len(table.cells) == 2 * 2 * len(CONDITIONS)
    assert all(c.measured for c in table.cells), [c for c in table.cells if not c.measured]
    assert table.disagreements() == [], table.text()
    for c in table.cells:
        if c.status == "leaks":
            assert c.change > LEAK_MIN and "perturbation" in c.audit_failed, c
        else:
            assert c.change <= 1e-5 and c.audit_isolated, c


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_installed_transformers_facts(table, family, impl):
    for condition, isolated in {**FACTS, "bool_4d": BOOL_4D[impl]}.items():
        cell = table.cell(family, impl, condition)
        assert (cell.status == "isolated") == isolated, (
            f"transformers changed behaviour: update the course. {cell}")


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile:UserWarning")
def test_flex_attention_cells_run_uncompiled_on_cpu():
    t = trap_table(families=("llama",), impls=("flex_attention",), conditions=("positions", "bool_4d"),
                   compile_flex=False)
    assert t.cell("llama", "flex_attention", "positions").status == "isolated"
    assert t.cell("llama", "flex_attention", "bool_4d").status == "leaks"  # flex adds the mask too
    assert t.disagreements() == [] and "uncompiled" in t.header()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only guard")
def test_cells_that_cannot_run_here_say_why():
    t = trap_table(families=("llama", "gpt2"), impls=("flex_attention", "flash_attention_2", HUB_KERNEL),
                   conditions=("float_4d",), compile_flex=True)
    crash = t.cell("llama", "flex_attention", "float_4d")
    assert crash.status == "not run" and "crashed the process" in crash.note
    assert t.cell("gpt2", "flex_attention", "float_4d").note.startswith("not supported")
    for family in ("llama", "gpt2"):  # run, and refused by transformers' own flash path, not the kernel
        assert t.cell(family, "flash_attention_2", "float_4d").note == f"{NO_4D_MASK} (IndexError)"
        hub = t.cell(family, HUB_KERNEL, "float_4d").note
        assert hub.startswith(f"the Hub kernel {HUB_KERNEL} needs CUDA") and "downloads nothing at run time" in hub
    text = t.text()
    assert "n/a[1]" in text and "[1] not run:" in text and "0 cells measured" in text


# ---- the flash_attention_2 column, on the reference kernel where flash-attn cannot run ----------


@pytest.fixture(scope="module")
def flash():
    return trap_table(impls=("flash_attention_2",))  # every family x condition: about 15 s on 2 cores


def test_flash_cells_are_measured_on_transformers_flash_path_and_the_audit_agrees(flash):
    for c in flash.cells:
        if c.condition.endswith("_4d"):
            assert c.status == "not run" and c.note.startswith(NO_4D_MASK), c
            continue
        assert (c.status == "isolated") == FLASH_FACTS[c.condition], (
            f"transformers' flash path changed behaviour: update the course. {c}")
        assert c.agrees, c  # the audit's verdict equals the independent perturbation
        if c.status == "leaks":
            assert c.change > 1e-2 and "perturbation" in c.audit_failed, c
        else:
            assert c.change == 0.0 and c.audit_isolated, c
    assert len(flash.cells) == len(FAMILIES) * len(CONDITIONS)
    assert flash.disagreements() == [] and f"agrees with the perturbation in {len(FAMILIES) * 6}/" in flash.header()


@on_reference
def test_flash_cells_name_the_reference_kernel_and_their_tolerance(flash):
    llama, gpt2 = flash.cell("llama", "flash_attention_2", "rows"), flash.cell("gpt2", "flash_attention_2", "rows")
    assert llama.kernel.startswith(REFERENCE_KERNEL) and "float32, tolerance 1e-05" in llama.kernel
    assert gpt2.kernel.startswith(REFERENCE_KERNEL) and "bfloat16, tolerance 1e-02" in gpt2.kernel  # no nn.Linear
    text = flash.text()
    assert "isolated[a]" in text and "LEAKS[a]" in text and "LEAKS[b]" in text
    assert f"[a] flash_attention_2 kernel: {llama.kernel}" in text and f"[b] flash_attention_2 kernel: {gpt2.kernel}" in text
    assert REFERENCE_KERNEL in flash.to_html()


def _alone_on_eager(condition: str) -> list[float]:
    """Max |flash packed logits - the example alone on eager| per example: the same weights, no flash path."""
    model = build_family("llama", "eager")
    flash_model = for_impl(model, "flash_attention_2")
    batch, kwargs, seq = condition_batch(condition)
    with torch.no_grad():
        packed = flash_model(**batch, **kwargs).logits  # (B, T, V)
        diffs = []
        for b in range(seq.shape[0]):
            for e in sorted(set(seq[b].tolist()) - {-1}):
                where = seq[b] == e
                alone = model(input_ids=batch["input_ids"][b, where][None], use_cache=False).logits[0]
                diffs.append(float((packed[b, where] - alone).abs().max()))
    return diffs


@on_reference
@pytest.mark.parametrize("condition", sorted(FLASH_FACTS))
def test_flash_verdicts_match_each_example_alone_on_eager(flash, condition):
    diffs = _alone_on_eager(condition)
    cell = flash.cell("llama", "flash_attention_2", condition)
    tol = impl_tol("flash_attention_2", 1e-5)
    assert diffs[0] < tol  # a row's first example has nothing before it
    assert (max(diffs) <= tol) == (cell.status == "isolated"), (condition, diffs)


@on_reference
def test_every_family_runs_the_column_on_the_reference_kernel(flash):
    for c in flash.cells:
        if c.measured:
            assert c.kernel.startswith(REFERENCE_KERNEL), c
    assert {c.family for c in flash.cells if c.status == "leaks"} == set(FAMILIES)


def test_the_perturbation_is_independent_and_exact():
    model = build_family("llama", "sdpa")
    batch, kwargs, seq = condition_batch("positions")
    later, own = perturbation_change(model, batch, kwargs, seq)
    assert later == 0.0 and own > LEAK_MIN
    batch, kwargs, seq = condition_batch("ones_mask")
    assert perturbation_change(model, batch, kwargs, seq)[0] > LEAK_MIN


def test_condition_batches_have_the_documented_shapes():
    assert condition_batch("rows")[0]["input_ids"].shape == (2, 32)
    batch, _, seq = condition_batch("zeros_mask")
    assert batch["attention_mask"][0].tolist() == [1] * (32 - PAD) + [0] * PAD
    assert seq[0, -PAD:].tolist() == [-1] * PAD and (batch["input_ids"][0, -PAD:] == 0).all()
    assert batch["position_ids"][0, 23:].tolist() == list(range(32 - PAD - 23)) + list(range(PAD))
    mask = condition_batch("bool_4d")[0]["attention_mask"]
    assert mask.shape == (1, 1, 32, 32) and mask.dtype == torch.bool
    batch, kwargs, _ = condition_batch("cu_seq_lens")
    assert batch["cu_seq_lens_q"].tolist() == [0, 10, 23, 32] and kwargs == {"use_cache": False}
    assert condition_batch("cache")[1] == {"use_cache": True}


def test_every_condition_is_a_set_of_packed_batch_options():
    assert set(CONDITION_OPTIONS) == set(CONDITIONS)
    for name, options in CONDITION_OPTIONS.items():
        batch, kwargs, seq = condition_batch(name)
        ref, ref_kwargs, ref_seq = packed_batch(**options)
        assert kwargs == ref_kwargs and torch.equal(seq, ref_seq)
        for key, value in ref.items():
            assert torch.equal(batch[key], value), (name, key)
        assert condition_of(**options) == (None if name == "cu_seq_lens" else name)
    assert packed_batch(positions="continuous", rows=2)[0]["position_ids"].shape == (2, 32)


def test_every_family_builds_from_its_config():
    for family in FAMILIES:
        model = build_family(family)
        assert model.config.vocab_size == 96 and not model.training


def test_renderings(table):
    text = str(table)
    assert text.splitlines()[0].startswith("Is a packed row isolated? Measured on transformers")
    assert "agrees with the perturbation in 32/32" in text
    assert "llama   eager" in text and "LEAKS" in text
    page = table._repr_html_()
    assert "<table>" in page and "max |change|" in page


@pytest.mark.skipif(bool(missing("plotly")), reason="plotly (the course extra) is not installed")
def test_the_heatmap_shows_every_cell_and_the_kernel(table, flash):
    fig = table.figure()
    assert len(fig.data[0].y) == 4 and list(fig.data[0].x) == list(CONDITIONS)
    if real_flash_attn() is None:
        assert "kernel: reference kernel" in str(flash.figure().data[0].customdata)


def test_without_plotly_the_heatmap_says_which_extra_it_needs(table, monkeypatch):
    monkeypatch.setitem(sys.modules, "plotly", None)  # `import plotly` fails, as if not installed
    line = ('TrapTable.figure needs the course extra (plotly is not installed here): '
            'pip install "packsim[course]"')
    with pytest.raises(PacksimError, match=re.escape(line)):
        table.figure()


def test_bad_names_are_refused():
    with pytest.raises(PacksimError, match="unknown families"):
        trap_table(families=("nope",))
    with pytest.raises(PacksimError, match="unknown conditions"):
        trap_table(conditions=("nope",))
    with pytest.raises(PacksimError, match="no cell"):
        trap_table(families=("llama",), impls=("eager",), conditions=("positions",)).cell("gpt2", "eager", "positions")
