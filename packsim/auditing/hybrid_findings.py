"""The finding for hybrid state-space / linear-attention models: can this pipeline keep packed examples apart at all?

Attention layers isolate through the packed mask, but a convolution or recurrent state (Mamba2
mixers, short convolutions, gated DeltaNet) runs straight across a boundary unless ``seq_idx`` /
``cu_seqlens`` reach a kernel that reads them. In the installed transformers those kernels are
the CUDA packages ``causal_conv1d``, ``mamba_ssm`` and ``flash-linear-attention`` (``fla``), or
packsim's reference kernels (pure torch, any CPU) once
:func:`packsim.reference.hybrid_emulation.emulate_hybrid_kernels` has put them where transformers looks
for those packages; the torch fallbacks ignore the boundary kwargs, and transformers' wrapper either
raises when ``seq_idx`` reaches one or drops it silently, and then the perturbation probe measures
the leak (which one the installed wrapper does is read from it, :func:`_refuses`; which versions do
which: :mod:`packsim.core.upstream.hub_kernels`; :mod:`packsim.exhibits.hybrid_traps` measures every
case).
:func:`hybrid_state` names the stateful layer types, asks
:func:`packsim.reference.hybrid_emulation.kernels_in_use` what runs behind the model's kernels (named in
its evidence) and fails a packed batch that cannot isolate there; it returns None for a model
without such layers, so any audit can call it on every pipeline. When the pipeline's own forward
is refused (``seq_idx`` on the torch fallback), nothing can be measured: :func:`refused_report`
turns the refusal into a NOT MEASURED report whose ``hybrid_state`` finding names the layer and
the kernel, and says how to measure it on CPU. Nothing here wires a kernel: the user's process
keeps its transformers as it is.

Lessons: none directly (packsim.audit adds the finding; appendices A3 and A6 show the table).
"""

from __future__ import annotations

import functools
import importlib.util
import re
import time
from collections.abc import Mapping
from contextvars import ContextVar

import torch

from packsim.auditing.pipeline import ForwardOutput
from packsim.auditing.probes import loss_coverage, positions_probe
from packsim.auditing.report import AuditReport, Finding, ProbeResult
from packsim.core.upstream.hub_kernels import REFUSAL

__all__ = ["CUDA_REFUSAL", "KERNEL_PACKAGES", "ON_CPU", "boundary_kernels", "hybrid_state", "kernel_refusal",
           "kernel_words", "scans_layers_once", "needs_cuda_reason", "refusal_line", "refused_report", "stateful_layers"]

# module class names whose forward carries a conv / recurrent state along the sequence
_STATEFUL = re.compile(r"(Mixer|MambaLayer|GatedDeltaNet|ShortConv|LinearAttention|Mamba\w*Block)$")
KERNEL_PACKAGES = ("causal_conv1d", "mamba_ssm", "fla")  # import names the boundary-aware kernels live in
# what transformers' hub_kernels wrapper raises when a packed-sequence kwarg reaches a torch fallback
# (integrations/hub_kernels.py, use_kernel_func_from_hub_with_fallback's ``wrapped``, where it refuses:
# packsim.core.upstream.hub_kernels says from which version)
CUDA_REFUSAL = REFUSAL
NEEDS_KERNEL = ("not measured: needs a kernel that reads seq_idx (causal_conv1d / mamba_ssm / fla on CUDA, or "
                "packsim's reference kernels on any CPU)")
# how to measure a refused or fallback pipeline on any CPU (packsim's reference kernels, pure torch)
ON_CPU = ("on CPU, audit inside `with packsim.reference.hybrid_emulation.emulate_hybrid_kernels():` (packsim's "
          "reference kernels, pure torch, where transformers looks for causal_conv1d / mamba_ssm / fla)")
_GPU = "causal_conv1d and mamba_ssm (Mamba2 / short conv) or flash-linear-attention (gated DeltaNet)"
MEASURE_IT = f"{ON_CPU}; or a GPU with {_GPU} installed"  # where a refused forward can be measured


_SCANNED: ContextVar[dict | None] = ContextVar("packsim_stateful_layers", default=None)  # id(model) -> names


def stateful_layers(model) -> list[str]:
    """Class names of the layers of ``model`` that carry state along the sequence (sorted, unique).

    Inside an audit (:func:`scans_layers_once`) the model's modules are walked once, however many
    findings ask."""
    if not isinstance(model, torch.nn.Module):
        return []
    scanned = _SCANNED.get()
    if scanned is not None and id(model) in scanned:
        return list(scanned[id(model)])
    names = sorted({type(m).__name__ for m in model.modules() if _STATEFUL.search(type(m).__name__)})
    if scanned is not None:
        scanned[id(model)] = names  # the model lives as long as the audit: its id is not reused meanwhile
    return list(names)


def scans_layers_once(entry):
    """``entry`` (an audit) run with :func:`stateful_layers` walking each model once; nested entries share it."""

    @functools.wraps(entry)
    def run(*args, **kwargs):
        if _SCANNED.get() is not None:  # an audit inside an audit (audit_trainer ends in audit_pipeline)
            return entry(*args, **kwargs)
        token = _SCANNED.set({})
        try:
            return entry(*args, **kwargs)
        finally:
            _SCANNED.reset(token)

    return run


def _examples_per_row(fields: Mapping) -> int:
    """Most examples any row holds, by the batch's own fields (cu_seq_lens_q > seq_idx > position_ids)."""
    if fields.get("cu_seq_lens_q") is not None:
        return max(len(torch.as_tensor(fields["cu_seq_lens_q"])) - 1, 1)
    if fields.get("seq_idx") is not None:
        s = torch.as_tensor(fields["seq_idx"])
        return max((len(torch.unique(r)) for r in s.reshape(-1, s.shape[-1])), default=1)
    pos = fields.get("position_ids")
    if pos is None:
        return 1
    pos = torch.as_tensor(pos)
    pos = pos.reshape(-1, pos.shape[-1])  # (B, T) or (rows * B, T) for mRoPE
    return int(((pos[:, 1:] <= pos[:, :-1]).sum(-1) + 1).max())


def refusal_line(err: BaseException) -> str:
    """The first line of ``err`` when it is transformers' torch fallback refusing a packed kwarg
    (``seq_idx`` / ``cu_seqlens``), else '': the one reading of that refusal."""
    text = str(err)
    return text.splitlines()[0][:200] if isinstance(err, ValueError) and CUDA_REFUSAL in text else ""


def needs_cuda_reason(err: BaseException) -> str:
    """The reason a cell or verdict gives when ``err`` is that refusal, else ''."""
    line = refusal_line(err)
    return (f"{line} (transformers' hub_kernels wrapper raises when seq_idx / cu_seqlens reach the "
            "torch fallback; the packages run on CUDA only; packsim's reference kernels measure it on CPU: "
            "emulate_hybrid_kernels())") if line else ""


def kernel_refusal(model, err: BaseException) -> str:
    """transformers' refusal message when ``err`` is that refusal on a model with stateful layers
    (the first line), else ''."""
    return refusal_line(err) if stateful_layers(model) else ""


def _refused_finding(names: str, refused: str) -> Finding:
    return Finding("hybrid_state", "skipped",
                   f"isolation of {names} {NEEDS_KERNEL}: the batch's boundary fields reach the torch "
                   f"fallback and transformers refuses them here ({refused}), so this pipeline's forward "
                   "cannot run on this machine, and whether it keeps the examples apart is not known",
                   f"measure it here: {MEASURE_IT}")


def refused_report(p, refused: str, tol: float, start: float, findings=None,
                   leak_probes=("perturbation", "gradient", "attention_mass")):
    """(NOT MEASURED report, a stand-in forward output) for a pipeline whose forward transformers refused.

    The leak probes are skipped with the refusal as the reason; loss coverage and positions still run
    (they need no packed forward); the ``hybrid_state`` finding names the layer types and the kernels.
    The stand-in output has logits of width 0 (B, T, 0) in the model's dtype: no forward ran.
    """
    names = ", ".join(stateful_layers(p.model))
    why = f"{NEEDS_KERNEL} for {names}: the forward refused the batch ({refused})"
    how = f"run the audit where the forward accepts this batch: {MEASURE_IT}"
    probes = {name: ProbeResult(name, "skipped", None, tol, why, {"refused": refused, "how_to_get": how})
              for name in leak_probes}
    probes["loss_coverage"] = loss_coverage(p)
    probes["positions"] = positions_probe(p, tol)
    S = len(p.example_ids)
    report = AuditReport(probes=probes, boundaries=p.boundaries, example_ids=p.example_ids, forward=p.forward,
                         logit_change=torch.full((S, S), float("nan")), gradient_ratio=None,
                         attention_outside=None, worst_pair=None, causes=[],
                         seconds=time.perf_counter() - start,
                         findings=[*(findings or []), _refused_finding(names, refused)])
    dtype = next(p.model.parameters()).dtype
    return report, ForwardOutput(torch.empty((*p.input_ids.shape, 0), dtype=dtype))


def _refuses(model) -> bool:
    """Whether the installed transformers' kernel wrappers raise when seq_idx reaches a torch fallback
    (else they drop it silently; which versions do which: :mod:`packsim.core.upstream.hub_kernels`):
    read from the wrappers the model's modules hold."""
    import sys

    from packsim.core.upstream.hub_kernels import refuses, wrapper_cells
    from packsim.reference.hybrid_emulation import kernel_sites

    modules = [sys.modules[n] for n in sorted({type(m).__module__ for m in model.modules()}) if n in sys.modules]
    return any(refuses(wrapper_cells(site.wrapper)) for site in kernel_sites(modules))


def boundary_kernels(model) -> dict[str, str]:
    """{kernel name: what runs it} for the kernels of ``model`` that read seq_idx / cu_seqlens
    (conv, SSM scan, delta rule: those packsim has a reference for), from
    :func:`packsim.reference.hybrid_emulation.kernels_in_use`; {} for a model whose layers call none."""
    from packsim.reference.hybrid_emulation import REFERENCES, kernels_in_use

    return {name: v for name, v in kernels_in_use(model).items() if name in REFERENCES}


def kernel_words(kernels: dict[str, str]) -> str:
    """'the reference kernel (packsim, pure torch) (causal_conv1d_fn, ...)', one group per label."""
    groups: dict[str, list[str]] = {}
    for name, label in sorted(kernels.items()):
        groups.setdefault(label, []).append(name)
    return " and ".join(f"{'the ' if label.startswith('reference') else ''}{label} ({', '.join(names)})"
                        for label, names in groups.items())


def hybrid_state(model, batch, refused: str = "") -> Finding | None:
    """Fail when ``model`` has stateful layers and the batch packs several examples per row that the
    kernels behind them cannot keep apart; None when the model has no such layer or the batch is not a dict.

    ``refused``: transformers' refusal of this batch's forward (:func:`kernel_refusal`): the finding
    is then "not measured: needs a kernel that reads seq_idx", naming the layer (skipped, never a pass). A pass
    says seq_idx (and, for gated DeltaNet, cu_seq_lens_q) reaches a kernel that reads it, naming the
    kernel (the real package or packsim's reference kernel); whether the forward passes it to every
    stateful layer is the perturbation probe's to measure.
    """
    layers = stateful_layers(model)
    if not layers or not isinstance(batch, Mapping):
        return None
    names = ", ".join(layers)
    if refused:
        return _refused_finding(names, refused)
    per_row = _examples_per_row(batch)
    if per_row < 2:
        return Finding("hybrid_state", "pass", f"{names} carry state along the row; every row holds one "
                       "example by the batch's fields, so no state crosses a boundary")
    given = [k for k in ("seq_idx", "cu_seq_lens_q", "cu_seqlens") if batch.get(k) is not None]
    kernels = boundary_kernels(model)
    fallback = {k: v for k, v in kernels.items() if v.startswith("transformers'")}
    where = f"{names} carry a conv / SSM (recurrent) state along the row; rows hold up to {per_row} examples"
    fix = ("pass seq_idx (DataCollatorWithFlattening(return_seq_idx=True); TRL's padding-free collator emits it) to "
           f"kernels that read it: {_GPU} on a GPU, or {ON_CPU.removeprefix('on CPU, ')} on CPU")
    if not given:
        return Finding("hybrid_state", "fail",
                       f"{where}, and the batch gives no seq_idx / cu_seq_lens: the state of one example "
                       "runs into the next whatever the attention mask says",
                       f"{fix}; or put one example per row (padding) instead of packing")
    if "seq_idx" not in given and kernels:
        return Finding("hybrid_state", "fail",
                       f"{where}; the batch gives {', '.join(given)} but no seq_idx: the conv kernels "
                       f"({kernel_words({k: v for k, v in kernels.items() if 'conv1d' in k})}) read seq_idx, not cu_seq_lens_* (transformers' wrapper passes "
                       "a kernel only its own parameters), so the conv state runs into the next example", fix)
    missing = [p for p in KERNEL_PACKAGES if importlib.util.find_spec(p) is None]
    if fallback or (not kernels and (missing or not torch.cuda.is_available())):
        lack = ", ".join(missing) if missing else "a CUDA device"
        on = f"behind {', '.join(sorted(fallback))} runs transformers' torch fallback" if fallback else \
            f"{lack} is missing here"
        raises = ("transformers raises for seq_idx, cu_seq_lens_* passes silently" if _refuses(model)
                  else "this transformers drops seq_idx and cu_seq_lens_* there silently")
        return Finding("hybrid_state", "fail",
                       f"{where}; the batch gives {', '.join(given)}, but {on}: the torch fallbacks ignore the "
                       f"boundaries ({raises})", f"{fix}; or one example per row")
    deltanet = [n for n in layers if n.endswith("GatedDeltaNet")]
    if deltanet and not ({"cu_seq_lens_q", "cu_seqlens"} & set(given)):
        return Finding("hybrid_state", "fail",
                       f"{where}; the batch gives seq_idx but no cu_seq_lens_q: {', '.join(deltanet)} hands "
                       "cu_seq_lens_q to its gated delta rule as cu_seqlens (seq_idx reaches only its conv), "
                       "so the recurrent state runs into the next example",
                       "pass cu_seq_lens_q / cu_seq_lens_k too (DataCollatorWithFlattening("
                       "return_flash_attn_kwargs=True, return_seq_idx=True); TRL's padding-free collator gives both)")
    if not kernels:
        return Finding("hybrid_state", "skipped",
                       f"{where}; the batch gives {', '.join(given)} and the kernels are installed: whether "
                       "this model's forward passes them to every stateful layer is what the perturbation "
                       "probe measures (not decided by this finding)")
    return Finding("hybrid_state", "pass",
                   f"{where}; the batch gives {', '.join(given)}, and seq_idx reaches {kernel_words(kernels)}, "
                   "which restarts the state where seq_idx changes: whether this model's forward passes it to "
                   "every stateful layer, and its attention mask keeps the examples apart, is what the "
                   "perturbation probe measures")
