"""The live trap table: is a packed row isolated, per model family x attention implementation x condition?

Every cell is MEASURED on the installed transformers, never written down: a tiny model of the family
(2 layers, hidden 32, vocab 96, random weights, built from its config: no download) runs a packed
row of 32 tokens (three examples, position_ids restarting at each), then runs it again with the
tokens of the first example of each row changed (:func:`perturbation_change`; :func:`alone_change`
compares each example's packed logits with the example run alone instead, as lesson 04 does). The cell is "isolated" when no token of a later
example moves by more than ``tol`` (fp32: 1e-5), else "leaks". Then :func:`packsim.audit` runs on
the same model, batch and kwargs, and the cell records whether its verdict agrees.
The perturbation here is written apart from the audit's perturbation probe on purpose: the table
is the audit's ground truth, so one bug cannot hide in both (do not make one call the other).

What a cell runs, the models and the conditions (columns) as batch dicts with their shapes, e.g.
input_ids (1, 32) and position_ids (1, 32), is :mod:`packsim.exhibits.trap_cases`; the result, a
:class:`~packsim.exhibits.trap_results.TrapTable` of :class:`~packsim.exhibits.trap_results.Cell`,
prints as text, HTML or a heatmap (:mod:`packsim.exhibits.trap_results`).

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

Lessons: 04.
"""

from __future__ import annotations

import copy
import importlib.util
import platform
import time
import warnings
from contextlib import ExitStack, contextmanager

import torch

from packsim.core.device import model_device
from packsim.core.errors import PacksimError
from packsim.exhibits.trap_cases import (
    CONDITIONS,
    FAMILIES,
    HUB_KERNEL,
    IMPLS,
    VOCAB,
    build_family,
    condition_batch,
)
from packsim.exhibits.trap_results import Cell, TrapTable

__all__ = ["FLASH_IMPLS", "alone_change", "for_impl", "impl_reason", "impl_tol", "measure_cell",
           "perturbation_change", "trap_table"]

LEAK_PROBES = ("perturbation", "gradient", "attention_mass")
FLASH_TOL = 1e-2  # flash cells run in bf16 (set before any GPU run; not measured on a GPU yet)
FLASH_IMPLS = ("flash_attention_2", HUB_KERNEL)


def impl_tol(impl: str, tol: float) -> float:
    """The tolerance ``impl`` is judged by: flash kernels run in bf16, so at least ``FLASH_TOL``."""
    return max(tol, FLASH_TOL) if impl in FLASH_IMPLS else tol


def for_impl(model, impl: str):
    """``model`` switched to ``impl``; for the flash kernels (fp16/bf16 only) a bf16 copy of it.

    ``set_attn_implementation`` raises for a family without ``impl`` (e.g. GPT-2 has no flex).
    """
    if impl in FLASH_IMPLS:
        model = copy.deepcopy(model).to(torch.bfloat16)
    model.set_attn_implementation(impl)
    return model


# ----------------------------------------------------------------------------- one cell


def impl_reason(impl: str) -> str:
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


def alone_change(model, batch: dict, kwargs: dict, seq: torch.Tensor, *, impl: str = "",
                 compile_flex: bool = False) -> list[float]:
    """Max |packed logits - logits of the example run alone| per example, row 0's examples first:
    the check of lesson 04. Alone: input_ids (1, L), position_ids 0..L-1 (the default), no mask,
    use_cache=False. ``seq`` (B, T) is the example index of :func:`condition_batch`; with
    ``impl="flex_attention"`` the forwards run uncompiled unless ``compile_flex``."""
    device = model_device(model)
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    diffs = []
    with _flex_mode(compile_flex or impl != "flex_attention"), torch.no_grad():
        packed = model(**batch, **kwargs).logits.float()  # (B, T, V)
        for b in range(seq.shape[0]):
            for e in dict.fromkeys(seq[b].tolist()):  # examples in row order
                where = (seq[b] == e).to(device)  # (T,)
                ids = batch["input_ids"][b, where][None]  # (1, L)
                alone = model(input_ids=ids, use_cache=False).logits.float()[0]  # (L, V)
                diffs.append(float((packed[b, where] - alone).abs().max()))
    return diffs


def measure_cell(model, family: str, impl: str, condition: str, *, tol: float = 1e-5,
                 seed: int = 0, compile_flex: bool = False) -> Cell:
    """Measure one cell on ``model`` (already switched to ``impl``), then audit the same forward."""
    from packsim.auditing.auditor import audit

    reason = impl_reason(impl) or _cell_reason(impl, condition, compile_flex)
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
    if not impl_reason(impl):
        tol = impl_tol(impl, tol)
        try:
            model = for_impl(model, impl)
        except Exception as err:  # noqa: BLE001 - e.g. GPT-2 has no flex, Gemma2 no sdpa
            note = f"not supported: {(str(err).splitlines() or [''])[0].split('. ')[0][:160]}"
            return [Cell(family, impl, c, "not run", note=note) for c in conditions]
    return [measure_cell(model, family, impl, c, tol=tol, seed=seed, compile_flex=compile_flex)
            for c in conditions]
