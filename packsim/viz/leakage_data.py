"""What the leakage explorer shows, computed: attention maps per setup, one query's weights, its leak.

Shapes: a pack ``batch`` (B, T); its attention maps under one setup, ``maps`` (L, B, H, T, T)
float on CPU (:func:`setup_maps`, from :func:`packsim.core.model.attention_maps`, once per
setup); the weights one query gives the keys of its row, (T,) (:func:`key_weights`), or every
query's, (T, T) (:func:`row_weights`), for one layer and head or the mean over them
(:data:`MEAN`); the share of one query's attention outside its own example, a float
(:func:`query_share`, :func:`packsim.core.attention_share.outside_share` of one query). The
widget and the static figure that show these are in :mod:`packsim.viz.leakage`.

Lessons: none directly (lessons 02 and 06 open :func:`packsim.viz.leakage_explorer`).
"""

from __future__ import annotations

import torch

from packsim.core.attention_share import outside_share
from packsim.core.batch import PackedBatch
from packsim.core.device import model_device
from packsim.core.errors import PacksimError
from packsim.core.model import attention_maps, build_model
from packsim.core.setups import get_setup

__all__ = ["MEAN", "key_weights", "row_weights", "query_share", "panel_models", "setup_maps"]

MEAN = "mean"


def _check_choice(value, n: int, what: str):
    """``value`` is ``"mean"`` or an index in ``[0, n)``; PacksimError otherwise."""
    if value == MEAN:
        return MEAN
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
        raise PacksimError(f"{what}={value!r} is not valid: use 'mean' or an int in 0..{n - 1}.")
    return value


def _pick(m: torch.Tensor, layer, head) -> torch.Tensor:
    """One layer and head (or the mean over them) of attention ``m`` (L, H, ...) -> (...)."""
    m = m.mean(0) if layer == MEAN else m[layer]  # (H, ...)
    return m.mean(0) if head == MEAN else m[head]


def key_weights(maps: torch.Tensor, row: int, query: int, layer=MEAN, head=MEAN) -> torch.Tensor:
    """Attention of one query token over the keys of its row: maps (L, B, H, T, T) -> (T,).

    ``layer`` / ``head``: an index or ``"mean"`` (average over layers / heads). The result sums
    to 1 over the keys the query may see. Used by the leakage explorer (notebooks 02, 06, 07).
    """
    L, _, H, T, _ = maps.shape
    layer, head = _check_choice(layer, L, "layer"), _check_choice(head, H, "head")
    if isinstance(query, bool) or not isinstance(query, int) or not 0 <= query < T:
        raise PacksimError(f"query={query!r} is not a token of the row: pick 0..{T - 1}.")
    return _pick(maps[:, row, :, query, :], layer, head)  # (L, H, T) -> (T,)


def row_weights(maps: torch.Tensor, row: int, layer=MEAN, head=MEAN) -> torch.Tensor:
    """Every query's attention over the keys of one row: maps (L, B, H, T, T) -> (T, T)."""
    L, _, H = maps.shape[:3]
    layer, head = _check_choice(layer, L, "layer"), _check_choice(head, H, "head")
    return _pick(maps[:, row], layer, head)  # (L, H, T, T) -> (T, T)


def query_share(weights: torch.Tensor, seq_row: torch.Tensor, query: int) -> float:
    """:func:`~packsim.core.attention_share.outside_share` of one query: its ``weights`` (T,) over row ``seq_row`` (T,)."""
    T = weights.shape[-1]
    rows = weights.expand(T, T)[None, None]  # (1, 1, T, T): this query's weights in every row
    return float(outside_share(rows, seq_row[None])[0, 0, query])


def panel_models(models, batch: PackedBatch, seed: int, setups) -> dict:
    """``{setup name: model}``; None -> one untrained tiny model shared by every setup."""
    if models is None:
        from packsim.core.tokenizer import VOCAB_SIZE

        vocab = max(VOCAB_SIZE, int(batch.input_ids.max()) + 1)
        model = build_model("tiny", vocab_size=vocab, seed=seed)
        return {name: model for name in setups}
    if not isinstance(models, dict) or not models:
        raise PacksimError(
            "models must be a dict {setup name: model}, e.g. {'buggy': m1, 'correct': m2}, "
            f"or None for one untrained tiny model; got {type(models).__name__}."
        )
    for name in models:
        get_setup(name)  # raises with the list of presets
    return dict(models)


def setup_maps(models: dict, batch: PackedBatch) -> dict[str, torch.Tensor]:
    """``{setup: attention maps (L, B, H, T, T)}``, float on CPU, of ``batch`` under each setup."""
    return {
        name: attention_maps(model, batch.with_setup(name).to(model_device(model))).float().cpu()
        for name, model in models.items()
    }
