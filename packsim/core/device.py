"""The device: the one place that decides CPU vs CUDA.

``get_device`` picks where to run, ``model_device`` says where a model already is.

Lessons: 00.
"""

from __future__ import annotations

import os

import torch

from packsim.core.errors import PacksimError

__all__ = ["get_device", "model_device"]


def get_device(prefer: str | None = None) -> torch.device:
    """Return the device packsim runs on.

    Order: the argument, then the ``PACKSIM_DEVICE`` env var, then CUDA if available, else CPU.
    Asking for CUDA on a machine without it raises :class:`PacksimError` saying what to do.

    Example::

        >>> import packsim
        >>> packsim.get_device("cpu")
        device(type='cpu')
    """
    name = prefer or os.environ.get("PACKSIM_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise PacksimError(f"unknown device {name!r} ({err}): use 'cpu', 'cuda' or 'cuda:N'.") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise PacksimError(
            f"device {name!r} was requested but torch sees no CUDA device "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda is not None}). "
            "Use device='cpu' (or unset PACKSIM_DEVICE), or install a CUDA build of torch."
        )
    return device


def model_device(model) -> torch.device:
    """The device a model's parameters live on (CPU for a model without parameters)."""
    param = next(iter(model.parameters()), None)
    return torch.device("cpu") if param is None else param.device
