"""Special tokens: their ids from a tokenizer or a model config, and where they say examples start.

:func:`token_ids` reads ``{name}_token_id`` ("bos", "eos", "pad") of any tokenizer, processor or
model config; :func:`start_ids` keeps the BOS ids that are not also EOS; :func:`is_token` marks
them in ``ids`` (B, T); :func:`example_starts` gives (B, T) bool "an example starts here" from
the tokens, under one rule (below). :func:`packsim.core.segments.seq_ids_from_starts` turns
those starts into example indices (B, T), -1 on padding.

The rule, written once here for every reader of the tokens (the audit's independent evidence and
``audit_trainer``'s reading of wrapped rows):

1. a BOS starts an example; an id that is also the EOS is no BOS (GPT-2's ``<|endoftext|>`` is
   both: it ends an example, it starts none);
2. the token after a run of EOS starts one only when ``eos_starts`` says so, and by default
   exactly when there is no BOS. With a BOS, the BOS marks every start and an EOS inside an
   example is the end of a turn (a multi-turn chat template ends each turn with it). A run of
   EOS counts once: with eos == pad the example's EOS and the padding after it are one run;
3. a row's first token, when it is real, starts one (rows never share an example).

How the conventions read (the tests build each batch by hand):

- BOS + a pad of its own (Gemma, Llama-2): the BOS; the EOS says nothing.
- eos == pad, no BOS (GPT-2, whose BOS id is its EOS): the token after each run of EOS.
- BOS + EOS + a pad of its own (Llama-3): the BOS; an EOS that ends a turn starts nothing.
- a chat template that ends each turn with EOS, without a BOS: the EOS rule marks every turn, so
  these starts are evidence only where their count ties to the examples'
  (:func:`packsim.auditing.evidence.collect` checks it).
- TRL's wrapped packing (SFT): the caller passes ``eos_starts=True``: TRL ends every example
  with EOS, and a tokenizer with a BOS id need not put it in front; a caller that knows each row
  holds one example passes ``eos_starts=False``.

Lessons: none directly (the audit reads the tokens with it).
"""

from __future__ import annotations

import torch

__all__ = ["example_starts", "is_token", "start_ids", "token_ids"]


def token_ids(name: str, *sources) -> set[int]:
    """``{name}_token_id`` of each source (a tokenizer, a processor's tokenizer, a model config).

    An id, a list of ids (a config may list several EOS) or None; None sources are skipped.
    ``token_ids("eos", tokenizer, model.config)`` -> ``{2}``.
    """
    ids: set[int] = set()
    for source in sources:
        source = getattr(source, "tokenizer", source)  # a processor wraps its tokenizer
        value = getattr(source, f"{name}_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        else:
            ids |= {int(v) for v in (value or []) if v is not None}
    return ids


def start_ids(bos: set[int], eos: set[int]) -> set[int]:
    """The BOS ids that start examples: those that are not also EOS (GPT-2's <|endoftext|> is both)."""
    return set(bos) - set(eos)


def is_token(ids: torch.Tensor, which: set[int]) -> torch.Tensor:
    """Bool of ``ids``' shape: True where the token is one of ``which`` (all False for none)."""
    if not which:
        return torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)
    return torch.isin(ids, torch.tensor(sorted(which), dtype=ids.dtype, device=ids.device))


def example_starts(ids: torch.Tensor, real: torch.Tensor, bos: set[int], eos: set[int],
                   eos_starts: bool | None = None) -> torch.Tensor | None:
    """(B, T) bool: where the special tokens of ``ids`` (B, T) start examples, under the module's rule.

    ``real`` (B, T) bool: False on padding, which starts nothing. ``bos``, ``eos``: the ids (a BOS
    that is also an EOS is dropped here). ``eos_starts``: whether the token after a run of EOS
    starts an example; None (default): only when no BOS is left. None when neither id is known.
    """
    bos = start_ids(bos, eos)
    if not bos and not eos:
        return None
    if eos_starts is None:
        eos_starts = not bos  # with a BOS, an EOS may end a turn inside an example
    real = real.to(ids.device)
    starts = is_token(ids, bos) & real  # (B, T)
    if eos_starts and eos:
        is_eos = is_token(ids, eos)
        starts[:, 1:] |= is_eos[:, :-1] & ~is_eos[:, 1:] & real[:, 1:]  # the token after a run of EOS
    starts[:, 0] = real[:, 0]
    return starts
