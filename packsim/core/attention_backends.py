"""Which varlen attention backend runs: what each needs, what this machine has, and the pick.

:data:`BACKENDS` names the five kernels of :func:`packsim.core.attention.varlen_attention`.
:func:`available_backends` says, for a device and dtype, whether each can run, why (or every
reason why not, at once) and whether it trains (:class:`BackendStatus`); flash and
``torch_varlen`` need CUDA on an Ampere or newer GPU with float16/bfloat16 tensors, and eager
FlexAttention may have no backward on CPU (probed once in the installed torch, whatever its
version: the tested CPU builds have none). :func:`resolve_backend` turns ``"auto"`` (or a
name) into the backend for q (total_q, H, D)'s device and dtype, with the reason; the choice is
logged once at INFO on the ``packsim`` logger (:func:`log_choice`).

Lessons: 03, A7.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch

from packsim.core.device import get_device
from packsim.core.errors import PacksimError

__all__ = ["BACKENDS", "BackendStatus", "available_backends", "resolve_backend"]

BACKENDS = ("dense", "blocked", "flex", "flash", "torch_varlen")
_HALF = (torch.float16, torch.bfloat16)
_INSTEAD = "use backend='blocked' (trains on CPU and GPU) or 'flex' instead"

log = logging.getLogger("packsim")
_logged: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class BackendStatus:
    """Whether a backend can run on a device/dtype, why (or why not), and if it supports backward."""

    available: bool
    reason: str
    trains: bool


@functools.lru_cache(maxsize=1)
def _flash_import_error() -> str | None:
    """None if ``flash_attn.flash_attn_varlen_func`` imports, else the import error text."""
    try:
        from flash_attn import flash_attn_varlen_func  # noqa: F401
    except Exception as err:  # ImportError, or an ABI mismatch raising OSError/RuntimeError
        return f"{type(err).__name__}: {err}"
    return None


def torch_varlen_fn():
    """``torch.nn.attention.varlen.varlen_attn`` or None when this torch lacks it."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


@functools.lru_cache(maxsize=1)
def _flex_cpu_trains() -> bool:
    """Probe once: does FlexAttention support backward on CPU in this torch? (the tested CPU builds: no)."""
    try:
        from torch.nn.attention.flex_attention import flex_attention
    except ImportError:
        return False
    x = torch.zeros(1, 1, 16, 8, requires_grad=True)
    try:
        flex_attention(x, x, x).sum().backward()
    except Exception:  # NotImplementedError, or any other failure: the forward path will tell
        return False
    return True


def _cuda_problems(name: str, device: torch.device, dtype: torch.dtype | None) -> list[str]:
    """Problems that stop a CUDA-only fp16/bf16 kernel (flash, torch_varlen) on device/dtype."""
    problems = []
    if device.type != "cuda":
        problems.append(
            f"{name} runs on CUDA only but the tensors are on {device.type}: move q, k, v to a "
            f"CUDA device"
        )
    elif not torch.cuda.is_available():
        problems.append(
            f"{name} needs CUDA, and this torch build sees no CUDA device "
            f"(torch {torch.__version__}, built with CUDA {torch.version.cuda})"
        )
    elif torch.cuda.get_device_capability(device) < (8, 0):
        cap = ".".join(map(str, torch.cuda.get_device_capability(device)))
        problems.append(f"{name} needs an Ampere or newer GPU (compute capability >= 8.0), got {cap}")
    if dtype is not None and dtype not in _HALF:
        problems.append(
            f"{name} supports float16/bfloat16 only, got {dtype}: cast q, k, v with "
            f".to(torch.bfloat16) (or keep fp32 and use backend='blocked')"
        )
    return problems


def _status(name: str, device: torch.device, dtype: torch.dtype | None) -> BackendStatus:
    """Status of one backend on ``device`` with ``dtype`` (None: do not check the dtype)."""
    if name == "dense":
        return BackendStatus(True, "reference: explicit (N, N) mask + SDPA, O(N^2) memory", True)
    if name == "blocked":
        return BackendStatus(True, "per-example SDPA in length buckets, no N x N mask", True)
    if name == "flex":  # FlexAttention ships with every torch packsim supports (>= 2.6)
        trains = device.type != "cpu" or _flex_cpu_trains()
        note = "" if trains else " (forward only: no FlexAttention backward on CPU in this torch)"
        return BackendStatus(True, f"eager FlexAttention with a document BlockMask{note}", trains)
    if name == "flash":
        err = _flash_import_error()
        missing = (
            f"flash-attn is not installed ({err}); pip install 'packsim[gpu]' builds it from "
            f"source and needs nvcc and a CUDA GPU"
        ) if err else None
        return _cuda_kernel_status(
            "flash-attn", device, dtype, missing,
            "flash_attn_varlen_func: per-sequence tiles, O(sum L_i^2)",
        )  # fmt: skip
    if name == "torch_varlen":
        missing = (
            f"torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn: "
            f"upgrade to torch >= 2.10"
        ) if torch_varlen_fn() is None else None
        return _cuda_kernel_status(
            "torch varlen_attn", device, dtype, missing,
            "torch varlen_attn (flash kernel in torch), O(sum L_i^2)",
        )  # fmt: skip
    raise unknown_backend(name)


def _cuda_kernel_status(label, device, dtype, missing: str | None, ok: str) -> BackendStatus:
    """Status of a CUDA-only fp16/bf16 kernel: every problem listed at once, or ``ok``."""
    problems = _cuda_problems(label, device, dtype) + ([missing] if missing else [])
    if problems:
        return BackendStatus(False, "; ".join(problems) + f". Otherwise {_INSTEAD}", True)
    return BackendStatus(True, ok, True)


def unknown_backend(name) -> PacksimError:
    choices = ", ".join(repr(b) for b in ("auto",) + BACKENDS)
    return PacksimError(f"unknown attention backend {name!r}. Choose one of: {choices}.")


def available_backends(device=None, dtype: torch.dtype | None = None) -> dict[str, BackendStatus]:
    """Status of every backend on ``device`` (default: :func:`get_device`) for ``dtype``.

    ``dtype=None`` skips the dtype check (flash and torch_varlen need fp16/bf16).
    Notebooks 00_start_here and 08_flash_varlen_internals print this table.

    Example::

        >>> import torch, packsim
        >>> status = packsim.available_backends("cpu", torch.float32)
        >>> status["dense"].available, sorted(status) == sorted(packsim.core.attention.BACKENDS)
        (True, True)
    """
    device = get_device() if device is None else torch.device(device)
    return {name: _status(name, device, dtype) for name in BACKENDS}


def resolve_backend(backend: str, q: torch.Tensor, requires_grad: bool) -> tuple[str, str]:
    """Pick the backend for ``q``'s device and dtype: returns ``(name, why)``.

    ``"auto"``: CUDA: flash > torch_varlen > blocked (each only if it handles the dtype);
    CPU: blocked (it trains; eager flex is forward-only and, like dense, materializes N x N).
    Eager flex is not auto-picked on CUDA either: unfused, it materializes the score matrix.
    A backend asked for by name that cannot run raises :class:`PacksimError` saying why.
    """
    if backend != "auto" and backend not in BACKENDS:
        raise unknown_backend(backend)
    mode = "training" if requires_grad else "no grad"
    if backend != "auto":
        status = _status(backend, q.device, q.dtype)
        if not status.available:
            raise PacksimError(f"backend {backend!r} cannot run here: {status.reason}.")
        if requires_grad and not status.trains:
            raise PacksimError(
                f"backend {backend!r} cannot train on {q.device.type}: FlexAttention has no CPU "
                f"backward in torch {torch.__version__}. Use backend='blocked' to train on CPU, run "
                f"on CUDA, or call it under torch.no_grad() for inference."
            )
        return backend, f"{backend} requested by name ({q.device.type}, {q.dtype}, {mode})"
    order = ("flash", "torch_varlen", "blocked") if q.device.type == "cuda" else ("blocked",)
    skipped = []
    for name in order:
        status = _status(name, q.device, q.dtype)
        if status.available and (status.trains or not requires_grad):
            why = f"auto on {q.device.type} ({q.dtype}, {mode}): {name}: {status.reason}"
            if skipped:
                why += "; skipped " + "; ".join(skipped)
            return name, why
        skipped.append(f"{name} ({status.reason.split(';')[0]})")
    raise PacksimError("no attention backend can run here: " + "; ".join(skipped))  # unreachable


def log_choice(name: str, why: str) -> None:
    """Log the backend choice at INFO, once per distinct (name, why)."""
    if (name, why) not in _logged:
        _logged.add((name, why))
        log.info("packsim attention backend: %s", why)


