"""The live trap table: is a packed row isolated, per model family x attention implementation x condition?

Every cell is MEASURED on the installed transformers, never written down: a tiny model of the family
(2 layers, hidden 32, vocab 96, random weights, built from its config: no download) runs a packed
row of 32 tokens (three examples, position_ids restarting at each), then runs it again with the
tokens of the first example of each row changed. The cell is "isolated" when no token of a later
example moves by more than ``tol`` (fp32: 1e-5), else "leaks". Then :func:`packsim.audit` runs on
the same model, batch and kwargs, and the cell records whether its verdict agrees.

Conditions (columns, :data:`CONDITIONS` says each in words) are batch dicts passed as
``model(**batch, use_cache=...)``: input_ids (1, 32) or (2, 32) for ``rows``, position_ids (B, 32),
optionally attention_mask (B, 32) of ones or a 4D block-diagonal mask (B, 1, 32, 32) (bool or
additive float), or cu_seq_lens_q/k (S+1,) with max_length_q/k.

flash_attention_2 and the hub kernel run only where CUDA and the package are present (in bfloat16,
tolerance ``FLASH_TOL``; that path has not yet run on a GPU); elsewhere the cell says why not.
flex_attention runs UNCOMPILED on CPU by default (transformers' flex masking code, torch's flex
kernel without torch.compile): compiling costs seconds per mask on CPU and, measured on torch
2.13.0+cpu, compiled CPU flex with a 4D tensor mask crashed the process (see
tests/test_transformers_traps.py); with ``compile_flex=True`` on CPU those 4D-tensor cells are
"not run" instead of crashing.

Meant for lessons 04 and 07 and docs/audit.md, to print instead of prose claims, so the course stays
true when transformers changes. The full table (8 families x 5 implementations x 7 conditions) takes
minutes on a 2-core CPU: pass ``families=`` / ``impls=`` / ``conditions=`` for a subset.

Lessons: 04, 07, 09.
"""

from __future__ import annotations

import html
import importlib.util
import platform
import time
import warnings
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch

from packsim.core.device import model_device
from packsim.core.errors import PacksimError

LEAK_PROBES = ("perturbation", "gradient", "attention_mass")
VOCAB = 96
ROWS = ((10, 13, 9), (12, 8, 12))  # example lengths of the two rows, 32 tokens each
HUB_KERNEL = "kernels-community/flash-attn2"
FLASH_TOL = 1e-2  # flash cells run in bf16 (set before any GPU run; not measured on a GPU yet)
IMPLS = ("eager", "sdpa", "flex_attention", "flash_attention_2", HUB_KERNEL)
CONDITIONS = {
    "positions": "position_ids restart per example, no attention_mask, use_cache=False",
    "ones_mask": "the same plus an all-ones 2D attention_mask",
    "cache": "the same as positions, but use_cache=True (a cache is built in the forward)",
    "rows": "two packed rows per batch (2, 32), position_ids restart, no mask, no cache",
    "cu_seq_lens": "cu_seq_lens_q/k and max_length_q/k given, position_ids 0..31 (no restart)",
    "bool_4d": "block-diagonal causal 4D mask (1, 1, 32, 32) as bool (True = attend)",
    "float_4d": "the same 4D mask as additive float (0 = attend, finfo.min elsewhere)",
}
_DECODER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256)
_IDS = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0)
# family -> (config class in transformers, config kwargs, what makes it different)
FAMILIES = {
    "llama": ("LlamaConfig", _DECODER, "RoPE, grouped-query attention"),
    "qwen2": ("Qwen2Config", _DECODER, "RoPE, q/k/v bias"),
    "qwen3": ("Qwen3Config", {**_DECODER, "head_dim": 8}, "RoPE, q/k RMSNorm"),
    "mistral": ("MistralConfig", {**_DECODER, "sliding_window": 8}, "RoPE, sliding window of 8"),
    "gemma": ("GemmaConfig", {**_DECODER, "head_dim": 8}, "RoPE, scaled embeddings"),
    "gemma2": ("Gemma2Config", {**_DECODER, "head_dim": 8, "sliding_window": 8},
               "logit softcapping, sliding window on every other layer"),
    "gpt2": ("GPT2Config", dict(n_positions=256, n_embd=32, n_layer=2, n_head=4),
             "absolute (learned) position embeddings"),
    "phi": ("PhiConfig", _DECODER, "partial RoPE, parallel attention/MLP"),
}


@dataclass(frozen=True)
class Cell:
    """One measurement. ``status``: "isolated", "leaks" or "not run" (``note`` says why).

    ``change``: max |logit change| of a later example's token when the first example changes;
    ``audit_isolated``: packsim.audit's verdict on the same forward (None when not run);
    ``audit_failed``: every probe the audit failed (positions and loss too, for the record).
    """

    family: str
    impl: str
    condition: str
    status: str
    change: float | None = None
    audit_isolated: bool | None = None
    audit_failed: tuple[str, ...] = ()
    note: str = ""

    @property
    def measured(self) -> bool:
        return self.status in ("isolated", "leaks")

    @property
    def agrees(self) -> bool | None:
        """Whether the audit's verdict matches the perturbation (None when not measured)."""
        if not self.measured or self.audit_isolated is None:
            return None
        return self.audit_isolated == (self.status == "isolated")


# ----------------------------------------------------------------------------- models and batches


def build_family(family: str, impl: str = "eager", seed: int = 0):
    """A tiny randomly initialised ``*ForCausalLM`` of ``family`` (fp32, eval mode)."""
    import transformers

    if family not in FAMILIES:
        raise PacksimError(f"unknown family {family!r}: use one of {sorted(FAMILIES)}.")
    cls_name, kwargs, _ = FAMILIES[family]
    config_cls = getattr(transformers, cls_name, None)
    if config_cls is None:
        raise PacksimError(f"transformers {transformers.__version__} has no {cls_name}: "
                           f"drop {family!r} from families=.")
    torch.manual_seed(seed)
    config = config_cls(**kwargs, **_IDS)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=impl).eval()


def _reset_positions(lengths) -> torch.Tensor:
    return torch.cat([torch.arange(n) for n in lengths])  # (T,)


def _example_index(lengths) -> torch.Tensor:
    return torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])  # (T,)


def condition_batch(condition: str, seed: int = 0) -> tuple[dict, dict, torch.Tensor]:
    """(batch dict, forward kwargs, example index (B, T)) for one condition."""
    if condition not in CONDITIONS:
        raise PacksimError(f"unknown condition {condition!r}: use one of {list(CONDITIONS)}.")
    rows = ROWS if condition == "rows" else ROWS[:1]
    B, T = len(rows), sum(rows[0])
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (B, T), generator=gen)
    seq = torch.stack([_example_index(r) for r in rows])  # (B, T)
    batch = {"input_ids": ids, "position_ids": torch.stack([_reset_positions(r) for r in rows])}
    kwargs = {"use_cache": condition == "cache"}
    if condition == "ones_mask":
        batch["attention_mask"] = torch.ones(B, T, dtype=torch.long)
    elif condition == "cu_seq_lens":
        cu = torch.tensor([0, *torch.tensor(rows[0]).cumsum(0).tolist()], dtype=torch.int32)
        batch["position_ids"] = torch.arange(T)[None]
        batch.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(rows[0]),
                     max_length_k=max(rows[0]))
    elif condition in ("bool_4d", "float_4d"):
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        allowed = (seq[:, :, None] == seq[:, None, :]) & causal  # (B, T, T)
        mask = allowed[:, None]  # (B, 1, T, T)
        if condition == "float_4d":
            mask = torch.zeros(B, 1, T, T).masked_fill(~mask, torch.finfo(torch.float32).min)
        batch["attention_mask"] = mask
    return batch, kwargs, seq


# ----------------------------------------------------------------------------- one cell


def _impl_reason(impl: str) -> str:
    """Why ``impl`` cannot run on this machine at all ('' when it can)."""
    if impl not in ("flash_attention_2", HUB_KERNEL):
        return ""
    if not torch.cuda.is_available():
        return "needs a GPU (no CUDA device here)"
    if impl == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        return "flash-attn not installed"
    if impl == HUB_KERNEL and importlib.util.find_spec("kernels") is None:
        return "the kernels package is not installed"
    return ""


def _cell_reason(impl: str, condition: str, compile_flex: bool) -> str:
    """Why this one cell is not run ('' when it can run)."""
    if impl == "flex_attention" and compile_flex and not torch.cuda.is_available() and condition.endswith("_4d"):
        return (f"compiled flex_attention on CPU with a 4D tensor mask crashed the process when "
                f"measured on torch 2.13.0+cpu (installed: {torch.__version__}); run with "
                "compile_flex=False")
    return ""


@contextmanager
def _flex_mode(compile_flex: bool):
    """Run transformers' flex path without torch.compile (same masking code) unless compile_flex."""
    if compile_flex:
        yield
        return
    from unittest import mock

    import transformers.integrations.flex_attention as hf_flex
    import transformers.masking_utils as hf_masking
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def eager_flex(query, key, value, training=False, **kwargs):
        return flex_attention(query, key, value, **kwargs)

    def eager_block_mask(*args, **kwargs):
        return create_block_mask(*args, **{**kwargs, "_compile": False})

    with ExitStack() as stack, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        stack.enter_context(mock.patch.object(hf_flex, "compile_friendly_flex_attention", eager_flex))
        stack.enter_context(mock.patch.object(hf_masking, "create_block_mask", eager_block_mask))
        yield


def perturbation_change(model, batch: dict, kwargs: dict, seq: torch.Tensor,
                        seed: int = 0) -> tuple[float, float]:
    """(max |change| of later examples' logits, of the first example's own) when the first example
    of every row gets new tokens. Independent of the audit: one forward pair, a fresh draw."""
    first = seq == seq[:, :1]  # (B, T): the first example of each row
    gen = torch.Generator().manual_seed(seed + 1)
    ids = batch["input_ids"]
    new = ids.clone()
    new[first] = (ids[first] + torch.randint(1, VOCAB, (int(first.sum()),), generator=gen)) % VOCAB
    rest = {k: v for k, v in batch.items() if k != "input_ids"}
    with torch.no_grad():
        base = model(input_ids=ids, **rest, **kwargs).logits.float()
        moved = model(input_ids=new, **rest, **kwargs).logits.float()
    diff = (moved - base).abs().amax(-1).cpu()  # (B, T)
    return float(diff[~first].max()), float(diff[first].max())


def measure_cell(model, family: str, impl: str, condition: str, *, tol: float = 1e-5,
                 seed: int = 0, compile_flex: bool = False) -> Cell:
    """Measure one cell on ``model`` (already switched to ``impl``), then audit the same forward."""
    from packsim.auditing.auditor import audit

    reason = _impl_reason(impl) or _cell_reason(impl, condition, compile_flex)
    if reason:
        return Cell(family, impl, condition, "not run", note=reason)
    batch, kwargs, seq = condition_batch(condition, seed)
    device = model_device(model)
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    try:
        with _flex_mode(compile_flex or impl != "flex_attention"):
            change, own = perturbation_change(model, batch, kwargs, seq, seed)
            if own <= tol:
                return Cell(family, impl, condition, "not run",
                            note="changing the first example did not change its own logits")
            report = audit(model, batch, seed=seed, tol=tol, **kwargs)
    except Exception as err:  # noqa: BLE001 - a cell that cannot run says why, the table goes on
        first_line = (str(err).splitlines() or [""])[0][:160]
        return Cell(family, impl, condition, "not run", note=f"{type(err).__name__}: {first_line}")
    leaked = set(report.failed) & set(LEAK_PROBES)
    return Cell(family, impl, condition, "isolated" if change <= tol else "leaks", change,
                audit_isolated=not leaked, audit_failed=tuple(report.failed))


# ----------------------------------------------------------------------------- the table


def _pick(given, allowed, what: str) -> tuple[str, ...]:
    if given is None:
        return tuple(allowed)
    given = (given,) if isinstance(given, str) else tuple(given)
    unknown = [g for g in given if g not in allowed]
    if unknown:
        raise PacksimError(f"unknown {what} {unknown}: use some of {list(allowed)}.")
    return given


def versions(compile_flex: bool) -> dict[str, str]:
    import transformers

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return {"transformers": transformers.__version__, "torch": torch.__version__,
            "python": platform.python_version(), "device": device,
            "flex_attention": "compiled" if compile_flex else "uncompiled (eager flex kernel)"}


def trap_table(families=None, impls=None, conditions=None, *, tol: float = 1e-5, seed: int = 0,
               compile_flex: bool | None = None) -> TrapTable:
    """Measure the trap table (see the module doc). Subsets: ``families=("llama", "gpt2")``,
    ``impls=("eager", "sdpa")``, ``conditions=("positions", "cache")``.

    ``compile_flex`` defaults to True on CUDA and False on CPU. Returns a :class:`TrapTable`.
    """
    families = _pick(families, FAMILIES, "families")
    impls = _pick(impls, IMPLS, "attention implementations")
    conditions = _pick(conditions, CONDITIONS, "conditions")
    compile_flex = torch.cuda.is_available() if compile_flex is None else bool(compile_flex)
    start = time.perf_counter()
    cells = []
    for family in families:
        model = build_family(family, "eager", seed)
        if torch.cuda.is_available():
            model = model.cuda()
        for impl in impls:
            cells += _impl_cells(model, family, impl, conditions, tol, seed, compile_flex)
    return TrapTable(cells, families, impls, conditions, versions(compile_flex),
                     time.perf_counter() - start)


def _impl_cells(model, family, impl, conditions, tol, seed, compile_flex) -> list[Cell]:
    if impl in ("flash_attention_2", HUB_KERNEL) and not _impl_reason(impl):
        import copy  # flash kernels take fp16/bf16 only: a bf16 copy, a bf16 tolerance

        model, tol = copy.deepcopy(model).to(torch.bfloat16), max(tol, FLASH_TOL)
    if not _impl_reason(impl):
        try:
            model.set_attn_implementation(impl)
        except Exception as err:  # noqa: BLE001 - e.g. GPT-2 has no flex, Gemma2 no sdpa
            note = f"not supported: {(str(err).splitlines() or [''])[0].split('. ')[0][:160]}"
            return [Cell(family, impl, c, "not run", note=note) for c in conditions]
    return [measure_cell(model, family, impl, c, tol=tol, seed=seed, compile_flex=compile_flex)
            for c in conditions]


_SHORT = {"isolated": "isolated", "leaks": "LEAKS", "not run": "n/a"}
_COLOR = {"isolated": "#1a7f37", "leaks": "#cf222e", "not run": "#6e7781"}


@dataclass
class TrapTable:
    """The measured cells, rows (family, impl) x columns (condition), and what it ran on.

    ``text()`` / ``str()`` for a terminal, ``to_html()`` / ``_repr_html_`` for a notebook,
    ``figure()`` for a plotly heatmap. ``disagreements()`` lists cells where the audit's verdict
    differs from the independent perturbation (empty when the audit is right everywhere).
    """

    cells: list[Cell]
    families: tuple[str, ...]
    impls: tuple[str, ...]
    conditions: tuple[str, ...]
    versions: dict[str, str]
    seconds: float

    def cell(self, family: str, impl: str, condition: str) -> Cell:
        for c in self.cells:
            if (c.family, c.impl, c.condition) == (family, impl, condition):
                return c
        raise PacksimError(f"no cell ({family!r}, {impl!r}, {condition!r}) in this table: it was "
                           "built with other families=/impls=/conditions=.")

    def disagreements(self) -> list[Cell]:
        return [c for c in self.cells if c.agrees is False]

    def _notes(self) -> list[str]:
        notes: list[str] = []
        for c in self.cells:
            if c.status == "not run" and c.note not in notes:
                notes.append(c.note)
        return notes

    def _label(self, c: Cell, notes: list[str]) -> str:
        label = _SHORT[c.status]
        if c.status == "not run":
            label += f"[{notes.index(c.note) + 1}]"
        return label + ("!" if c.agrees is False else "")

    def header(self) -> str:
        v = self.versions
        measured = [c for c in self.cells if c.measured]
        agree = sum(bool(c.agrees) for c in measured)
        return (f"Is a packed row isolated? Measured on transformers {v['transformers']}, torch "
                f"{v['torch']}, {v['device']}, flex_attention {v['flex_attention']}; "
                f"{len(measured)} cells measured in {self.seconds:.1f} s; packsim.audit agrees with "
                f"the perturbation in {agree}/{len(measured)}.")

    def text(self) -> str:
        notes = self._notes()
        head = ("family", "impl", *self.conditions)
        rows = [head] + [(f, i, *(self._label(self.cell(f, i, c), notes) for c in self.conditions))
                         for f in self.families for i in self.impls]
        widths = [max(len(r[k]) for r in rows) for k in range(len(head))]
        lines = [self.header()]
        lines += ["  ".join(x.ljust(w) for x, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        lines += [f"{name}: {CONDITIONS[name]}" for name in self.conditions]
        lines += [f"[{k}] not run: {note}" for k, note in enumerate(notes, 1)]
        if self.disagreements():
            lines.append("! the audit's verdict differs from the perturbation in this cell")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def to_html(self) -> str:
        notes = self._notes()
        head = "".join(f"<th title='{html.escape(CONDITIONS[c])}'>{c}</th>" for c in self.conditions)
        body = []
        for f in self.families:
            for i in self.impls:
                tds = []
                for cond in self.conditions:
                    c = self.cell(f, i, cond)
                    tip = c.note if c.status == "not run" else (
                        f"max |change| {c.change:.2e}; audit failed: {', '.join(c.audit_failed) or 'none'}")
                    tds.append(f"<td style='color:{_COLOR[c.status]};font-weight:bold' "
                               f"title='{html.escape(tip)}'>{html.escape(self._label(c, notes))}</td>")
                body.append(f"<tr><td>{f}</td><td><code>{html.escape(i)}</code></td>{''.join(tds)}</tr>")
        legend = "".join(f"<li><code>{c}</code>: {html.escape(CONDITIONS[c])}</li>" for c in self.conditions)
        legend += "".join(f"<li>[{k}] not run: {html.escape(n)}</li>" for k, n in enumerate(notes, 1))
        return (f"<div class='packsim-traps'><p><b>{html.escape(self.header())}</b></p><table>"
                f"<tr><th>family</th><th>impl</th>{head}</tr>{''.join(body)}</table>"
                f"<ul>{legend}</ul></div>")

    def _repr_html_(self) -> str:
        return self.to_html()

    def figure(self):
        """A plotly heatmap: green isolated, red leaks, grey not run; hover shows the evidence."""
        import plotly.graph_objects as go

        notes = self._notes()
        code = {"isolated": 1.0, "leaks": 0.0, "not run": 0.5}
        ys = [f"{f} / {i}" for f in self.families for i in self.impls]
        cells = [[self.cell(f, i, c) for c in self.conditions] for f in self.families for i in self.impls]
        z = [[code[c.status] for c in row] for row in cells]
        text = [[self._label(c, notes) for c in row] for row in cells]
        hover = [[c.note or f"change {c.change:.2e}, audit isolated: {c.audit_isolated}" for c in row]
                 for row in cells]
        scale = [[0, _COLOR["leaks"]], [0.5, _COLOR["not run"]], [1, _COLOR["isolated"]]]
        fig = go.Figure(go.Heatmap(z=z, x=list(self.conditions), y=ys, text=text,
                                   texttemplate="%{text}", customdata=hover, zmin=0, zmax=1,
                                   hovertemplate="%{y}, %{x}: %{customdata}<extra></extra>",
                                   colorscale=scale, showscale=False))
        fig.update_layout(title=self.header(), yaxis_autorange="reversed",
                          height=120 + 28 * len(ys), margin=dict(l=10, r=10, t=80, b=10))
        return fig


__all__ = ["CONDITIONS", "FAMILIES", "IMPLS", "Cell", "TrapTable", "build_family",
           "condition_batch", "measure_cell", "perturbation_change", "trap_table"]
