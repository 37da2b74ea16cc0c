"""Trap explorer (notebook 04), on the option-built batches it shares with the trap table (those
batches themselves: tests/test_traps.py). It needs the course extra (plotly, ipywidgets): where
that is not installed (the window-low CI leg installs packsim[trl,dev]) the file is skipped."""

from __future__ import annotations

import pytest
import torch

from packsim.core.extras import missing

GONE = missing("plotly", "ipywidgets")
if GONE:
    pytest.skip(f"the trap explorer needs the course extra ({', '.join(GONE)} not installed here)",
                allow_module_level=True)

from packsim.core.errors import PacksimError  # noqa: E402
from packsim.exhibits.trap_cases import CONDITIONS, build_family, packed_batch  # noqa: E402
from packsim.exhibits.traps import NO_4D_MASK, alone_change, for_impl  # noqa: E402
from packsim.reference.flash import REFERENCE_KERNEL  # noqa: E402
from packsim.reference.flash_emulation import real_flash_attn  # noqa: E402
from packsim.viz import trap_explorer, trap_figure  # noqa: E402
from packsim.viz.style import GUIDE  # noqa: E402
from packsim.viz.traps import trap_rule  # noqa: E402
from packsim.viz.widget import escape, shown_figure  # noqa: E402


@pytest.fixture(scope="module")
def explorer():
    w = trap_explorer()
    yield w
    w.close()


def _set(w, impl="sdpa", positions="restart", mask="none", use_cache=False, rows=1):
    w.impl.value, w.positions.value, w.mask.value = impl, positions, mask
    w.use_cache.value, w.rows.value = use_cache, rows
    return w.verdict.value


@pytest.mark.parametrize(
    "options, verdict",
    [
        (dict(), "isolated"),
        (dict(mask="ones"), "LEAKS"),
        (dict(use_cache=True), "LEAKS"),
        (dict(rows=2), "isolated"),
        (dict(positions="continuous"), "LEAKS"),
        (dict(mask="bool_4d"), "isolated"),
        (dict(impl="eager", mask="bool_4d"), "LEAKS"),
        (dict(impl="eager", mask="float_4d"), "isolated"),
        (dict(impl="eager", positions="continuous", mask="float_4d"), "isolated"),  # RoPE: relative
        (dict(mask="padded"), "LEAKS"),
    ],
)
def test_controls_give_the_libraries_verdict(explorer, options, verdict):
    shown = _set(explorer, **options)
    assert f">{verdict}</b>" in shown
    impl = options.pop("impl", "sdpa")
    batch, kwargs, seq = packed_batch(**options)
    diffs = alone_change(build_family("llama", impl), batch, kwargs, seq, impl=impl)
    assert explorer.diffs == pytest.approx(diffs, abs=1e-7)
    assert (max(diffs) <= 1e-5) == (verdict == "isolated")


def test_one_bar_per_example_on_a_log_axis_with_the_tolerance(explorer):
    for rows in (1, 2):
        _set(explorer, rows=rows)
        fig = shown_figure(explorer.out)
        (bars,) = fig["data"]
        assert bars["type"] == "bar" and len(bars["x"]) == 3 * rows == len(explorer.diffs)
        assert fig["layout"]["yaxis"]["type"] == "log"
        (line,) = fig["layout"]["shapes"]
        assert line["y0"] == line["y1"] == 1e-5
        # the axis writes powers of ten as "1e-5", as the tolerance label and the verdict do
        axis = fig["layout"]["yaxis"]
        assert (axis["exponentformat"], axis["showexponent"], axis["dtick"]) == ("e", "all", 1)
        (label,) = [a["text"] for a in fig["layout"]["annotations"] if "tolerance" in a["text"]]
        assert label == "tolerance 1e-5"
        assert line["line"]["color"] == GUIDE  # reads on the light and the dark plot area
    assert "(tolerance 1e-5)" in explorer.verdict.value
    assert trap_figure(mask="ones").layout.title.text.startswith("sdpa: LEAKS")


def test_rule_line_names_the_trap_table_condition(explorer):
    _set(explorer, mask="ones")
    assert CONDITIONS["ones_mask"] in explorer.rule.value
    _set(explorer, mask="ones", use_cache=True)
    assert "ones_mask" in explorer.rule.value and "cache" in explorer.rule.value
    assert "no restart" in trap_rule(positions="continuous")
    assert trap_rule() == f"trap-table condition positions: {CONDITIONS['positions']}"


@pytest.mark.skipif(real_flash_attn() is not None, reason="a real flash-attn runs flash_attention_2 here")
@pytest.mark.parametrize(
    "options, verdict",
    [(dict(), "isolated"), (dict(mask="ones"), "isolated"), (dict(use_cache=True), "isolated"),
     (dict(rows=2), "LEAKS"), (dict(mask="padded"), "LEAKS"), (dict(positions="continuous"), "LEAKS")],
)
def test_flash_runs_on_the_reference_kernel_and_says_so(explorer, options, verdict):
    shown = _set(explorer, impl="flash_attention_2", **options)
    assert f">{verdict}</b>" in shown and escape(REFERENCE_KERNEL) in shown and "float32, tolerance 1e-05" in shown
    assert "reference kernel" in shown_figure(explorer.out)["layout"]["title"]["text"]
    # ground truth apart from the flash path: each example alone, the same weights, on eager
    eager = build_family("llama", "eager")
    flash = for_impl(eager, "flash_attention_2")
    batch, kwargs, seq = packed_batch(**options)
    with torch.no_grad():
        packed = flash(**batch, **kwargs).logits  # (B, T, V)
        truth = []
        for b in range(seq.shape[0]):
            for e in sorted(set(seq[b].tolist()) - {-1}):
                alone = eager(input_ids=batch["input_ids"][b, seq[b] == e][None], use_cache=False).logits[0]
                truth.append(float((packed[b, seq[b] == e] - alone).abs().max()))
    assert explorer.diffs == pytest.approx(truth, abs=1e-6)
    assert (max(truth) <= 1e-5) == (verdict == "isolated")


def test_a_4d_mask_on_the_flash_path_says_why_instead_of_bars(explorer):
    shown = _set(explorer, impl="flash_attention_2", mask="bool_4d")
    assert ">not run</b>" in shown and escape(NO_4D_MASK) in shown and explorer.diffs == []
    with pytest.raises(PacksimError, match="takes no 4D mask") as err:
        trap_figure(impl="flash_attention_2", mask="float_4d")
    assert "\n" not in str(err.value)
    _set(explorer)  # back to a drawn state for the next tests


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(impl="vanilla"), "impl="),
        (dict(mask="2d"), "mask="),
        (dict(positions="reset"), "positions="),
        (dict(rows=3), "rows="),
        (dict(use_cache="no"), "use_cache="),
        (dict(tol=0), "tol="),
    ],
)
def test_bad_arguments_raise_one_line(kwargs, match):
    with pytest.raises(PacksimError, match=match) as err:
        trap_explorer(**kwargs)
    assert "\n" not in str(err.value)
