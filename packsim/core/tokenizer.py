"""A tiny character-level tokenizer, built locally (no downloads), that transformers accepts.

One token per character, plus four special tokens. Ids are fixed and small so they are easy to
read in the notebooks::

    <pad>=0  <bos>=1  <eos>=2  <unk>=3  then the characters of ``CHARS`` in order (4, 5, ...)

:func:`build_tokenizer` returns a real ``transformers.PreTrainedTokenizerFast`` (cached: every
call returns the same object, so don't mutate it). Calling it with special tokens on, e.g.
``tok("abc")``, gives ``<bos> a b c <eos>``, the same layout as ``Example.tokens``.

Data generation uses :func:`encode_strict`, which refuses characters outside the vocabulary
instead of silently turning them into ``<unk>``.

Lessons: 01, 02, 05, A2, A4.
"""

from __future__ import annotations

import functools
import string

from packsim.core.errors import PacksimError

__all__ = [
    "PAD_TOKEN",
    "BOS_TOKEN",
    "EOS_TOKEN",
    "UNK_TOKEN",
    "SPECIAL_TOKENS",
    "CHARS",
    "PAD_ID",
    "BOS_ID",
    "EOS_ID",
    "UNK_ID",
    "VOCAB",
    "VOCAB_SIZE",
    "build_tokenizer",
    "encode",
    "encode_strict",
    "decode",
]

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)

# Every character the synthetic tasks may use: digits, lowercase letters, and a few marks.
CHARS: str = string.digits + string.ascii_lowercase + " =+?:,;>|-."

VOCAB: dict[str, int] = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + tuple(CHARS))}
VOCAB_SIZE: int = len(VOCAB)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = (VOCAB[t] for t in SPECIAL_TOKENS)

_CHAR_TO_ID: dict[str, int] = {c: VOCAB[c] for c in CHARS}


@functools.lru_cache(maxsize=1)
def build_tokenizer():
    """Build (once) and return the character-level ``PreTrainedTokenizerFast``.

    The backend is a ``tokenizers`` WordLevel model over single characters: the pre-tokenizer
    isolates every character, and the ``Fuse`` decoder joins them back with nothing in between,
    so ``decode(encode(s)) == s`` exactly (spaces included). A post-processor adds ``<bos>`` and
    ``<eos>`` when ``add_special_tokens=True`` (the transformers default).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(vocab=dict(VOCAB), unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A {EOS_TOKEN}",
        pair=f"{BOS_TOKEN} $A {EOS_TOKEN} $B {EOS_TOKEN}",
        special_tokens=[(BOS_TOKEN, BOS_ID), (EOS_TOKEN, EOS_ID)],
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="right",
        model_max_length=1 << 20,
        clean_up_tokenization_spaces=False,
    )
    ids = (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id)
    if ids != (PAD_ID, BOS_ID, EOS_ID, UNK_ID) or len(tok) != VOCAB_SIZE:
        raise RuntimeError(  # a transformers/tokenizers version changed how ids are assigned
            f"packsim tokenizer built with unexpected special ids {ids} / size {len(tok)}; "
            f"expected {(PAD_ID, BOS_ID, EOS_ID, UNK_ID)} / {VOCAB_SIZE}. Please report this "
            "with your transformers and tokenizers versions."
        )
    return tok


def encode(text: str) -> list[int]:
    """Token ids of ``text``, without special tokens. Unknown characters become ``<unk>`` (3).

    Like any transformers tokenizer, a literal ``"<eos>"`` in ``text`` is read as the special
    token. Use :func:`encode_strict` for data you generate.
    """
    if not isinstance(text, str):
        raise PacksimError(
            f"encode() takes a str, got {type(text).__name__}; pass the text itself."
        )
    return build_tokenizer().backend_tokenizer.encode(text, add_special_tokens=False).ids


def encode_strict(text: str) -> list[int]:
    """Token ids of ``text`` (no special tokens); raise if any character is not in the vocab."""
    if not isinstance(text, str):
        raise PacksimError(
            f"encode_strict() takes a str, got {type(text).__name__}; pass the text itself."
        )
    for pos, ch in enumerate(text):
        if ch not in _CHAR_TO_ID:
            raise PacksimError(
                f"character {ch!r} at position {pos} of {text!r} is not in the packsim vocabulary "
                f"(allowed: digits, lowercase letters and {CHARS[36:]!r}); "
                "remove or replace it (e.g. text.lower()) before encoding."
            )
    return [_CHAR_TO_ID[ch] for ch in text]


def decode(ids, skip_special_tokens: bool = False) -> str:
    """Text of ``ids`` (a list of ints or a 1-D tensor), characters joined with nothing between."""
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    return build_tokenizer().decode(list(ids), skip_special_tokens=skip_special_tokens)
