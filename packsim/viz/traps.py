"""Trap explorer (notebook 04): pick an attention implementation and the call options of a packed
forward; see whether each example's logits match the example run alone.

The batch is the trap table's (:func:`packsim.exhibits.trap_cases.packed_batch`): ``rows`` packed
rows of 32 tokens, three examples each, input_ids (B, 32) with B = 1 or 2, position_ids (B, 32)
restarting per example or continuous 0..31, attention_mask none / (B, 32) ones / (B, 32) with
zeros on the row's last 2 tokens (padding) / (B, 1, 32, 32) block-diagonal bool or additive float,
and ``use_cache``. The model is the trap table's tiny Llama
(:func:`~packsim.exhibits.trap_cases.build_family`, fp32 on CPU, built once per implementation).
:func:`packsim.exhibits.traps.alone_change` measures, per example, max |packed logits - logits of
the example run alone| (alone: input_ids (1, L), positions 0..L-1, no mask, no cache); the row is
"isolated" when every example stays within ``tol`` (1e-5 in fp32), else it "LEAKS". One line names
the trap-table condition (:data:`~packsim.exhibits.trap_cases.CONDITIONS`) the options are, or
the conditions they combine. flash_attention_2 runs transformers' own flash path on the real
flash-attn where it and CUDA are there (bf16, tolerance 1e-2), else on the reference kernel
(packsim, pure torch), not flash-attn, in fp32; the verdict line names the kernel. A 4D mask on
the flash path says that transformers' flash path takes none instead of drawing bars.

Lessons: 04.
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go

from packsim.core.errors import PacksimError
from packsim.exhibits.trap_cases import (
    CONDITIONS,
    build_family,
    condition_of,
    packed_batch,
)
from packsim.exhibits.traps import (
    FLASH_IMPLS,
    NO_4D_MASK,
    alone_change,
    for_impl,
    impl_kernel,
    impl_reason,
    impl_tol,
    raised_in,
)
from packsim.viz.style import GUIDE, LEAK_RED, SETUP_COLOURS, layout, sci
from packsim.viz.widget import PacksimWidget, escape, show_figure, style_html

__all__ = ["TrapExplorer", "trap_explorer", "trap_figure", "trap_rule", "measure_options",
           "EXPLORER_IMPLS"]

EXPLORER_IMPLS = ("eager", "sdpa", "flex_attention", "flash_attention_2")
_FLOOR = 1e-10  # bars of exactly 0 drawn at this height on the log axis (hover shows the value)
_OPTION_CONDITION = {("mask", "ones"): "ones_mask", ("mask", "bool_4d"): "bool_4d",
                     ("mask", "float_4d"): "float_4d", ("mask", "padded"): "zeros_mask",
                     ("use_cache", True): "cache", ("rows", 2): "rows"}  # fmt: skip


def _check_impl(impl) -> str:
    if impl not in EXPLORER_IMPLS:
        raise PacksimError(f"impl={impl!r}: use one of {list(EXPLORER_IMPLS)}.")
    reason = impl_reason(impl)
    if reason:
        raise PacksimError(f"impl={impl!r} cannot run here ({reason}): pick one of eager, sdpa, "
                           "flex_attention.")
    return impl


def _build(impl: str):
    """The trap table's tiny Llama switched to ``impl`` (flash: :func:`for_impl`'s copy, on CUDA
    where the real flash-attn runs)."""
    from packsim.reference.flash_emulation import real_flash_attn

    model = build_family("llama", "eager")
    return for_impl(model.cuda() if impl in FLASH_IMPLS and real_flash_attn() else model, impl)


def _model(impl: str):
    """:func:`_build` once per implementation, shared by every redraw."""
    from packsim.core.model import shared_model  # transformers' model classes: only when drawn

    return shared_model(_build, impl)


def measure_options(impl: str = "sdpa", positions: str = "restart", mask: str = "none",
                    use_cache: bool = False, rows: int = 1, seed: int = 0) -> list[float]:
    """Max |packed - alone| logits per example (row 0's three examples, then row 1's).

    Raises PacksimError for a 4D mask on the flash path (transformers' flash path takes none).
    """
    _check_impl(impl)
    batch, kwargs, seq = packed_batch(positions, mask, use_cache, rows, seed)
    model = _model(impl)
    refused = PacksimError(f"impl={impl!r} with mask={mask!r}: {NO_4D_MASK}; pick mask none, ones or "
                           "padded, or another impl.")
    if impl in FLASH_IMPLS and mask.endswith("_4d") and model.device.type == "cuda":
        raise refused  # on CUDA the out-of-range index would be a device-side assert
    try:
        return alone_change(model, batch, kwargs, seq, impl=impl)
    except Exception as err:
        if impl in FLASH_IMPLS and mask.endswith("_4d") and raised_in(err, "_upad_input"):
            raise refused from None
        raise


def _kernel(impl: str, tol: float) -> str:
    """The kernel ``impl`` runs on here, in words ('' for eager / sdpa / flex)."""
    return impl_kernel(impl, _model(impl), tol) if impl in FLASH_IMPLS else ""


def trap_rule(positions: str = "restart", mask: str = "none", use_cache: bool = False,
              rows: int = 1) -> str:
    """The trap-table condition these options are, in the table's words, or the ones they combine."""
    name = condition_of(positions, mask, use_cache, rows)
    if name is not None:
        return f"trap-table condition {name}: {CONDITIONS[name]}"
    given = {"mask": mask, "use_cache": use_cache, "rows": rows}
    parts = [f"{c} ({CONDITIONS[c]})" for (k, v), c in _OPTION_CONDITION.items() if given[k] == v]
    if positions == "continuous":
        parts.append("position_ids 0..31 (no restart), as in cu_seq_lens but without "
                     "cu_seq_lens_q/k")
    return "no single trap-table condition; these options combine: " + "; ".join(parts)


def _verdict(diffs, tol: float) -> str:
    return "isolated" if max(diffs) <= tol else "LEAKS"


def _names(rows: int) -> list[str]:
    return [f"row {r} ex {e}" for r in range(rows) for e in range(3)]


def _figure(diffs, impl: str, rows: int, tol: float) -> go.Figure:
    names = _names(rows)
    leaks = [d > tol for d in diffs]
    fig = go.Figure(go.Bar(
        x=names, y=[max(d, _FLOOR) for d in diffs],
        marker_color=[LEAK_RED if bad else SETUP_COLOURS["correct"] for bad in leaks],
        customdata=[sci(d, 2) for d in diffs],
        hovertemplate="%{x}: max |packed - alone| = %{customdata}<extra></extra>",
    ))  # fmt: skip
    # GUIDE reads on the plot area of either theme; the axis writes 1e-5 as the tolerance does
    fig.add_hline(y=tol, line=dict(color=GUIDE, dash="dash", width=1.5),
                  annotation_text=f"tolerance {sci(tol)}", annotation_position="top left")
    on = ""
    if impl in FLASH_IMPLS:
        on = " on the reference kernel (packsim)" if "reference" in impl_kernel(impl) else " on flash-attn"
    title = (f"{impl}{on}: {_verdict(diffs, tol)} ({sum(leaks)} of {len(diffs)} examples differ "
             "from the example run alone)")
    yaxis = dict(type="log", title="max |packed - alone| logits", range=[-10.5, 1], dtick=1,
                 exponentformat="e", showexponent="all", minexponent=0)
    return layout(fig, title, 340, yaxis=yaxis, bargap=0.4)


def trap_figure(impl: str = "sdpa", positions: str = "restart", mask: str = "none",
                use_cache: bool = False, rows: int = 1, tol: float = 1e-5, seed: int = 0) -> go.Figure:
    """Static figure: one bar per example, max |packed - alone| logits, log scale, tolerance line."""
    diffs = measure_options(impl, positions, mask, use_cache, rows, seed)
    return _figure(diffs, impl, rows, impl_tol(impl, tol, _model(impl)))


def _toggles(options, value, description: str, tooltips=None) -> widgets.ToggleButtons:
    return widgets.ToggleButtons(options=options, value=value, description=description,
                                 tooltips=tooltips or [], style={"button_width": "auto"})


class TrapExplorer(PacksimWidget):
    """Trap explorer widget; build it with :func:`trap_explorer`.

    Controls: ``impl``, ``positions``, ``mask``, ``use_cache``, ``rows``; results: ``verdict``,
    ``rule``, ``out`` (the bar chart), ``diffs`` (the last measurement), ``note`` (why an
    implementation cannot be picked).
    """

    def __init__(self, impl: str, positions: str, mask: str, use_cache: bool, rows: int,
                 tol: float, seed: int):
        self.tol, self.seed, self.diffs, self._reverting = tol, seed, [], False
        self.unavailable = {i: r for i in EXPLORER_IMPLS if (r := impl_reason(i))}
        tips = [f"cannot run here: {self.unavailable[i]}" if i in self.unavailable else i
                for i in EXPLORER_IMPLS]
        self.impl = _toggles(EXPLORER_IMPLS, impl, "attention", tips)
        self.positions = _toggles([("restart per example", "restart"),
                                   ("continuous 0..N-1", "continuous")], positions, "positions")
        self.mask = _toggles([("none", "none"), ("all-ones 2D", "ones"),
                              ("2D with zeros (padding)", "padded"),
                              ("bool 4D block-diagonal", "bool_4d"),
                              ("float 4D block-diagonal", "float_4d")], mask, "attention_mask")
        self.use_cache = _toggles([("False", False), ("True", True)], use_cache, "use_cache")
        self.rows = _toggles([("1", 1), ("2", 2)], rows, "rows/batch")
        self.note = widgets.HTML(self._note_html(highlight=False))
        self.verdict, self.rule = widgets.HTML(), widgets.HTML()
        self.out = widgets.Output(layout=widgets.Layout(min_height="350px"))
        self.impl.observe(self._on_impl, names="value")
        for w in (self.positions, self.mask, self.use_cache, self.rows):
            w.observe(lambda _c: self.update(), names="value")
        controls = [self.impl, self.note, self.positions, self.mask, self.use_cache, self.rows]
        self.widget = widgets.VBox([style_html(), *controls, self.verdict, self.rule, self.out])
        self.widget.add_class("packsim-traps")
        self.update()

    def _note_html(self, highlight: bool) -> str:
        if not self.unavailable:
            return ""
        text = "; ".join(f"{i} disabled: {r}" for i, r in self.unavailable.items())
        cls = "packsim-bad" if highlight else "packsim-muted"
        return f'<span class="{cls}">{escape(text)}</span>'

    def _on_impl(self, change) -> None:
        if self._reverting:  # the change back below: what it shows is already measured
            return
        if change["new"] in self.unavailable:  # listed, but it cannot run here: go back, say why
            self._reverting = True
            try:
                self.impl.value = change["old"]
            finally:
                self._reverting = False
            self.note.value = self._note_html(highlight=True)
            return
        self.note.value = self._note_html(highlight=False)
        self.update()

    def options(self) -> dict:
        return dict(positions=self.positions.value, mask=self.mask.value,
                    use_cache=self.use_cache.value, rows=self.rows.value)

    def tolerance(self) -> float:
        return impl_tol(self.impl.value, self.tol, _model(self.impl.value))

    def figure(self) -> go.Figure:
        return _figure(self.diffs, self.impl.value, self.rows.value, self.tolerance())

    def update(self) -> None:
        """Measure the current options and redraw the verdict, the rule and the bars."""
        impl, opts = self.impl.value, self.options()
        self.rule.value = f"<i>Rule:</i> {escape(trap_rule(**opts))}"
        try:
            self.diffs = measure_options(impl, **opts, seed=self.seed)
        except PacksimError as err:  # a 4D mask on the flash path: say why, draw nothing
            self.diffs = []
            self.verdict.value = f'<b class="packsim-muted">not run</b> &nbsp; {escape(str(err))}'
            self.out.clear_output()
            return
        tol = self.tolerance()
        verdict = _verdict(self.diffs, tol)
        cls = "packsim-ok" if verdict == "isolated" else "packsim-bad"  # theme colours (widget.css)
        worst = max(range(len(self.diffs)), key=self.diffs.__getitem__)
        kernel = _kernel(impl, tol)
        self.verdict.value = (
            f'<b class="{cls}" style="font-size:1.2em">{verdict}</b> &nbsp; worst: '
            f"{_names(opts['rows'])[worst]}, max |packed - alone| = {sci(self.diffs[worst], 1)} "
            f"(tolerance {sci(tol)})" + (f"<br><i>kernel:</i> {escape(kernel)}" if kernel else ""))
        show_figure(self.out, self.figure())


def trap_explorer(impl: str = "sdpa", positions: str = "restart", mask: str = "none",
                  use_cache: bool = False, rows: int = 1, tol: float = 1e-5,
                  seed: int = 0) -> TrapExplorer:
    """Trap explorer widget (notebook 04): attention implementation x call options -> verdict.

    ``impl``: one of :data:`EXPLORER_IMPLS` that can run here; ``positions``: "restart" |
    "continuous"; ``mask``: "none" | "ones" | "padded" | "bool_4d" | "float_4d"; ``use_cache``: bool;
    ``rows``: 1 | 2; ``tol``: the largest |packed - alone| logit difference still "isolated".
    """
    _check_impl(impl)
    trap_rule(positions, mask, use_cache, rows)  # checks the options (one-line PacksimError)
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol > 0:
        raise PacksimError(f"tol={tol!r}: use a positive number such as 1e-5.")
    return TrapExplorer(impl, positions, mask, use_cache, rows, float(tol), seed)

