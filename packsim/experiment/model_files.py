"""Trained weights on disk: the one place the course writes a model's ``state_dict`` and reads it back.

``.safetensors`` files (the committed models, with string metadata) go through safetensors, which
stores the tied ``lm_head`` once; any other suffix (``.pt``: a comparison's ``models/``,
``packsim train``'s ``model.pt``) is ``torch.save`` of the state dict on the CPU, read back with
``weights_only=True``. :func:`load_weights` builds a fresh tiny model of the given size and puts
the weights in it.

Lessons: none directly.
"""

from __future__ import annotations

from pathlib import Path

import torch

from packsim.core.device import get_device
from packsim.core.model import build_model

__all__ = ["model_path", "save_weights", "read_weights", "load_weights"]


def model_path(out: str | Path, setup: str, seed: int) -> Path:
    """Where a comparison (``packsim compare --out DIR``) keeps a run's weights: ``DIR/models/<setup>-seed<k>.pt``."""
    return Path(out) / "models" / f"{setup}-seed{seed}.pt"


def _safetensors(path: Path) -> bool:
    return path.suffix == ".safetensors"


def save_weights(model, path: str | Path, metadata: dict[str, str] | None = None) -> Path:
    """Write ``model``'s weights to ``path`` (folders created); ``metadata`` only for .safetensors."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if _safetensors(path):
        from safetensors.torch import save_model

        save_model(model, str(path), metadata=metadata)
    else:
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, path)
    return path


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The state dict stored at ``path``, on the CPU (a .safetensors file stores tied weights once)."""
    path = Path(path)
    if _safetensors(path):
        from safetensors.torch import load_file

        return load_file(str(path))
    return torch.load(path, map_location="cpu", weights_only=True)


def load_weights(path: str | Path, size: str = "tiny", device=None):
    """A fresh ``build_model(size)`` holding the weights at ``path``, on ``device``, in eval mode."""
    path = Path(path)
    model = build_model(size)
    if _safetensors(path):
        from safetensors.torch import load_model

        load_model(model, str(path))
    else:
        model.load_state_dict(read_weights(path))
    return model.to(get_device(device)).eval()
