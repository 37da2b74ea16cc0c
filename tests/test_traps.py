"""The live trap table: every measured cell agrees with packsim.audit, and pins today's transformers facts.

Like tests/test_transformers_traps.py, the facts below are what the INSTALLED transformers does
(5.24.0 when written); a failure there means transformers changed behaviour and the course must
follow. The agreement test is packsim's own claim: the audit's verdict equals an independent
perturbation in every cell.
"""

from __future__ import annotations

import pytest
import torch

from packsim import PacksimError
from packsim.exhibits.trap_cases import (
    CONDITIONS,
    FAMILIES,
    HUB_KERNEL,
    build_family,
    condition_batch,
)
from packsim.exhibits.traps import perturbation_change, trap_table

LEAK_MIN = 1e-3  # measured leaks of the tiny families: 2e-2 .. 0.5
# condition -> isolated? on eager and sdpa (transformers 5.24, torch 2.13)
FACTS = {"positions": True, "ones_mask": False, "cache": False, "rows": True, "cu_seq_lens": False,
         "float_4d": True}
BOOL_4D = {"eager": False, "sdpa": True}  # eager ADDS a bool mask (+1/+0): masks nothing


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
    for impl in ("flash_attention_2", HUB_KERNEL):
        assert t.cell("llama", impl, "float_4d").note == "needs a GPU (no CUDA device here)"
    text = t.text()
    assert "n/a[1]" in text and "[1] not run:" in text and "0 cells measured" in text


def test_the_perturbation_is_independent_and_exact():
    model = build_family("llama", "sdpa")
    batch, kwargs, seq = condition_batch("positions")
    later, own = perturbation_change(model, batch, kwargs, seq)
    assert later == 0.0 and own > LEAK_MIN
    batch, kwargs, seq = condition_batch("ones_mask")
    assert perturbation_change(model, batch, kwargs, seq)[0] > LEAK_MIN


def test_condition_batches_have_the_documented_shapes():
    assert condition_batch("rows")[0]["input_ids"].shape == (2, 32)
    mask = condition_batch("bool_4d")[0]["attention_mask"]
    assert mask.shape == (1, 1, 32, 32) and mask.dtype == torch.bool
    batch, kwargs, _ = condition_batch("cu_seq_lens")
    assert batch["cu_seq_lens_q"].tolist() == [0, 10, 23, 32] and kwargs == {"use_cache": False}
    assert condition_batch("cache")[1] == {"use_cache": True}


def test_every_family_builds_from_its_config():
    for family in FAMILIES:
        model = build_family(family)
        assert model.config.vocab_size == 96 and not model.training


def test_renderings(table):
    text = str(table)
    assert text.splitlines()[0].startswith("Is a packed row isolated? Measured on transformers")
    assert "agrees with the perturbation in 28/28" in text
    assert "llama   eager" in text and "LEAKS" in text
    page = table._repr_html_()
    assert "<table>" in page and "max |change|" in page
    fig = table.figure()
    assert len(fig.data[0].y) == 4 and list(fig.data[0].x) == list(CONDITIONS)


def test_bad_names_are_refused():
    with pytest.raises(PacksimError, match="unknown families"):
        trap_table(families=("nope",))
    with pytest.raises(PacksimError, match="unknown conditions"):
        trap_table(conditions=("nope",))
    with pytest.raises(PacksimError, match="no cell"):
        trap_table(families=("llama",), impls=("eager",), conditions=("positions",)).cell("gpt2", "eager", "positions")
