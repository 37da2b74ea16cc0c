"""An example as token ids from any tokenizer, and reading one from a prompt/response dict.

packsim packs anything with ``.tokens`` (the training sequence, special tokens included) and
``.n_prompt`` (how many of those tokens are the prompt): a :class:`packsim.core.data.Example`, or
a :class:`TokenExample`. :func:`as_example` takes either, or a dict
``{"prompt_ids": [...], "response_ids": [...]}``, whose sequence is the two concatenated as given
(add your own BOS/EOS): the one reading of such a dict that the collator, ``PackedBatch``,
forensics and the museum share.

Lessons: none directly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from packsim.core.errors import PacksimError

__all__ = ["TokenExample", "as_example"]


@dataclass(frozen=True)
class TokenExample:
    """``tokens`` (L,) as given, special tokens included; the first ``n_prompt`` are the prompt."""

    tokens: tuple[int, ...]
    n_prompt: int


def as_example(item, i: int = 0, what: str = "feature"):
    """``item`` as an example: an object with ``.tokens`` and ``.n_prompt`` as is, a dict as above.

    ``i`` and ``what`` name the item in errors (``"feature 3 ..."``). Raises
    :class:`PacksimError` for a dict without both keys, an empty prompt or response, ids that are
    not ints, or anything else. Token values are checked later, against a vocabulary.
    """
    if hasattr(item, "tokens") and hasattr(item, "n_prompt"):
        return item
    if isinstance(item, Mapping):
        if "prompt_ids" in item and "response_ids" in item:
            prompt = _id_list(item["prompt_ids"], i, what, "prompt_ids")
            response = _id_list(item["response_ids"], i, what, "response_ids")
            if not prompt:
                raise PacksimError(
                    f"{what} {i} has no prompt_ids: put at least one token (e.g. BOS) before the "
                    "response; the first token of an example is never a target."
                )
            if not response:
                raise PacksimError(
                    f"{what} {i} has no response_ids: a completion-only loss needs at least one "
                    "response token (its EOS counts); drop the example or fill it."
                )
            return TokenExample(tuple(prompt + response), len(prompt))
        raise PacksimError(
            f"{what} {i} is a dict with keys {sorted(item)}: packsim needs 'prompt_ids' and "
            "'response_ids' (lists of token ids) to know which tokens the loss counts. With the "
            "Trainer, pass remove_unused_columns=False so these keys reach the collator."
        )
    raise PacksimError(
        f"{what} {i} is a {type(item).__name__}: pass packsim.core.data.Example objects (anything "
        "with .tokens and .n_prompt) or dicts with 'prompt_ids' and 'response_ids'."
    )


def _id_list(ids, i: int, what: str, key: str) -> list[int]:
    if hasattr(ids, "tolist"):  # tensor / numpy array
        ids = ids.tolist()
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise PacksimError(f"{what} {i}[{key!r}] must be a list of token ids, got "
                           f"{type(ids).__name__}: tokenize the text first.")
    bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int)]
    if bad:
        raise PacksimError(f"{what} {i}[{key!r}] holds {bad[0]!r} ({type(bad[0]).__name__}), "
                           "not a token id.")
    return list(ids)
