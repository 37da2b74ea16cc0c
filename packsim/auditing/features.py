"""The response mask of collator features, from their prompt / completion split (lesson 07).

The loss probe of :func:`packsim.audit` tells prompt from response only when it is given a
``response_mask``: bool, True on response tokens and EOS, one entry per token of the batch. The
labels cannot say it: they are what the audit checks. :func:`response_mask_from_features` builds
it from the features a collator gets, before collation::

    batch = DataCollatorWithFlattening()(features)                 # input_ids (1, N)
    mask = response_mask_from_features(features)                  # (1, N) bool
    report = packsim.audit(model, batch, response_mask=mask, use_cache=False)

A feature says where its prompt ends in one of the forms of the one reading of an example,
:func:`packsim.core.token_example.read_example` (checked in this order):

- ``.tokens`` + ``.n_prompt`` (a :class:`packsim.core.data.Example`);
- ``prompt_ids`` + ``response_ids`` or ``completion_ids`` (the sequence is the two concatenated,
  as :class:`packsim.PackingCollator` collates them);
- ``completion_mask`` (what TRL's SFTTrainer tokenisation returns for prompt/completion data,
  1 on the completion), and/or ``assistant_masks`` (TRL, conversational data).

Layouts: ``"flat"`` (1, N), the features back to back (DataCollatorWithFlattening, TRL's
padding-free collator, PackingCollator); ``"padded"`` (B, T_max), one feature per row, padded on
the ``padding_side`` with False.

Lessons: 07, A6.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from packsim.core.errors import PacksimError
from packsim.core.token_example import read_example

__all__ = ["response_mask_from_features", "feature_response_masks"]


def feature_response_masks(features: Sequence) -> list[list[bool]]:
    """One list of response flags per feature (True on completion tokens and EOS)."""
    if isinstance(features, (Mapping, str, bytes)) or not isinstance(features, Sequence):
        raise PacksimError(f"pass a list of features, got {type(features).__name__}.")
    if len(features) == 0:
        raise PacksimError("no features: pass the list the collator was called with.")
    return [read_example(f, i)[1] for i, f in enumerate(features)]


def response_mask_from_features(features: Sequence, layout: str = "flat",
                                padding_side: str = "right") -> torch.Tensor:
    """Bool response mask of the batch a collator builds from ``features`` (see the module doc).

    Returns (1, N) for ``layout="flat"`` (N = total tokens) or (B, T_max) for ``"padded"``.
    Raises :class:`PacksimError` for a feature without a prompt/completion split or a bad layout.

    Example::

        >>> from packsim import response_mask_from_features
        >>> features = [{"prompt_ids": [1, 2, 3], "response_ids": [4, 5]}, {"prompt_ids": [6], "response_ids": [7, 8]}]
        >>> response_mask_from_features(features).int().tolist()
        [[0, 0, 0, 1, 1, 0, 1, 1]]
        >>> response_mask_from_features(features, layout="padded").int().tolist()
        [[0, 0, 0, 1, 1], [0, 1, 1, 0, 0]]
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
