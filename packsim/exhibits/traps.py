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

flash_attention_2 runs everywhere: transformers' own flash path (``_flash_attention_forward``:
unpadding by a 2D mask, ``cu_seq_lens_*``, ``_is_packed_sequence``) on the real flash-attn where
it and CUDA are there (bfloat16, tolerance ``FLASH_TOL``; not yet run on a GPU), else on the
reference kernel (packsim, pure torch), not flash-attn (:func:`packsim.reference.flash_emulation.emulate_flash`),
in the model's fp32 and judged by the fp32 ``tol``. Each measured flash cell names its kernel
(``Cell.kernel``, a lettered line under the table). GPT-2 runs it in bfloat16 (``FLASH_TOL``):
in fp32 transformers' ``get_target_dtype`` looks for an ``nn.Linear`` GPT-2 does not have
(tests/test_reference_flash_emulation.py). transformers' flash path takes no 4D mask (``_upad_input`` reads
it as (B, T) padding and fails before any kernel runs): those cells say so.
The hub kernel (``kernels-community/flash-attn2``) is NOT measured on the reference: it needs
CUDA, the kernels package and a download from the Hugging Face Hub, and packsim downloads nothing
at run time; after loading it runs the same transformers code as the flash_attention_2 column, so
running the reference under its name would repeat that column, not measure the hub kernel. Where
CUDA and the kernels package are present it runs as given (bfloat16, ``FLASH_TOL``).
flex_attention runs UNCOMPILED on CPU by default (transformers' flex masking code, torch's flex
kernel without torch.compile): compiling costs seconds per mask on CPU, and compiled CPU flex with
a 4D tensor mask has crashed the process (the torch build it crashed on, and the culprit, are in
tests/test_transformers_traps.py's ``test_compiled_flex_with_4d_tensor_mask``); with
``compile_flex=True`` on CPU those 4D-tensor cells are "not run" instead of crashing, on any torch.

Meant for lessons 04 and 07 and docs/audit.md, to print instead of prose claims, so the course stays
true when transformers changes. The full table (8 families x 5 implementations x 8 conditions) takes
minutes on a small CPU: pass ``families=`` / ``impls=`` / ``conditions=`` for a subset.

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
from packsim.reference.flash_emulation import emulate_flash, real_flash_attn

__all__ = ["FLASH_IMPLS", "NO_4D_MASK", "alone_change", "for_impl", "impl_kernel", "impl_reason", "impl_tol",
           "measure_cell", "perturbation_change", "raised_in", "trap_table"]

LEAK_PROBES = ("perturbation", "gradient", "attention_mass")
FLASH_TOL = 1e-2  # bf16 flash cells (real kernels, GPT-2 on the reference); set before any GPU run
FLASH_IMPLS = ("flash_attention_2", HUB_KERNEL)
NO_4D_MASK = ("transformers' flash path takes no 4D mask: _flash_attention_forward -> _upad_input "
              "reads attention_mask as (B, T) padding and fails before any kernel runs")
_HALF = (torch.bfloat16, torch.float16)


def _dtype(model) -> torch.dtype:
    return next(model.parameters()).dtype


def impl_tol(impl: str, tol: float, model=None) -> float:
    """The tolerance ``impl`` is judged by: ``tol``, or at least ``FLASH_TOL`` for a bf16/fp16 flash run.

    With ``model`` (already switched by :func:`for_impl`): by its dtype. Without: flash_attention_2
    runs in bf16 where the real flash-attn runs, in fp32 on the reference kernel; the hub kernel in bf16.
    """
    if impl not in FLASH_IMPLS:
        return tol
    if model is not None:
        half = _dtype(model) in _HALF
    else:
        half = impl == HUB_KERNEL or real_flash_attn() is not None
    return max(tol, FLASH_TOL) if half else tol


def _has_linear(model) -> bool:
    """Whether every attention layer holds an ``nn.Linear``: transformers' ``get_target_dtype``
    reads fp32 queries' target dtype from one (GPT-2's attention has Conv1D only)."""
    layers = [m for m in model.modules() if type(m).__name__.endswith("Attention")]
    return all(any(isinstance(sub, torch.nn.Linear) for sub in m.modules()) for m in layers)


def for_impl(model, impl: str):
    """``model`` switched to ``impl``; for the flash implementations a copy.

    flash_attention_2: a bf16 copy on the real flash-attn (fp16/bf16 only); on the reference kernel
    (no flash-attn or no CUDA) a copy in the model's dtype under :func:`emulate_flash`'s name, bf16
    for a model without ``nn.Linear`` (GPT-2: transformers' flash path stops on it in fp32). The hub
    kernel: a bf16 copy. ``set_attn_implementation`` raises for a family without ``impl`` (e.g.
    GPT-2 has no flex).
    """
    if impl == "flash_attention_2":
        flash = emulate_flash()
        model = copy.deepcopy(model)
        if not flash.reference or not _has_linear(model):
            model = model.to(torch.bfloat16)
        model.set_attn_implementation(flash.name)
        return model
    if impl == HUB_KERNEL:
        model = copy.deepcopy(model).to(torch.bfloat16)
    model.set_attn_implementation(impl)
    return model


def impl_kernel(impl: str, model=None, tol: float | None = None) -> str:
    """The kernel a measured ``impl`` cell ran on, in words ('' for eager / sdpa / flex: torch's own).

    With ``model`` (the one :func:`for_impl` returned) and ``tol`` (the one it was judged by) the
    words add the dtype and the tolerance, e.g. "reference kernel (packsim, pure torch), not
    flash-attn (transformers' own flash path, packsim.emulate_flash); float32, tolerance 1e-05".
    """
    if impl not in FLASH_IMPLS:
        return ""
    reference = False
    if impl == HUB_KERNEL:
        kernel = f"the Hub kernel {HUB_KERNEL}"
    else:
        flash = emulate_flash()
        reference = flash.reference
        kernel = flash.kernel + (" (transformers' own flash path, packsim.emulate_flash)" if reference else "")
    if model is None:
        return kernel
    kernel += f"; {str(_dtype(model)).removeprefix('torch.')}"
    if tol is not None:
        kernel += f", tolerance {tol:.0e}"
    if reference and not _has_linear(model):
        kernel += ("; bf16 because transformers' flash path stops on this model in fp32 "
                   "(get_target_dtype looks for an nn.Linear)")
    return kernel


# ----------------------------------------------------------------------------- one cell


def impl_reason(impl: str) -> str:
    """Why ``impl`` cannot run on this machine at all ('' when it can).

    flash_attention_2 always runs (the reference kernel where flash-attn cannot); the hub kernel
    needs CUDA and the kernels package.
    """
    if impl != HUB_KERNEL:
        return ""
    fetch = ("and a download from the Hugging Face Hub at load time; packsim downloads nothing at run "
             "time, and the reference kernel does not stand in for it (the flash_attention_2 column "
             "runs the same transformers flash path on the reference)")
    if not torch.cuda.is_available():
        return f"the Hub kernel {HUB_KERNEL} needs CUDA (it is a CUDA build), the kernels package {fetch}"
    if importlib.util.find_spec("kernels") is None:
        return f"the kernels package is not installed: the Hub kernel {HUB_KERNEL} needs it {fetch}"
    return ""


def _cell_reason(impl: str, condition: str, compile_flex: bool, cuda: bool = False) -> str:
    """Why this one cell is not run ('' when it can run)."""
    if impl == "flex_attention" and compile_flex and not torch.cuda.is_available() and condition.endswith("_4d"):
        return ("compiled flex_attention on CPU with a 4D tensor mask has crashed the process, so it is "
                f"never run here (installed torch: {torch.__version__}); run with compile_flex=False")
    if impl in FLASH_IMPLS and cuda and condition.endswith("_4d"):  # the out-of-range index of
        return (f"{NO_4D_MASK} (an IndexError on CPU); not run on CUDA, where that index is a "  # _upad_input
                "device-side assert that would stop every later cell")
    return ""


def raised_in(err: BaseException, function: str) -> bool:
    """Whether ``err`` was raised inside a function of this name (its traceback passes through it)."""
    tb = err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == function:
            return True
        tb = tb.tb_next
    return False


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
    of every row gets new tokens. Independent of the audit: one forward pair, a fresh draw.
    ``seq`` (B, T): example index, -1 on padding (whose logits are not compared)."""
    first = seq == seq[:, :1]  # (B, T): the first example of each row
    later = ~first & (seq >= 0)  # (B, T): the tokens that must not move
    gen = torch.Generator().manual_seed(seed + 1)
    ids = batch["input_ids"]
    new = ids.clone()
    new[first] = (ids[first] + torch.randint(1, VOCAB, (int(first.sum()),), generator=gen)) % VOCAB
    rest = {k: v for k, v in batch.items() if k != "input_ids"}
    with torch.no_grad():
        base = model(input_ids=ids, **rest, **kwargs).logits.float()
        moved = model(input_ids=new, **rest, **kwargs).logits.float()
    diff = (moved - base).abs().amax(-1).cpu()  # (B, T)
    return float(diff[later].max()), float(diff[first].max())


def alone_change(model, batch: dict, kwargs: dict, seq: torch.Tensor, *, impl: str = "",
                 compile_flex: bool = False) -> list[float]:
    """Max |packed logits - logits of the example run alone| per example, row 0's examples first:
    the check of lesson 04. Alone: input_ids (1, L), position_ids 0..L-1 (the default), no mask,
    use_cache=False. ``seq`` (B, T) is the example index of :func:`condition_batch` (-1 on padding,
    skipped); with ``impl="flex_attention"`` the forwards run uncompiled unless ``compile_flex``."""
    device = model_device(model)
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    diffs = []
    with _flex_mode(compile_flex or impl != "flex_attention"), torch.no_grad():
        packed = model(**batch, **kwargs).logits.float()  # (B, T, V)
        for b in range(seq.shape[0]):
            for e in dict.fromkeys(e for e in seq[b].tolist() if e >= 0):  # examples in row order
                where = (seq[b] == e).to(device)  # (T,)
                ids = batch["input_ids"][b, where][None]  # (1, L)
                alone = model(input_ids=ids, use_cache=False).logits.float()[0]  # (L, V)
                diffs.append(float((packed[b, where] - alone).abs().max()))
    return diffs


def measure_cell(model, family: str, impl: str, condition: str, *, tol: float = 1e-5,
                 seed: int = 0, compile_flex: bool = False) -> Cell:
    """Measure one cell on ``model`` (already switched to ``impl`` by :func:`for_impl`), then audit
    the same forward. ``tol`` is the one ``impl`` is judged by (:func:`impl_tol`)."""
    from packsim.auditing.auditor import audit

    device = model_device(model)
    reason = impl_reason(impl) or _cell_reason(impl, condition, compile_flex, device.type == "cuda")
    if reason:
        return Cell(family, impl, condition, "not run", note=reason)
    batch, kwargs, seq = condition_batch(condition, seed)
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    try:
        with _flex_mode(compile_flex or impl != "flex_attention"):
            change, own = perturbation_change(model, batch, kwargs, seq, seed)
            if own <= tol:
                return Cell(family, impl, condition, "not run",
                            note="changing the first example did not change its own logits")
            report = audit(model, batch, seed=seed, tol=tol, **kwargs)
    except Exception as err:  # noqa: BLE001 - a cell that cannot run says why, the table goes on
        mask = batch.get("attention_mask")
        if impl in FLASH_IMPLS and mask is not None and mask.dim() == 4 and raised_in(err, "_upad_input"):
            return Cell(family, impl, condition, "not run", note=f"{NO_4D_MASK} ({type(err).__name__})")
        first_line = (str(err).splitlines() or [""])[0][:160]
        return Cell(family, impl, condition, "not run", note=f"{type(err).__name__}: {first_line}")
    leaked = set(report.failed) & set(LEAK_PROBES)
    return Cell(family, impl, condition, "isolated" if change <= tol else "leaks", change,
                audit_isolated=not leaked, audit_failed=tuple(report.failed),
                kernel=impl_kernel(impl, model, tol))


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
        try:
            model = for_impl(model, impl)
        except Exception as err:  # noqa: BLE001 - e.g. GPT-2 has no flex, Gemma2 no sdpa
            note = f"not supported: {(str(err).splitlines() or [''])[0].split('. ')[0][:160]}"
            return [Cell(family, impl, c, "not run", note=note) for c in conditions]
        tol = impl_tol(impl, tol, model)
    return [measure_cell(model, family, impl, c, tol=tol, seed=seed, compile_flex=compile_flex)
            for c in conditions]
