"""transformers' kernel wrappers (``integrations/hub_kernels.py``): find them, read them, swap what runs.

Every hybrid model in transformers calls its conv / scan / delta-rule kernels through module-level
objects made by ``use_kernel_func_from_hub_with_fallback(func_name, package)``. Its inner function
``wrapped`` closes over the kernel it chose at import (``implementation``), whether that is the real
package (``is_new_implementation``), the kernel's parameter names (``applicable_params``), and from
transformers 5.25 on the devices the package runs on (``supported_devices``; None for the torch
function). What the model module holds depends on the stack:

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

Lessons: none directly (packsim.core.reference_hybrid wires the reference kernels through it).
"""

from __future__ import annotations

__all__ = ["CELLS", "REFUSAL", "SWAPPED", "restore", "swap", "torch_function", "wrapper_cells"]

# the names ``wrapped`` closes over that packsim reads (read from transformers 5.24.0 and 5.25.0)
CELLS = ("implementation", "is_new_implementation", "applicable_params", "func_name", "package", "torch_function")
# the ones packsim sets to stand a reference kernel in for the package (supported_devices: 5.25 and later)
SWAPPED = ("implementation", "is_new_implementation", "applicable_params", "supported_devices")
# what ``wrapped`` raises when seq_idx / cu_seqlens reach the torch function (5.24.0, 5.25.0)
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
    or None when ``value`` is not one (a plain function, a class, a kernels module over something else)."""
    try:
        cells = _closure(_transformers_wrapper(value))
    except (TypeError, ValueError):  # a C object, an odd descriptor: not a wrapper
        return None
    return cells if all(name in cells for name in CELLS) else None


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
