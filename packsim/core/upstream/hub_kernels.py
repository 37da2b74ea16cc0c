"""transformers' kernel wrappers (``integrations/hub_kernels.py``): find them, read them, swap what runs.

Every hybrid model in transformers calls its conv / scan / delta-rule kernels through module-level
objects made by ``use_kernel_func_from_hub_with_fallback(func_name, package)``. Its inner function
``wrapped`` closes over the kernel it chose at import (``implementation``), whether that is the real
package (``is_new_implementation``), the kernel's parameter names (``applicable_params``) and the
model's own ``torch_function``; from transformers 5.25 on also the devices the package runs on
(``supported_devices``; None for the torch function). Per version (read from 5.16.1, 5.24.0, 5.25.0):

- 5.16.1: ``wrapped`` does not close over ``func_name`` / ``package`` (it never reads them) and never
  refuses: ``seq_idx`` / ``cu_seqlens`` that reach the torch function are dropped by its keyword
  filter, or ignored in its ``**kwargs``, SILENTLY (the packed state runs across); the names are read
  from the decorator line of the torch function's source (``@use_kernel_func_from_hub_with_fallback(
  "chunk_gated_delta_rule", "fla")``: the torch function's own name may differ, as in Qwen3-Next);
- 5.24.0: it closes over ``func_name`` and ``package`` too, and RAISES :data:`REFUSAL` there;
- 5.25.0: as 5.24, plus ``supported_devices``: inputs on another device take the torch function.

What the model module holds depends on the stack:

- transformers without the ``kernels`` package (5.24 and earlier by default): ``wrapped`` itself;
- transformers 5.25 with ``kernels`` (a dependency of 5.25): ``kernels``' ``_create_func_module(wrapped)``
  instance, an ``nn.Module`` whose ``forward`` closes over ``func`` = ``wrapped`` and calls it unless
  a model was ``kernelize``-d with a Hub kernel for that name (read from kernels 0.19.1,
  ``_internals/layer/layer.py``).

:func:`wrapper_cells` reads both: the closure cells of ``wrapped`` by name, or None for anything
else. Why not ``kernels``' own mapping (``use_kernel_mapping`` + ``kernelize``): it replaces the
whole object's forward, so transformers' ``wrapped`` (its keyword filtering by the kernel's
signature, its export rule, its refusal of ``seq_idx`` on the torch function) would no longer run,
it takes effect only on a model that is ``kernelize``-d, and it loads kernels from a repository
layout, not a Python function; and transformers 5.24 without ``kernels`` has no such extension
point at all. tests/test_upstream_hub_kernels.py pins each fact above per installed version.

Above the wrappers, the modeling code must carry ``seq_idx`` down to the mixers (read from the
installed source by :func:`packsim.exhibits.hybrid_sources.dropped_seq_idx`, not a reach of this
module): in 5.16.1 ``Mamba2ForCausalLM.forward`` (to its backbone), ``Mamba2Block`` and
``FalconH1DecoderLayer`` (to their mixers) pass neither ``seq_idx`` nor ``**kwargs``; in 5.24.0
``Mamba2ForCausalLM.forward`` still drops it at its backbone; 5.25.0 passes ``**kwargs`` in all
three (tests/installed.py measures it; tests/test_hybrid_traps.py expects per version).

Lessons: none directly (packsim.reference.hybrid_emulation wires the reference kernels through it).
"""

from __future__ import annotations

import inspect
import re

__all__ = ["CELLS", "REFUSAL", "SWAPPED", "kernel_names", "refuses", "restore", "swap", "torch_function",
           "wrapper_cells"]

# the names ``wrapped`` closes over that packsim needs (5.16.1, 5.24.0, 5.25.0); func_name and package
# are cells from 5.24 on, read from the decorator before (:func:`kernel_names`)
CELLS = ("implementation", "is_new_implementation", "applicable_params", "torch_function")
# the ones packsim sets to stand a reference kernel in for the package (supported_devices: 5.25 and later)
SWAPPED = ("implementation", "is_new_implementation", "applicable_params", "supported_devices")
# what ``wrapped`` raises when seq_idx / cu_seqlens reach the torch function (5.24.0, 5.25.0; 5.16.1 never raises)
REFUSAL = "can't keep packed sequences apart without"


def _closure(fn) -> dict:
    code, closure = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or not closure:
        return {}
    return dict(zip(code.co_freevars, closure, strict=True))


def _transformers_wrapper(value):
    """``wrapped`` behind ``value``: itself, or the ``func`` of a ``kernels`` function module."""
    if _closure(value):
        return value
    forward = getattr(type(value), "forward", None)  # kernels' Func(nn.Module): forward closes over func
    cell = _closure(forward).get("func")
    return cell.cell_contents if cell is not None else None


def wrapper_cells(value) -> dict | None:
    """The closure cells of transformers' kernel wrapper behind ``value`` by name (at least :data:`CELLS`),
    or None when ``value`` is not one (a plain function, a class, a kernels module over something else).
    The wrapper function itself is under the key ``"__wrapped_fn__"`` (not a cell)."""
    try:
        wrapped = _transformers_wrapper(value)
        cells = _closure(wrapped)
    except (TypeError, ValueError):  # a C object, an odd descriptor: not a wrapper
        return None
    if not all(name in cells for name in CELLS):
        return None
    return {**cells, "__wrapped_fn__": _Fn(wrapped)}


class _Fn:  # holds the wrapper function beside its cells (read with .cell_contents, as the cells are)
    def __init__(self, fn):
        self.cell_contents = fn


def _transformers_wrapper_of(cells: dict):
    return cells["__wrapped_fn__"].cell_contents


_DECORATOR = re.compile(r"use_kernel_func_from_hub_with_fallback\(\s*['\"](\w+)['\"]\s*,\s*['\"]([\w.]+)['\"]")


def kernel_names(cells: dict) -> tuple[str, str] | None:
    """(func_name, package) of a wrapper: its cells (5.24 on), else the decorator line above the torch
    function in the modeling source (5.16.1); None when neither says."""
    if "func_name" in cells and "package" in cells:
        return cells["func_name"].cell_contents, cells["package"].cell_contents
    try:
        source = inspect.getsource(cells["torch_function"].cell_contents)
    except (OSError, TypeError):
        return None
    found = _DECORATOR.search(source)
    return (found[1], found[2]) if found else None


def refuses(cells: dict) -> bool:
    """Whether this transformers' wrapper raises when seq_idx / cu_seqlens reach the torch function (5.24
    on), read from ``wrapped``'s own code: its constants hold the refusal's text."""
    wrapped = _transformers_wrapper_of(cells)
    consts = " ".join(str(c) for c in getattr(getattr(wrapped, "__code__", None), "co_consts", ()) if isinstance(c, str))
    return "packed sequences apart" in consts


def torch_function(value):
    """The model's own torch function behind a kernel wrapper (``value.__wrapped__`` up to 5.24; kernels'
    function module in 5.25 has no ``__wrapped__``, its ``func`` does)."""
    cells = wrapper_cells(value)
    if cells is None:
        raise TypeError(f"{value!r} is not a transformers kernel wrapper")
    return cells["torch_function"].cell_contents


def swap(cells: dict, kernel, params: tuple[str, ...]) -> dict:
    """Make the wrapper run ``kernel`` as transformers runs a real package (on every device); returns
    what was there before, for :func:`restore`."""
    before = {name: cells[name].cell_contents for name in SWAPPED if name in cells}
    cells["implementation"].cell_contents = kernel
    cells["is_new_implementation"].cell_contents = True
    cells["applicable_params"].cell_contents = params
    if "supported_devices" in cells:  # 5.25: None = every device (the reference kernels are pure torch)
        cells["supported_devices"].cell_contents = None
    return before


def restore(cells: dict, before: dict) -> None:
    for name, value in before.items():
        cells[name].cell_contents = value
