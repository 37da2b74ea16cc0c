"""The response mask of collator features, from their prompt / completion split (lesson 07).

The loss probe of :func:`packsim.audit` tells prompt from response only when it is given a
``response_mask``: bool, True on response tokens and EOS, one entry per token of the batch. The
labels cannot say it: they are what the audit checks. :func:`response_mask_from_features` builds
it from the features a collator gets, before collation::

    batch = DataCollatorWithFlattening()(features)                 # input_ids (1, N)
    mask = response_mask_from_features(features)                  # (1, N) bool
    report = packsim.audit(model, batch, response_mask=mask, use_cache=False)

A feature says where its prompt ends in one of these forms (checked in this order):

- ``completion_mask`` (what TRL's SFTTrainer tokenisation returns for prompt/completion data,
  1 on the completion), and/or ``assistant_masks`` (TRL, conversational data);
- ``prompt_ids`` + ``response_ids`` or ``completion_ids`` (the sequence is the two concatenated,
  as :class:`packsim.PackingCollator` collates them);
- ``.tokens`` + ``.n_prompt`` (a :class:`packsim.core.data.Example`).

Layouts: ``"flat"`` (1, N), the features back to back (DataCollatorWithFlattening, TRL's
padding-free collator, PackingCollator); ``"padded"`` (B, T_max), one feature per row, padded on
the ``padding_side`` with False.

Lessons: 07, A6.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from packsim.core.errors import PacksimError

__all__ = ["response_mask_from_features", "feature_response_masks"]

_FORMS = ("a 'completion_mask' or 'assistant_masks' list (TRL), 'prompt_ids' + 'response_ids' "
          "(or 'completion_ids'), or an object with .tokens and .n_prompt (packsim Example)")


def _as_list(values, i: int, key: str) -> list:
    if hasattr(values, "tolist"):
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise PacksimError(f"feature {i}[{key!r}] must be a list, got {type(values).__name__}: "
                           "pass the tokenized feature as the collator gets it.")
    return list(values)


def _one(feature, i: int) -> list[bool]:
    """Response flags of one feature (True on the completion), in its token order."""
    if isinstance(feature, Mapping):
        masks = [_as_list(feature[k], i, k) for k in ("completion_mask", "assistant_masks") if k in feature]
        if masks:
            if len({len(m) for m in masks}) > 1:
                raise PacksimError(f"feature {i} has completion_mask and assistant_masks of different "
                                   "lengths: rebuild them from the same tokenization.")
            return [all(bool(b) for b in bits) for bits in zip(*masks, strict=True)]
        if "prompt_ids" in feature:
            rest = next((k for k in ("response_ids", "completion_ids") if k in feature), None)
            if rest is not None:
                prompt = _as_list(feature["prompt_ids"], i, "prompt_ids")
                return [False] * len(prompt) + [True] * len(_as_list(feature[rest], i, rest))
        raise PacksimError(f"feature {i} has keys {sorted(feature)}, none of which says where the "
                           f"prompt ends: give {_FORMS}.")
    if hasattr(feature, "tokens") and hasattr(feature, "n_prompt"):
        n, total = int(feature.n_prompt), len(feature.tokens)
        return [False] * n + [True] * (total - n)
    raise PacksimError(f"feature {i} is a {type(feature).__name__}: give {_FORMS}.")


def feature_response_masks(features: Sequence) -> list[list[bool]]:
    """One list of response flags per feature (True on completion tokens and EOS)."""
    if isinstance(features, (Mapping, str, bytes)) or not isinstance(features, Sequence):
        raise PacksimError(f"pass a list of features, got {type(features).__name__}.")
    if len(features) == 0:
        raise PacksimError("no features: pass the list the collator was called with.")
    return [_one(f, i) for i, f in enumerate(features)]


def response_mask_from_features(features: Sequence, layout: str = "flat",
                                padding_side: str = "right") -> torch.Tensor:
    """Bool response mask of the batch a collator builds from ``features`` (see the module doc).

    Returns (1, N) for ``layout="flat"`` (N = total tokens) or (B, T_max) for ``"padded"``.
    Raises :class:`PacksimError` for a feature without a prompt/completion split or a bad layout.
    """
    masks = feature_response_masks(features)
    if layout == "flat":
        return torch.tensor([sum(masks, [])], dtype=torch.bool)  # (1, N)
    if layout == "padded":
        if padding_side not in ("right", "left"):
            raise PacksimError(f"padding_side must be 'right' or 'left', got {padding_side!r}.")
        T = max(len(m) for m in masks)
        out = torch.zeros(len(masks), T, dtype=torch.bool)  # (B, T_max)
        for row, m in enumerate(masks):
            if m:
                start = 0 if padding_side == "right" else T - len(m)
                out[row, start:start + len(m)] = torch.tensor(m)
        return out
    raise PacksimError(f"layout must be 'flat' (features back to back) or 'padded' (one per row), "
                       f"got {layout!r}.")
