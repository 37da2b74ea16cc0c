"""What transformers' packed-sequence mask costs, per attention backend: measured, not assumed.

A pack is given by ``lengths``: one row of example lengths (a list of ints) or several rows of
equal total N. The batch is input_ids (B, N) and position_ids (B, N) restarting at 0 in each
example, no attention_mask, no cache: the call with which transformers detects the pack itself
(``_preprocess_mask_arguments`` -> ``find_packed_sequence_indices`` in
``transformers/masking_utils.py``). :func:`mask_costs` builds the trap table's tiny Llama
(:func:`packsim.exhibits.trap_cases.build_family`) per backend, catches the ``attention_mask``
that reaches the first attention module (a forward pre-hook, with kwargs: it sees every
backend's mask, eager's too, which has no entry in ``ALL_ATTENTION_FUNCTIONS``) and stops the
forward there, so no attention runs. A :class:`MaskCost` says:

- the mask object: its type, shape, dtype and ``bytes`` (storage it holds). ``sdpa``: a dense
  bool (B, 1, N, N) tensor (``sdpa_mask``); ``eager``: the same as float (``eager_mask``, 0 /
  finfo.min); ``flex_attention``: a ``BlockMask`` (``flex_attention_mask``, 128 x 128 blocks);
- ``score_pairs``: (query, key) pairs per head the kernel computes for that object. A dense
  tensor mask: B * N * N (SDPA and eager compute every score, then mask it; torch's CUDA SDPA
  flash kernel refuses an explicit attn_mask, ``check_for_attn_mask``); ``None``: B * N(N+1)/2
  (SDPA's ``is_causal``); a BlockMask: the area, clipped to N x N, of its computed (full or
  partial) blocks (:func:`packsim.core.masks.block_sparsity`);
- ``varlen_pairs``: sum of L_i(L_i+1)/2, what a varlen (flash) kernel computes inside the examples.

:func:`unpacked_mask_cost` is the contrast: one example per row, positions 0..L-1 in every row,
no restart. On ``sdpa`` the mask is ``None`` (``sdpa_mask`` returns None when
``_ignore_causal_mask_sdpa`` holds) and SDPA runs with ``is_causal=True``.

Lessons: 04, A8.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from unittest import mock

import torch

from packsim.core.errors import PacksimError
from packsim.core.tiles import score_pairs

__all__ = ["BACKENDS", "MaskCost", "captured_mask", "mask_costs", "mask_of", "unpacked_mask_cost"]

BACKENDS = ("sdpa", "eager", "flex_attention")


@dataclass(frozen=True)
class MaskCost:
    """The mask one backend passes to attention for a batch, and the work it implies (per head)."""

    backend: str
    kind: str  # "None", "Tensor" or "BlockMask"
    shape: tuple | None
    dtype: str | None
    bytes: int
    score_pairs: int
    varlen_pairs: int
    blocks: tuple[int, int] | None = None  # BlockMask: (computed, total) blocks

    @property
    def work_ratio(self) -> float:
        """``score_pairs / varlen_pairs``: how many times the varlen work this mask costs."""
        return self.score_pairs / self.varlen_pairs


class _Caught(Exception):
    def __init__(self, mask):
        super().__init__("mask caught")
        self.mask = mask


def _attention_module(model) -> torch.nn.Module:
    for module in model.modules():
        if type(module).__name__.endswith("Attention") and hasattr(module, "layer_idx"):
            return module
    raise PacksimError(f"{type(model).__name__} has no attention module with a layer_idx to hook.")


def captured_mask(model, batch: dict):
    """The ``attention_mask`` the first attention module of ``model`` receives for ``model(**batch)``.

    Stops the forward at that module (nothing after it runs). On CPU transformers' flex mask is
    built uncompiled (``create_block_mask(..., _compile=False)``: the same BlockMask, without
    seconds of compiling).
    """
    import transformers.masking_utils as hf_masking

    def hook(module, args, kwargs):
        if "attention_mask" not in kwargs:
            raise PacksimError(f"{type(module).__name__} got no attention_mask keyword: cannot read the mask.")
        raise _Caught(kwargs["attention_mask"])

    original = hf_masking.create_block_mask
    handle = _attention_module(model).register_forward_pre_hook(hook, with_kwargs=True)
    with ExitStack() as stack, torch.no_grad():
        stack.callback(handle.remove)
        if model.device.type != "cuda":
            stack.enter_context(mock.patch.object(
                hf_masking, "create_block_mask", lambda *a, **k: original(*a, **{**k, "_compile": False})))
        try:
            model(**batch, use_cache=False)
        except _Caught as caught:
            return caught.mask
    raise PacksimError("the forward finished without reaching an attention module.")


def _computed_area(block_mask, n: int) -> tuple[int, int, int]:
    """(score pairs in computed blocks, clipped to n x n; computed blocks; total blocks)."""
    from packsim.core.masks import block_sparsity

    s = block_sparsity(block_mask)
    bq, bk = s.block_size
    grid = s.grid  # (B, H, nq, nk): 0 skipped, 1 partial, 2 full
    rows = torch.clamp(n - torch.arange(grid.shape[2]) * bq, max=bq)  # (nq,) query rows per block
    cols = torch.clamp(n - torch.arange(grid.shape[3]) * bk, max=bk)  # (nk,)
    area = rows[:, None] * cols[None, :]  # (nq, nk)
    return int(((grid > 0) * area).sum()), s.computed, s.total


def mask_of(backend: str, mask, batch_rows: int, n: int, varlen_pairs: int) -> MaskCost:
    """A :class:`MaskCost` of one caught ``mask`` for ``batch_rows`` rows of ``n`` tokens."""
    if mask is None:
        return MaskCost(backend, "None", None, None, 0, batch_rows * score_pairs(n, causal=True), varlen_pairs)
    if isinstance(mask, torch.Tensor):
        return MaskCost(backend, "Tensor", tuple(mask.shape), str(mask.dtype).removeprefix("torch."),
                        mask.untyped_storage().nbytes(), batch_rows * n * n, varlen_pairs)
    if type(mask).__name__ == "BlockMask":
        tensors = {id(t): t for t in mask.as_tuple() if isinstance(t, torch.Tensor)}.values()
        pairs, computed, total = _computed_area(mask, n)
        return MaskCost(backend, "BlockMask", tuple(mask.shape), None,
                        sum(t.untyped_storage().nbytes() for t in tensors), pairs, varlen_pairs, (computed, total))
    raise PacksimError(f"{backend}: unexpected mask object {type(mask).__name__}.")


def _rows(lengths) -> list[list[int]]:
    rows = [list(lengths)] if all(isinstance(x, int) for x in lengths) else [list(r) for r in lengths]
    if not rows or not all(rows) or any(not isinstance(x, int) or x < 1 for r in rows for x in r):
        raise PacksimError(f"lengths must be positive ints (one row) or rows of them, got {lengths!r}.")
    if len({sum(r) for r in rows}) != 1:
        raise PacksimError(f"every row must hold the same number of tokens, got {[sum(r) for r in rows]}.")
    return rows


def mask_costs(lengths, backends=BACKENDS, family: str = "llama", seed: int = 0) -> dict[str, MaskCost]:
    """backend -> :class:`MaskCost` of a pack of ``lengths`` (position_ids restart, no mask, no cache)."""
    from packsim.exhibits.trap_cases import VOCAB, build_family

    rows = _rows(lengths)
    n = sum(rows[0])
    pos = torch.stack([torch.cat([torch.arange(L) for L in r]) for r in rows])  # (B, N)
    ids = torch.randint(3, VOCAB, pos.shape, generator=torch.Generator().manual_seed(seed))  # (B, N)
    varlen = sum(score_pairs(L, causal=True) for r in rows for L in r)
    out = {}
    for backend in backends:
        mask = captured_mask(build_family(family, backend, seed), {"input_ids": ids, "position_ids": pos})
        out[backend] = mask_of(backend, mask, len(rows), n, varlen)
    return out


def unpacked_mask_cost(length: int, rows: int = 1, backend: str = "sdpa", family: str = "llama",
                       seed: int = 0) -> MaskCost:
    """:class:`MaskCost` of ``rows`` rows of one example of ``length`` tokens each (no packing)."""
    from packsim.exhibits.trap_cases import VOCAB, build_family

    if isinstance(length, bool) or not isinstance(length, int) or length < 1 or rows < 1:
        raise PacksimError(f"length and rows must be positive ints, got {length!r}, {rows!r}.")
    pos = torch.arange(length).expand(rows, length)  # (B, L): 0..L-1, no restart
    ids = torch.randint(3, VOCAB, pos.shape, generator=torch.Generator().manual_seed(seed))
    mask = captured_mask(build_family(family, backend, seed), {"input_ids": ids, "position_ids": pos})
    return mask_of(backend, mask, rows, length, rows * score_pairs(length, causal=True))
