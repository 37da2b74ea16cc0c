"""An example as token ids from any tokenizer, and the one reading of an example from a dict.

packsim packs anything with ``.tokens`` (the training sequence, special tokens included) and
``.n_prompt`` (how many of those tokens are the prompt): a :class:`packsim.core.data.Example`, or
a :class:`TokenExample`. :func:`read_example` is the one reading of an item as its tokens (L,)
and its response flags (L,) bool (True on the response, its EOS included), in these forms (the
first that matches):

1. an object with ``.tokens`` and ``.n_prompt``;
2. a dict ``{"prompt_ids": [...], "response_ids": [...]}``, or TRL's ``"prompt_ids"`` +
   ``"completion_ids"``: the sequence is the two concatenated as given (add your own BOS/EOS);
3. a dict with ``"completion_mask"`` and/or ``"assistant_masks"`` (TRL's tokenization: 1 on the
   completion, on the assistant's turns; with both, a token is response where both say so), its
   tokens the dict's ``"input_ids"`` (None when it has none).

:func:`as_example` reads an item to pack (one prompt, then one response): what the collator,
``PackedBatch``, forensics and the museum share; the audit's features and located examples
(:mod:`packsim.auditing.features`, :mod:`packsim.auditing.locate`) read :func:`read_example`.
:func:`id_list` is the one reading of a list of token ids (a list, tuple, tensor or numpy array).

Lessons: none directly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral

from packsim.core.errors import PacksimError

__all__ = ["TokenExample", "as_example", "id_list", "read_example"]

_MASKS = ("completion_mask", "assistant_masks")
_FORMS = ("'prompt_ids' and 'response_ids' (or TRL's 'completion_ids'), or 'input_ids' with a "
          "'completion_mask' / 'assistant_masks' (TRL's tokenization)")


@dataclass(frozen=True)
class TokenExample:
    """``tokens`` (L,) as given, special tokens included; the first ``n_prompt`` are the prompt."""

    tokens: tuple[int, ...]
    n_prompt: int


def id_list(ids, name: str = "ids") -> list[int]:
    """``ids`` (a list, tuple, 1-D tensor or numpy array of ints) as a list of Python ints.

    ``name`` names the value in errors (``"feature 3['prompt_ids']"``). Raises
    :class:`PacksimError` for text, a non-sequence, or an entry that is not an integer (a bool,
    a float). Token values are checked later, against a vocabulary.
    """
    values = _values(ids, name, "a list of token ids", "tokenize the text first")  # a fresh list
    if set(map(type, values)) <= {int}:  # plain ints, the usual case: no Python call per token
        return values
    bad = [t for t in values if isinstance(t, bool) or not isinstance(t, Integral)]
    if bad:
        raise PacksimError(f"{name} holds {bad[0]!r} ({type(bad[0]).__name__}), not a token id.")
    return [int(t) for t in values]


def _values(values, name: str, want: str, fix: str) -> list:
    if hasattr(values, "tolist"):  # tensor / numpy array
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise PacksimError(f"{name} must be {want}, got {type(values).__name__}: {fix}.")
    return list(values)


def read_example(item, i: int = 0, what: str = "feature") -> tuple[list[int] | None, list[bool]]:
    """``item`` in one of the module's forms -> (tokens (L,) or None, response flags (L,) bool).

    ``i`` and ``what`` name the item in errors (``"feature 3 ..."``). Raises
    :class:`PacksimError` for any other item, ids that are not ints, or masks of different
    lengths. Empty prompts or responses are returned as they are (:func:`as_example` refuses them).
    """
    return _read(item, i, what)[:2]


def _read(item, i: int, what: str) -> tuple[list[int] | None, list[bool], tuple[str, str]]:
    """:func:`read_example` plus the names of where the prompt and the response came from."""
    if hasattr(item, "tokens") and hasattr(item, "n_prompt"):
        tokens, n = id_list(item.tokens, f"{what} {i}.tokens"), int(item.n_prompt)
        return tokens, [False] * n + [True] * (len(tokens) - n), ("a prompt", "a response")
    if not isinstance(item, Mapping):
        raise PacksimError(f"{what} {i} is a {type(item).__name__}: pass packsim.core.data.Example objects "
                           f"(anything with .tokens and .n_prompt) or dicts with {_FORMS}.")
    rest = next((k for k in ("response_ids", "completion_ids") if k in item), None)
    if "prompt_ids" in item and rest is not None:
        prompt = id_list(item["prompt_ids"], f"{what} {i}['prompt_ids']")
        response = id_list(item[rest], f"{what} {i}[{rest!r}]")
        return prompt + response, [False] * len(prompt) + [True] * len(response), ("prompt_ids", rest)
    masks = {k: _values(item[k], f"{what} {i}[{k!r}]", "a list", "pass the tokenized feature as the "
                        "collator gets it") for k in _MASKS if k in item}
    if masks:
        if len({len(m) for m in masks.values()}) > 1:
            raise PacksimError(f"{what} {i} has completion_mask and assistant_masks of different "
                               "lengths: rebuild them from the same tokenization.")
        flags = [all(bool(b) for b in bits) for bits in zip(*masks.values(), strict=True)]
        key = " and ".join(masks)
        tokens = id_list(item["input_ids"], f"{what} {i}['input_ids']") if "input_ids" in item else None
        if tokens is not None and len(tokens) != len(flags):
            raise PacksimError(f"{what} {i} has {len(tokens)} input_ids but {len(flags)} entries of {key}: "
                               "rebuild them from the same tokenization.")
        return tokens, flags, (f"prompt tokens (its {key} is 1 from the first token)", f"response tokens "
                               f"(its {key} holds no 1)")
    raise PacksimError(
        f"{what} {i} is a dict with keys {sorted(item)}, none of which says where the prompt ends: packsim "
        f"needs {_FORMS} to know which tokens the loss counts. With the Trainer, pass "
        "remove_unused_columns=False so these keys reach the collator."
    )


def as_example(item, i: int = 0, what: str = "feature"):
    """``item`` as an example to pack: an object with ``.tokens`` and ``.n_prompt`` as is, a dict read
    by :func:`read_example` as a :class:`TokenExample`.

    ``i`` and ``what`` name the item in errors (``"feature 3 ..."``). Raises
    :class:`PacksimError` for what :func:`read_example` refuses, an empty prompt or response, a mask
    without ``input_ids``, or a mask that marks more than one response (assistant turns).
    """
    if hasattr(item, "tokens") and hasattr(item, "n_prompt"):
        return item
    tokens, flags, (prompt_key, response_key) = _read(item, i, what)
    if tokens is None:
        raise PacksimError(f"{what} {i} has a {' and '.join(k for k in _MASKS if k in item)} but no "
                           "'input_ids': pass the tokenized feature whole.")
    n_prompt = flags.index(True) if True in flags else len(flags)
    if n_prompt == 0:
        raise PacksimError(
            f"{what} {i} has no {prompt_key}: put at least one token (e.g. BOS) before the "
            "response; the first token of an example is never a target."
        )
    if n_prompt == len(flags):
        raise PacksimError(
            f"{what} {i} has no {response_key}: a completion-only loss needs at least one "
            "response token (its EOS counts); drop the example or fill it."
        )
    if not all(flags[n_prompt:]):
        t = flags.index(False, n_prompt)
        raise PacksimError(
            f"{what} {i} marks more than one response (a prompt token at {t}, after the response began "
            f"at {n_prompt}): packsim packs one prompt then one response; pass prompt_ids (the earlier "
            "turns included) and response_ids."
        )
    return TokenExample(tuple(tokens), n_prompt)
