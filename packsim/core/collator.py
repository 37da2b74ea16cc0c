"""A padding-free packing collator for the transformers ``Trainer`` (notebook 07).

:class:`PackingCollator` turns a list of features into ONE flattened row in the format of
transformers' ``DataCollatorWithFlattening``: no padding, no ``attention_mask``, boundaries in
``position_ids`` (and, on request, ``cu_seq_lens_q/k`` + ``max_length_q/k`` and ``seq_idx``).
Unlike that collator it builds the labels from the setup's loss: ``"correct"`` counts only
response tokens and EOS, and every example's first token is -100. Features: packsim
``Example`` objects (``.tokens``, ``.n_prompt``) or ``{"prompt_ids", "response_ids"}`` dicts
for any tokenizer (see :class:`PackingCollator`). Whether the examples then stay apart is up to
the forward (eager / sdpa / flex: no ``attention_mask``, ``use_cache=False``); ``packsim.audit``
checks it.

Lessons: 10, A6.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from packsim.core.batch import PackedBatch
from packsim.core.errors import PacksimError
from packsim.core.setups import Setup, get_setup
from packsim.core.token_example import as_example

__all__ = ["PackingCollator"]

_FA_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


class PackingCollator:
    """Collate features into one padding-free row (``DataCollatorWithFlattening`` format).

    Args:
        setup: a preset name or :class:`packsim.Setup`; its ``loss`` decides the labels
            (``"completion"``: response + EOS only; ``"all"``: every token). The first token of
            each example is always -100. The mask is not in the batch: the forward decides it.
        return_flash_attn_kwargs: add ``cu_seq_lens_q/k`` (int32, (S+1,)) and ``max_length_q/k``
            (int), read by flash attention's varlen path and by packsim's attention.
        return_position_ids: add ``position_ids`` (1, N), restarting at 0 for each example
            (packsim's one position convention, :func:`packsim.core.batch_layout.piece_positions`,
            through :meth:`PackedBatch.to_flattening`; this collator never splits an example). Keep
            it: eager / sdpa / flex find the example boundaries from it.
        return_seq_idx: add ``seq_idx`` (1, N) int32, the example index of each token.
        vocab_size: if given, token ids are checked to lie in ``[0, vocab_size)``.

    Calling it on a list of S features returns ``input_ids``, ``labels`` (1, N) int64 and the
    fields asked for, N = total tokens. Bad input raises :class:`packsim.PacksimError`.

    Example::

        >>> import packsim
        >>> collate = packsim.PackingCollator("correct", return_flash_attn_kwargs=True)
        >>> batch = collate([{"prompt_ids": [5, 6], "response_ids": [7, 8]},
        ...                  {"prompt_ids": [9], "response_ids": [10, 11]}])
        >>> batch["labels"].tolist(), batch["position_ids"].tolist(), batch["cu_seq_lens_q"].tolist()
        ([[-100, -100, 7, 8, -100, 10, 11]], [[0, 1, 2, 3, 0, 1, 2]], [0, 4, 7])
    """

    def __init__(self, setup: str | Setup = "correct", return_flash_attn_kwargs: bool = False,
                 return_position_ids: bool = True, return_seq_idx: bool = False,
                 vocab_size: int | None = None):
        self.setup = get_setup(setup)
        self.return_flash_attn_kwargs = bool(return_flash_attn_kwargs)
        self.return_position_ids = bool(return_position_ids)
        self.return_seq_idx = bool(return_seq_idx)
        self.vocab_size = vocab_size

    def __repr__(self) -> str:
        return (f"PackingCollator(setup={self.setup.name!r}, return_flash_attn_kwargs="
                f"{self.return_flash_attn_kwargs}, return_position_ids={self.return_position_ids}, "
                f"return_seq_idx={self.return_seq_idx})")

    def batch(self, features: Sequence) -> PackedBatch:
        """The features as one :class:`PackedBatch` row, in input order (what ``__call__`` flattens)."""
        if isinstance(features, (Mapping, str, bytes)) or not isinstance(features, Sequence):
            raise PacksimError(
                f"PackingCollator takes a list of features, got {type(features).__name__}: pass "
                "[example, example, ...] (the Trainer does)."
            )
        if len(features) == 0:
            raise PacksimError("PackingCollator got an empty list of features: nothing to collate.")
        examples = [as_example(f, i) for i, f in enumerate(features)]
        total = sum(len(ex.tokens) for ex in examples)
        # One row of exactly `total` tokens, packed sequentially: input order, no padding.
        return PackedBatch.from_examples(examples, capacity=max(total, 1), setup=self.setup,
                                         strategy="sequential", vocab_size=self.vocab_size)

    def __call__(self, features: Sequence) -> dict:
        out = self.batch(features).to_flattening()
        if not self.return_flash_attn_kwargs:
            for key in _FA_KEYS:
                del out[key]
        if not self.return_position_ids:
            del out["position_ids"]
        if not self.return_seq_idx:
            del out["seq_idx"]
        return out
