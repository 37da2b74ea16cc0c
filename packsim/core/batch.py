"""PackedBatch: examples packed into rows, with everything a setup needs to run and score them.

``from_examples`` is the one builder the course, the trainer and the
audit share. Layout: ``B`` rows of ``T`` tokens (``T`` = capacity for packed setups, the longest
example for ``padded``), padding at the end of each row.

Two kinds of boundaries live here, and the difference matters:

- ``cu_seqlens`` (int32, ``(S+1,)``) delimits the *examples* over the real tokens only, in
  row-major order with padding left out: exactly what FlashAttention's ``cu_seqlens`` and
  transformers' ``DataCollatorWithFlattening`` (``cu_seq_lens_q``) mean.
- :meth:`PackedBatch.attention_segments` gives the segments the *setup's mask* uses over all
  ``B*T`` tokens: one per row for the causal mask (examples see each other: the bug), one per
  example and per padding run for the block-diagonal mask.

Positions: ``position_ids`` under a ``reset`` setup, and ``example_positions`` always, count from
0 at the start of every piece (a run of one example's tokens in one row): an example split across
rows (``"wrapped"``, ``overflow="split"``) restarts in each row, as TRL's ``bfd_split`` does.
One rule, :func:`packsim.core.batch_layout.piece_positions`; ``to_flattening`` and
``from_flattening`` use it too, so the flattened row carries the same positions as the rows (the
module docstring of :mod:`packsim.core.batch_layout` says why this rule and not the example's
offsets).

Lessons: 00, 01, 02, 05, 06, 07, 09, A2, A4, A6.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import chain

import numpy as np
import torch

from packsim.core.batch_layout import layout, piece_positions
from packsim.core.boundaries import find_boundaries
from packsim.core.errors import PacksimError
from packsim.core.loss import IGNORE_INDEX, Role, make_labels, response_mask
from packsim.core.pack_stats import packing_stats
from packsim.core.packing import pack_arrays
from packsim.core.segments import (
    Segment,
    cu_seqlens_from_lengths,
    cu_seqlens_from_position_ids,
    seq_ids_from_cu_seqlens,
)
from packsim.core.setups import Setup, get_setup
from packsim.core.token_example import as_example

__all__ = ["PackedBatch"]


def _example_parts(ex, i: int) -> tuple[list[int], int]:
    """(tokens, n_prompt) of example ``i``: Example-like (``.tokens``, ``.n_prompt``) or a prompt/response dict.

    ``.tokens`` is read once (``Example.tokens`` builds a fresh list each time; ``as_example``'s
    ``hasattr`` would read it twice more) and only read from here on: no copy. Tokens in an array
    (numpy, a tensor, pyarrow) become a list in one ``tolist()``, not one scalar object per token.
    """
    tokens = getattr(ex, "tokens", None)
    if tokens is None or not hasattr(ex, "n_prompt"):
        ex = as_example(ex, i, "example")
        tokens = ex.tokens
    if not isinstance(tokens, list | tuple):
        tokens = tokens.tolist() if hasattr(tokens, "tolist") else list(tokens)
    return tokens, int(ex.n_prompt)


def _validate(examples: Sequence, capacity: int, vocab_size: int | None) -> list[tuple[list[int], int]]:
    if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0:
        raise PacksimError(f"capacity must be a positive int (tokens per row), got {capacity!r}.")
    if len(examples) == 0:
        raise PacksimError("no examples to pack: pass at least one example.")
    parts = [_example_parts(ex, i) for i, ex in enumerate(examples)]
    for i, (tokens, n_prompt) in enumerate(parts):
        if len(tokens) == 0:
            raise PacksimError(f"example {i} is empty: drop empty examples before packing.")
        if not 0 < n_prompt < len(tokens):
            raise PacksimError(
                f"example {i} has no response tokens (n_prompt={n_prompt}, {len(tokens)} tokens): "
                "every example needs at least one response token (its EOS counts); drop or fix it."
            )
    return parts


def _flat_tokens(parts, vocab_size: int | None) -> torch.Tensor:
    """Every example's tokens concatenated, ``(sum(lengths),)`` long; ids checked against the vocabulary."""
    n_tokens = sum(len(tokens) for tokens, _ in parts)
    flat = torch.from_numpy(np.fromiter(chain.from_iterable(t for t, _ in parts), dtype=np.int64, count=n_tokens))
    if vocab_size is not None:
        bad = torch.nonzero((flat < 0) | (flat >= vocab_size))
        if len(bad):
            at = int(bad[0])
            i = int(np.searchsorted(np.cumsum([len(t) for t, _ in parts]), at, side="right"))
            raise PacksimError(
                f"example {i} has token id {int(flat[at])} outside the vocabulary [0, {vocab_size}): "
                "encode with the same tokenizer the model was built for."
            )
    return flat


@dataclass(repr=False)
class PackedBatch:
    """A batch of packed rows. Tensors are (B, T) unless noted.

    Attributes:
        input_ids, labels (-100 where ignored), position_ids: what the model sees;
        seq_ids: example index per token, -1 on padding; roles: :class:`packsim.core.loss.Role` per token;
        example_positions: each token's position id under the convention: its index inside its
        piece, the run of its example in its row (the whole example unless it was split; padding:
        0.. per run);
        cu_seqlens (S+1,) int32 and max_seqlen: example boundaries over real tokens (see module doc);
        segments: one :class:`Segment` per example piece, in row-major order;
        setup, capacity, strategy (``"given"`` for :meth:`from_flattening`: the row came packed);
        lengths: token count of each input example (before any truncate/split);
        roles_from_labels: True when ``roles`` were inferred from given labels
        (:meth:`from_flattening`), so prompt vs response is only as right as those labels.

    Example::

        >>> import packsim
        >>> batch = packsim.PackedBatch.from_examples(packsim.make_examples(6), capacity=64, setup="correct")
        >>> batch.input_ids.shape[1], batch.cu_seqlens.dtype
        (64, torch.int32)
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    seq_ids: torch.Tensor
    roles: torch.Tensor
    example_positions: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    segments: list[Segment]
    setup: Setup
    capacity: int
    strategy: str = "bfd"
    lengths: list[int] = field(default_factory=list)
    roles_from_labels: bool = False

    @classmethod
    def from_examples(
        cls,
        examples: Sequence,
        capacity: int,
        setup: str | Setup = "correct",
        strategy: str = "bfd",
        overflow: str = "error",
        pad_id: int = 0,
        vocab_size: int | None = None,
    ) -> PackedBatch:
        """Pack ``examples`` (objects with ``.tokens`` and ``.n_prompt``, or dicts with
        ``prompt_ids`` and ``response_ids``: :func:`packsim.core.token_example.as_example`) into
        rows for ``setup``.

        Packed setups get rows of ``capacity`` tokens from ``strategy`` (``wrapped`` | ``ffd`` |
        ``bfd``); ``padded`` gets one example per row padded to the longest. Every input is
        checked before anything is built.
        """
        setup = get_setup(setup)
        parts = _validate(examples, capacity, vocab_size)
        lengths = [len(tokens) for tokens, _ in parts]
        tokens = _flat_tokens(parts, vocab_size)
        # the packs as arrays: no Python object per piece from here on (batch_layout)
        arrays = pack_arrays(lengths, capacity, strategy=strategy, overflow=overflow)
        T = capacity if setup.packed else int(arrays.length.max())
        n_prompt = np.fromiter((k for _, k in parts), dtype=np.int64, count=len(parts))
        ids, seq, roles, reset_pos, segments = layout(tokens, n_prompt, arrays, T, setup.packed, pad_id)
        seg_lens = torch.from_numpy(segments.lengths())  # (S,) row-major
        cu = cu_seqlens_from_lengths(seg_lens)  # (S+1,)
        return cls(
            input_ids=ids,
            labels=make_labels(ids, roles, setup.loss),
            position_ids=_positions(reset_pos, setup),
            seq_ids=seq,
            roles=roles,
            example_positions=reset_pos,
            cu_seqlens=cu,
            max_seqlen=int(seg_lens.max()),
            segments=segments,
            setup=setup,
            capacity=capacity,
            strategy=strategy,
            lengths=lengths,
        )

    def with_setup(self, setup: str | Setup) -> PackedBatch:
        """The same rows under another setup: labels and positions rebuilt, tokens untouched.

        Packed and one-example-per-row layouts differ, so ``padded`` <-> packed raises.
        """
        setup = get_setup(setup)
        if setup.packed != self.setup.packed:
            raise PacksimError(
                f"this batch was built for {self.setup.name!r}; {setup.name!r} needs a different row "
                "layout (packed vs one example per row): build it with PackedBatch.from_examples."
            )
        return replace(
            self,
            setup=setup,
            labels=make_labels(self.input_ids, self.roles, setup.loss),
            position_ids=_positions(self.example_positions, setup),
        )

    def __repr__(self) -> str:
        B, T = self.shape
        fill = self.n_real_tokens / (B * T)
        return (f"PackedBatch(setup={self.setup.name!r}, rows={B}, T={T}, examples={len(self.segments)}, "
                f"real_tokens={self.n_real_tokens}, fill={fill:.1%}, max_seqlen={self.max_seqlen})")

    # ---- views -------------------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.input_ids.shape)

    @property
    def real_mask(self) -> torch.Tensor:
        """(B, T) bool: True on tokens of an example, False on padding."""
        return self.seq_ids >= 0

    @property
    def response_mask(self) -> torch.Tensor:
        """(B, T) bool: the tokens a completion-only loss counts (response and EOS)."""
        return response_mask(self.roles)

    @property
    def completion_labels(self) -> torch.Tensor:
        """(B, T) labels of a completion-only loss, whatever this batch's setup trains on.

        What the response loss and exact match score (training logs, evaluation).
        """
        return make_labels(self.input_ids, self.roles, "completion")

    @property
    def n_real_tokens(self) -> int:
        return int(self.real_mask.sum())

    def row_lengths(self) -> list[list[int]]:
        """Segment lengths of each row: B lists, each in row order (one per example piece)."""
        rows: list[list[int]] = [[] for _ in range(self.shape[0])]
        for s in self.segments:
            rows[s.row].append(s.stop - s.start)
        return rows

    def stats(self):
        """Packing statistics (fill ratio, lower bound, padding waste) of this batch's rows."""
        loads = [s.stop - s.start for s in self.segments]
        packs: list[list[int]] = [[] for _ in range(self.shape[0])]
        for i, s in enumerate(self.segments):
            packs[s.row].append(i)
        return packing_stats(loads, packs, self.shape[1])

    def attention_segments(self) -> tuple[torch.Tensor, int]:
        """Segments the setup's mask uses over all B*T tokens: (cu (S'+1,) int32, max length).

        Causal mask: one segment per row, so every example sees the ones before it in its row.
        Block-diagonal: one per example piece plus one per padding run (padding attends only
        to padding; its outputs are never counted under a completion loss). Those are exactly
        the runs of consecutive ``example_positions``, the rule transformers also uses.
        """
        B, T = self.shape
        if self.setup.mask == "causal":
            cu = torch.arange(0, B * T + 1, T, dtype=torch.int32)
            return cu, T
        cu = cu_seqlens_from_position_ids(self.example_positions)  # positions restart in every piece
        return cu, int((cu[1:] - cu[:-1]).max())

    def to(self, device) -> PackedBatch:
        """A copy with every tensor on ``device`` (cu_seqlens included)."""
        names = ("input_ids", "labels", "position_ids", "seq_ids", "roles", "example_positions", "cu_seqlens")
        return replace(self, **{k: getattr(self, k).to(device) for k in names})

    # ---- transformers' DataCollatorWithFlattening format ----------------------------------------

    def to_flattening(self) -> dict:
        """This batch as ``DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)`` returns it.

        One row of the real tokens (padding dropped): ``input_ids``, ``labels`` (first token of
        every example set to -100), ``position_ids``, ``cu_seq_lens_q/k`` (int32),
        ``max_length_q/k`` (int), ``seq_idx`` (int32, 0..S-1 in order). One sequence per piece
        (per example unless one was split): ``position_ids`` restart at 0 in every piece
        (:func:`~packsim.core.batch_layout.piece_positions`), the rows' own ``example_positions``
        concatenated, so no piece continues the one before it in the flattened row and every
        reader of the fields (``cu_seq_lens_q``, ``seq_idx``, position resets) finds the same
        pieces. Whatever the setup: this format marks its sequences by ``position_ids``, so a
        ``continuous`` setup's 0..T-1 positions have no flattened form.
        """
        real = self.real_mask.reshape(-1)
        labels = self.labels.reshape(-1)[real].clone()
        starts = self.cu_seqlens[:-1].long()
        labels[starts] = IGNORE_INDEX
        seq_idx = seq_ids_from_cu_seqlens(self.cu_seqlens)  # (N,) piece per real token
        position_ids = piece_positions(self.cu_seqlens.diff())  # (N,) restarting at 0 in every piece
        return {
            "input_ids": self.input_ids.reshape(-1)[real].unsqueeze(0),
            "labels": labels.unsqueeze(0),
            "position_ids": position_ids.unsqueeze(0),
            "cu_seq_lens_q": self.cu_seqlens.clone(),
            "cu_seq_lens_k": self.cu_seqlens.clone(),
            "max_length_q": self.max_seqlen,
            "max_length_k": self.max_seqlen,
            "seq_idx": seq_idx.to(torch.int32).unsqueeze(0),
        }

    @classmethod
    def from_flattening(cls, features: dict, setup: str | Setup = "correct") -> PackedBatch:
        """One-row PackedBatch from a ``DataCollatorWithFlattening``-style dict.

        Boundaries come from ``cu_seq_lens_q`` if present, else ``seq_idx``, else resets of
        ``position_ids``; the batch's positions are then the convention's, 0 at the start of each
        sequence found (:func:`~packsim.core.batch_layout.piece_positions`). Roles are inferred from the labels (counted -> RESPONSE, ignored ->
        PROMPT; the collator's own -100 at each example start -> FIRST/BOUNDARY), so the
        batch's ``labels`` are kept as given rather than rebuilt for ``setup.loss``.
        """
        input_ids = torch.as_tensor(features["input_ids"]).reshape(1, -1)
        N = input_ids.shape[1]
        labels = torch.as_tensor(features.get("labels", input_ids)).reshape(1, -1)
        found = find_boundaries(features, shape=(1, N))  # cu_seq_lens_q > seq_idx > position_ids
        cu = found.cu_seqlens.cpu()
        if int(cu[-1]) != N:
            raise PacksimError(
                f"{found.source} marks {N - int(cu[-1])} of the {N} tokens as padding: "
                "from_flattening takes one row of real tokens; drop the padding first."
            )
        lens = (cu[1:] - cu[:-1]).long()
        seq = found.seq_ids.cpu()  # (1, N): 0..S-1, no padding
        positions = piece_positions(lens).reshape(1, N)  # (1, N)
        roles = torch.where(labels[0] != IGNORE_INDEX, int(Role.RESPONSE), int(Role.PROMPT)).to(torch.uint8)
        roles[cu[1:-1].long()] = Role.BOUNDARY
        roles[0] = Role.FIRST
        segments = [Segment(0, int(a), int(b), i) for i, (a, b) in enumerate(zip(cu[:-1], cu[1:], strict=True))]
        return cls(input_ids, labels, positions, seq, roles.unsqueeze(0), positions.clone(), cu,
                   int(lens.max()), segments, get_setup(setup), N, "given", lens.tolist(),
                   roles_from_labels=True)


def _positions(example_positions: torch.Tensor, setup: Setup) -> torch.Tensor:
    """Position ids (B, T) for a setup: per-example (reset) or 0..T-1 across the row (continuous)."""
    if setup.positions == "reset":
        return example_positions.clone()
    B, T = example_positions.shape
    return torch.arange(T, device=example_positions.device).expand(B, T).clone()

