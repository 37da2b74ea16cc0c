"""packsim: pack sequences for LLM fine-tuning correctly, and prove it with tiny models.

Public API (stable names):

- :func:`pack` -- packing algorithms (``wrapped``, ``ffd``, ``bfd``);
- :class:`PackedBatch` -- packed rows built for a setup (``PackedBatch.from_examples``);
- :class:`Setup`, :data:`SETUPS` -- mask x positions x loss, presets ``buggy``/``correct``/``padded``;
- :func:`varlen_attention`, :func:`available_backends` -- one varlen interface, many kernels;
- :func:`get_device` -- the one place that picks CPU or CUDA.
"""

from .attention import available_backends, varlen_attention
from .audit import AuditReport, audit
from .batch import PackedBatch
from .device import fast_mode, get_device
from .errors import PacksimError
from .packing import pack
from .setups import SETUPS, Setup, get_setup

__version__ = "0.1.0"

__all__ = [
    "AuditReport",
    "PackedBatch",
    "PacksimError",
    "SETUPS",
    "Setup",
    "audit",
    "available_backends",
    "fast_mode",
    "get_device",
    "get_setup",
    "pack",
    "varlen_attention",
]
