"""Reference kernels for the hybrid families, put where transformers looks for ``causal_conv1d``,
``mamba_ssm`` and ``flash-linear-attention``: packed hybrid models measured on any CPU.

Every hybrid model in transformers (Bamba, Qwen3-Next, LFM2, Mamba2, Zamba2, GraniteMoeHybrid,
FalconH1, ...) calls its conv / scan / delta-rule kernels through module-level functions made by
``integrations.hub_kernels.use_kernel_func_from_hub_with_fallback``. At import, that decorator
looks for the package (``causal_conv1d``, ``mamba_ssm``, ``fla``) and, when it is missing, binds
the model's own torch function instead; the wrapper it returns closes over that choice
(``implementation``, ``is_new_implementation``, ``applicable_params``) and RAISES when ``seq_idx``
or ``cu_seqlens`` reaches the torch function, which cannot keep packed sequences apart (where the
transformers version refuses; older ones drop them silently). How that
wrapper is found and read on each transformers version (bare, or inside a ``kernels`` function
module, per version) is :mod:`packsim.core.upstream.hub_kernels`'s, the one place that reaches in.

:func:`emulate_hybrid_kernels` finds those wrappers in the loaded modeling modules and, for each
kernel packsim has a reference for whose package is neither bound nor installed, puts the
reference kernel (packsim, pure torch) in the place the real package would take: the wrapper
stays transformers' own (its keyword filtering by the kernel's signature, its export rule), and
so does everything around it (which fields the model forwards, when it calls the fused path).
A real package, bound by transformers or installed, always wins. Idempotent; ``undo()`` (or
leaving the ``with`` block) puts transformers back.

    causal_conv1d_fn, causal_conv1d_update         -> packsim.reference.conv
    mamba_chunk_scan_combined, mamba_split_conv1d_scan_combined -> packsim.reference.ssm
    chunk_gated_delta_rule, fused_recurrent_gated_delta_rule    -> packsim.reference.delta

Left to transformers: ``selective_state_update`` (the one-token decode step; its fallback is
exact and never sees a packed row), the Mamba1 and KDA kernels (no reference here).

Lessons: none directly (the hybrid frontier table and A3 run models under it).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass, field

from packsim.core.errors import PacksimError
from packsim.core.upstream.hub_kernels import CELLS, kernel_names, restore, swap, wrapper_cells
from packsim.reference.conv import REFERENCE_KERNEL, causal_conv1d_fn, causal_conv1d_update
from packsim.reference.delta import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
from packsim.reference.ssm import mamba_chunk_scan_combined, mamba_split_conv1d_scan_combined

__all__ = ["HYBRID_MODULES", "REFERENCES", "REFERENCE_KERNEL", "HybridKernels", "emulate_hybrid_kernels",
           "kernel_sites", "kernels_in_use"]

# transformers' kernel name -> (the package transformers looks in, packsim's reference kernel)
REFERENCES = {
    "causal_conv1d_fn": ("causal_conv1d", causal_conv1d_fn),
    "causal_conv1d_update": ("causal_conv1d", causal_conv1d_update),
    "mamba_chunk_scan_combined": ("mamba_ssm", mamba_chunk_scan_combined),
    "mamba_split_conv1d_scan_combined": ("mamba_ssm", mamba_split_conv1d_scan_combined),
    "chunk_gated_delta_rule": ("fla", chunk_gated_delta_rule),
    "fused_recurrent_gated_delta_rule": ("fla", fused_recurrent_gated_delta_rule),
}
# the hybrid families' modeling modules, imported before the search (others count once loaded)
HYBRID_MODULES = ("bamba", "qwen3_next", "lfm2", "mamba2", "zamba2", "granitemoehybrid", "falcon_h1")
_MOVED = ("transformers {v} moved: no modeling module of {mods} holds a wrapper of "
          "integrations.hub_kernels.use_kernel_func_from_hub_with_fallback that closes over "
          f"{', '.join(CELLS)}; packsim's reference kernels cannot be wired. Pin transformers to a version "
          "packsim's tests pass on (tests/test_upstream_hub_kernels.py), or update packsim.core.upstream.hub_kernels.")


@dataclass(frozen=True)
class _Site:
    where: str  # "transformers.models.bamba.modeling_bamba.causal_conv1d_fn"
    func_name: str  # the kernel's name transformers looks up ("causal_conv1d_fn")
    package: str  # the import name it looks in ("causal_conv1d")
    wrapper: object = field(repr=False, compare=False)


def _modules(modules=None) -> list:
    if modules is not None:
        return list(modules)
    for family in HYBRID_MODULES:
        try:
            importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        except ImportError:  # a transformers without this family: nothing to wire there
            pass
    return [m for name, m in sorted(sys.modules.items())
            if m is not None and name.startswith("transformers.models.") and ".modeling_" in name]


def kernel_sites(modules=None) -> list[_Site]:
    """Every module-level kernel wrapper of ``modules`` (default: the loaded transformers modeling
    modules, the hybrid families imported first), one per (module, name)."""
    sites = []
    for module in _modules(modules):
        for name, value in list(vars(module).items()):
            cells = wrapper_cells(value)
            names = kernel_names(cells) if cells is not None else None
            if names is not None:
                sites.append(_Site(f"{module.__name__}.{name}", *names, value))
    return sites


def _installed(package: str) -> bool:
    if sys.modules.get(package) is not None:
        return True
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def _label(wrapper) -> str:
    """What runs behind one wrapper: the reference kernel, the real package, or transformers' fallback."""
    cells = wrapper_cells(wrapper)
    impl, package = cells["implementation"].cell_contents, kernel_names(cells)[1]
    if getattr(impl, "__packsim_kernel__", None) == REFERENCE_KERNEL:
        return REFERENCE_KERNEL
    if cells["is_new_implementation"].cell_contents:
        return f"{package} (the real package)"
    return f"transformers' torch fallback ({package} not bound)"


def kernels_in_use(target=None) -> dict[str, str]:
    """{kernel name: what runs it} for a model (the modules its layers are defined in), a module, a list
    of modules, or (None) every loaded modeling module: ``REFERENCE_KERNEL``, "<package> (the real
    package)" or "transformers' torch fallback (...)" (several, joined by " / ", where modules differ)."""
    import torch

    if isinstance(target, torch.nn.Module):
        names = {type(m).__module__ for m in target.modules()}
        target = [sys.modules[n] for n in sorted(names) if n in sys.modules]
    elif target is not None and not isinstance(target, (list, tuple)):
        target = [target]
    labels: dict[str, set] = {}
    for site in kernel_sites(target):
        labels.setdefault(site.func_name, set()).add(_label(site.wrapper))
    return {name: " / ".join(sorted(found)) for name, found in labels.items()}


@dataclass
class HybridKernels:
    """What :func:`emulate_hybrid_kernels` did. ``kernel`` is always "reference kernel (packsim, pure
    torch)": what now runs at every site in ``wired`` (and ``already``, wired before). ``kept``: sites
    whose real package wins; ``left``: kernels packsim has no reference for (transformers' own).
    ``undo()`` (or leaving a ``with`` block) restores the sites this call wired."""

    wired: tuple[str, ...]
    already: tuple[str, ...]
    kept: tuple[str, ...]
    left: tuple[str, ...]
    kernel: str = REFERENCE_KERNEL
    names: tuple[str, ...] = ()  # the kernels now on the reference ("causal_conv1d_fn", ...)
    _saved: list = field(default_factory=list, repr=False)

    def undo(self) -> None:
        """Put back what transformers had bound at the sites this call wired (idempotent)."""
        while self._saved:
            restore(*self._saved.pop())

    def __enter__(self) -> HybridKernels:
        return self

    def __exit__(self, *exc) -> None:
        self.undo()

    def __str__(self) -> str:
        kept = f"; real package kept at {len(self.kept)} sites" if self.kept else ""
        return (f"{self.kernel} behind {len(self.wired) + len(self.already)} transformers kernel sites "
                f"({', '.join(self.names) or 'none'}){kept}")


def emulate_hybrid_kernels(modules=None) -> HybridKernels:
    """Make transformers' hybrid models call packsim's reference kernels (pure torch) where they look for
    ``causal_conv1d``, ``mamba_ssm`` and ``fla``, unless the real package is bound or installed.

    ``modules``: the modeling modules to wire (default: the hybrid families' and every other loaded
    ``transformers.models.*.modeling_*``). Returns a :class:`HybridKernels` (a context manager;
    ``undo()`` restores). A model imported after this call is not wired: call it again.
    """
    sites = kernel_sites(modules)
    if modules is None and not sites:
        import transformers

        from packsim.core.upstream.window import notice

        raise PacksimError(_MOVED.format(v=transformers.__version__, mods=", ".join(HYBRID_MODULES))
                           + f" ({notice(transformers.__version__)})")
    wired, already, kept, left, saved, seen, names = [], [], [], [], [], set(), set()
    for site in sites:
        reference = REFERENCES.get(site.func_name)
        label = _label(site.wrapper)
        if id(site.wrapper) in seen:  # the same wrapper under a second name: wired once, above
            wired.append(site.where)
        elif reference is None:
            left.append(f"{site.where} ({site.func_name}: {label})")
        elif label == REFERENCE_KERNEL:
            already.append(site.where)
            names.add(site.func_name)
        elif not label.startswith("transformers'"):
            kept.append(f"{site.where} ({label}, bound by transformers)")
        elif _installed(site.package):
            kept.append(f"{site.where} ({site.package} is installed, so packsim does not stand in for it; "
                        "transformers did not bind it at import)")
        else:
            cells, kernel = wrapper_cells(site.wrapper), reference[1]
            saved.append((cells, swap(cells, kernel, tuple(inspect.signature(kernel).parameters))))
            seen.add(id(site.wrapper))
            wired.append(site.where)
            names.add(site.func_name)
    return HybridKernels(tuple(wired), tuple(already), tuple(kept), tuple(left), names=tuple(sorted(names)),
                         _saved=saved)
