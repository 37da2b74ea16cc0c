"""packsim: pack sequences for LLM fine-tuning correctly, and prove it with tiny models.

Public API (stable names):

- :func:`pack` -- packing algorithms (``wrapped``, ``sequential``, ``ffd``, ``bfd``);
- :class:`PackedBatch` -- packed rows built for a setup (``PackedBatch.from_examples``);
- :class:`Setup`, :data:`SETUPS` -- mask x positions x loss, presets ``buggy``/``correct``/``padded``;
- :func:`varlen_attention`, :func:`available_backends` -- one varlen interface, many kernels;
- :func:`train`, :class:`TrainConfig`, :func:`evaluate_isolated` -- the experiment (notebook 06);
- :func:`audit`, :class:`AuditReport` -- detect contamination in any packed pipeline (notebook 07);
- :class:`PackingCollator` -- packed, completion-only batches for the transformers ``Trainer`` (07);
- :func:`get_device` -- the one place that picks CPU or CUDA;
- ``packsim.viz`` -- the widgets (imported on first use: it pulls in plotly and ipywidgets).
"""

import importlib

from packsim.auditing import AuditReport, audit
from packsim.auditing.trainer import audit_trainer  # a Trainer / SFTTrainer as built (notebook 07)
from packsim.core.attention import varlen_attention
from packsim.core.attention_backends import available_backends
from packsim.core.batch import PackedBatch
from packsim.core.collator import PackingCollator
from packsim.core.device import fast_mode, get_device
from packsim.core.errors import PacksimError
from packsim.core.packing import pack, pack_arrays
from packsim.core.setups import SETUPS, Setup, get_setup
from packsim.experiment.evaluation import evaluate_isolated
from packsim.experiment.results import Results
from packsim.experiment.training import TrainConfig, train

__version__ = "0.1.0"

__all__ = [
    "AuditReport",
    "PackedBatch",
    "PackingCollator",
    "PacksimError",
    "Results",
    "SETUPS",
    "Setup",
    "TrainConfig",
    "audit",
    "audit_trainer",
    "available_backends",
    "evaluate_isolated",
    "fast_mode",
    "get_device",
    "get_setup",
    "pack",
    "pack_arrays",
    "train",
    "varlen_attention",
]


def __getattr__(name: str):
    """``packsim.viz`` on first access (keeps ``import packsim`` free of plotly and ipywidgets)."""
    if name == "viz":
        return importlib.import_module(".viz", __name__)
    raise AttributeError(f"module 'packsim' has no attribute {name!r}")
