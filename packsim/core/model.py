"""The tiny transformers decoder the course trains, and the forward that runs a PackedBatch under a setup.

The lessons build their models here. ``build_model`` makes a real ``LlamaForCausalLM`` from a
config (random init, no download) through :func:`model_from_config`, which builds any family's
tiny model the same way (the trap table's too); :func:`shared_model` builds a read-only model once
and shares it (the museum's and the trap explorer's). ``forward`` runs a :class:`~packsim.core.batch.PackedBatch`:

- ``backend`` = a packsim kernel (``auto``, ``dense``, ``blocked``, ``flex``, ``flash``,
  ``torch_varlen``): attention goes through packsim's varlen interface, registered into
  transformers as the ``"packsim"`` attention implementation, with the setup's segments passed
  as ``cu_seq_lens_q/k`` (no dense mask);
- ``backend="transformers"``: the model's own attention (eager / sdpa / flex_attention) with
  a 4D additive mask built from the setup (dense, O(T^2): the reference way).

Lessons: 00, 02, 04, 06, 07, 09, 10, A1, A2, A3, A4, A6, A7, A8.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import contextmanager

import torch
from transformers import AttentionInterface, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from packsim.core.attention import varlen_attention
from packsim.core.batch import PackedBatch
from packsim.core.boundaries import find_boundaries
from packsim.core.errors import PacksimError
from packsim.core.masks import block_diagonal_mask, flex_block_mask, to_additive_4d
from packsim.core.segments import run_cu_seqlens, seq_ids_from_cu_seqlens

__all__ = [
    "MODEL_SIZES",
    "build_model",
    "model_from_config",
    "shared_model",
    "forward",
    "attention_maps",
    "register_packsim_attention",
    "ATTN_NAME",
]

ATTN_NAME = "packsim"

MODEL_SIZES = {
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512),
    "small": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, intermediate_size=1024),
}


def build_model(
    size: str = "tiny",
    vocab_size: int | None = None,
    max_positions: int = 4096,
    attn_implementation: str = ATTN_NAME,
    seed: int = 0,
) -> LlamaForCausalLM:
    """A randomly initialised ``LlamaForCausalLM`` sized by name (``tiny`` 0.53M, ``small`` 4.2M params).

    ``use_cache=False`` is set in the config: with a cache, transformers skips packed-sequence
    detection (a trap notebook 04 shows). ``vocab_size`` defaults to packsim's tokenizer.

    Example::

        >>> import packsim
        >>> model = packsim.build_model("tiny", seed=0)
        >>> type(model).__name__, model.config.use_cache
        ('LlamaForCausalLM', False)
    """
    if size not in MODEL_SIZES:
        raise PacksimError(f"unknown model size {size!r}: use one of {sorted(MODEL_SIZES)}.")
    if vocab_size is None:
        from packsim.core.tokenizer import build_tokenizer

        vocab_size = len(build_tokenizer())
    if attn_implementation == ATTN_NAME:
        register_packsim_attention()
    config = LlamaConfig(
        vocab_size=vocab_size,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        use_cache=False,
        attn_implementation=attn_implementation,
        pad_token_id=0,
        **MODEL_SIZES[size],
    )
    return model_from_config(config, seed=seed)


def model_from_config(config, attn_implementation: str | None = None, seed: int = 0, *,
                      auto_class=AutoModelForCausalLM, quiet: bool = False):
    """A randomly initialised ``*ForCausalLM`` of ``config``'s family, in eval mode (no download).

    Seeded with ``torch.manual_seed(seed)`` first: the same config and seed give the same
    weights. ``attn_implementation`` overrides the config's. ``auto_class``: the transformers auto
    class that maps the config to a model (e.g. ``AutoModelForImageTextToText`` for a VLM, whose
    text stack runs when no pixels are given). ``quiet=True`` drops the Python warnings building
    it raises (e.g. config fields a tiny model sets on purpose).
    """
    torch.manual_seed(seed)
    kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    with warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("ignore")
        return auto_class.from_config(config, **kwargs).eval()


_SHARED: dict[tuple, torch.nn.Module] = {}


def shared_model(build: Callable[..., torch.nn.Module], *args, **kwargs) -> torch.nn.Module:
    """``build(*args, **kwargs)``, built on the first call with these arguments, the same object after.

    For read-only models that many cases or widget redraws use: callers must not train it or
    change its settings (a copy is theirs to change).
    """
    key = (build, args, tuple(sorted(kwargs.items())))
    if key not in _SHARED:
        _SHARED[key] = build(*args, **kwargs)
    return _SHARED[key]


def _packsim_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention function: q (B, H, T, D), k/v (B, H_kv, T, D) -> ((B, T, H, D), None).

    Segments come from :func:`packsim.core.boundaries.find_boundaries`: ``cu_seq_lens_q`` over the
    flattened B*T tokens if given (as ``DataCollatorWithFlattening`` or :func:`forward` pass them),
    else ``seq_idx``, else ``position_ids`` restarts, else one causal segment per row.
    ``attention_mask`` is ignored (none is built).
    """
    B, H, T, D = query.shape
    cu, max_len = _segments_from_kwargs(kwargs, B, T, query.device)
    q = query.transpose(1, 2).reshape(B * T, H, D)  # (B*T, H, D)
    k = key.transpose(1, 2).reshape(B * T, key.shape[1], D)  # (B*T, H_kv, D)
    v = value.transpose(1, 2).reshape(B * T, value.shape[1], D)
    out = varlen_attention(q, k, v, cu, cu, max_len, max_len, causal=True, softmax_scale=scaling,
                           backend=kwargs.get("packsim_backend", "auto"))
    capture = kwargs.get("packsim_capture")
    if capture is not None:
        capture.append(_attention_probs(query, key, cu, scaling))
    return out.view(B, T, H, D), None


def _attention_probs(query, key, cu, scaling) -> torch.Tensor:
    """Attention probabilities (B, H, T, T) under the segments ``cu`` (dense; for small packs)."""
    B, H, T, D = query.shape
    k = key.repeat_interleave(H // key.shape[1], dim=1)  # (B, H, T, D): GQA heads expanded
    seg = seq_ids_from_cu_seqlens(cu).view(B, T)  # (B, T)
    allowed = block_diagonal_mask(seg)  # (B, T, T) bool, causal within a segment
    scale = scaling if scaling is not None else D**-0.5
    scores = (query @ k.transpose(-1, -2)).float() * scale  # (B, H, T, T)
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    return scores.softmax(-1).detach()


def _segments_from_kwargs(kwargs, B: int, T: int, device) -> tuple[torch.Tensor, int]:
    """(cu (S'+1,) int32 over all B*T tokens, max length): one segment per run of one example."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is not None and int(cu[-1]) != B * T:
        raise PacksimError(
            f"cu_seq_lens_q ends at {int(cu[-1])} but the batch holds {B}x{T}={B * T} tokens: "
            "segments must cover every token of the flattened batch (padding included)."
        )
    found = find_boundaries(kwargs, shape=(B, T), missing="rows")
    cu = run_cu_seqlens(found.seq_ids).to(device)  # (S'+1,): padding runs are segments too
    return cu, int((cu[1:] - cu[:-1]).max())


def register_packsim_attention() -> None:
    """Register packsim's varlen path as transformers' ``"packsim"`` attention implementation."""
    AttentionInterface.register(ATTN_NAME, _packsim_attention)


def _check_ids(model, batch: PackedBatch) -> None:
    vocab = _unwrapped(model).config.vocab_size
    ids = batch.input_ids
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        bad = int(ids.max()) if int(ids.max()) >= vocab else int(ids.min())
        raise PacksimError(
            f"token id {bad} is outside the model's vocabulary [0, {vocab}): build the model with "
            "vocab_size=len(tokenizer) of the tokenizer that made the batch."
        )


def forward(model, batch: PackedBatch, backend: str = "auto", inputs_embeds=None) -> torch.Tensor:
    """Logits (B, T, V) of ``batch`` under its setup (use ``batch.with_setup(...)`` to switch).

    ``model`` may be wrapped in ``DistributedDataParallel``: the call goes through the wrapper
    (its gradient hooks), the config is read from ``model.module``.

    The setup decides the attention segments (causal over the row, or block-diagonal) and the
    positions; its loss mode lives in ``batch.labels``. See the module doc for backends.
    ``inputs_embeds`` (B, T, d) replaces the token embeddings (gradient probes use it).
    """
    _check_ids(model, batch)
    inputs = {"input_ids": batch.input_ids} if inputs_embeds is None else {"inputs_embeds": inputs_embeds}
    if backend == "transformers":
        return _forward_dense_mask(model, batch, inputs)
    return _varlen_call(model, batch, inputs, packsim_backend=backend).logits


def _varlen_call(model, batch: PackedBatch, inputs: dict, **packsim_kwargs):
    """``model(...)`` through packsim's attention with the setup's segments as ``cu_seq_lens``."""
    cu, max_len = batch.attention_segments()
    cu = cu.to(batch.input_ids.device)
    with _attn_implementation(model, ATTN_NAME):
        return model(**inputs, position_ids=batch.position_ids, use_cache=False, cu_seq_lens_q=cu,
                     cu_seq_lens_k=cu, max_length_q=max_len, max_length_k=max_len, **packsim_kwargs)


@torch.no_grad()
def attention_maps(model, batch: PackedBatch) -> torch.Tensor:
    """Attention probabilities (L, B, H, T, T) of every layer and head of ``batch`` under its setup.

    Row ``q`` of ``[l, b, h]`` is where query token ``q`` of row ``b`` looks; its mass on keys of
    other examples is the cross-example leak. Computed densely (O(T^2) per row): meant for the
    short packs the leakage explorer (notebooks 02, 06, 07) and the audit show.
    """
    _check_ids(model, batch)
    capture: list[torch.Tensor] = []
    _varlen_call(model, batch, {"input_ids": batch.input_ids}, packsim_backend="dense", packsim_capture=capture)
    return torch.stack(capture)  # (L, B, H, T, T)


@contextmanager
def _attn_implementation(model, name: str):
    """Run the model with attention implementation ``name``, restoring the previous one after."""
    model = _unwrapped(model)
    previous = model.config._attn_implementation
    if previous == name:
        yield
        return
    register_packsim_attention()
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


def _unwrapped(model):
    """The model inside a ``DistributedDataParallel`` wrapper (``.module``), or the model itself."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def _forward_dense_mask(model, batch: PackedBatch, inputs: dict) -> torch.Tensor:
    """The reference path: the model's own attention with an explicit mask from the setup.

    eager / sdpa get a dense 4D additive float mask (B, 1, T, T), O(T^2); flex_attention gets a
    BlockMask (compiled CPU flex has crashed on a 4D tensor mask read by transformers: the torch build,
    in tests/test_transformers_traps.py's ``test_compiled_flex_with_4d_tensor_mask``).
    """
    impl = _unwrapped(model).config._attn_implementation
    if impl == ATTN_NAME:
        raise PacksimError(
            "backend='transformers' needs a model built with attn_implementation='eager', 'sdpa' "
            "or 'flex_attention'; this one uses packsim's. Pass a packsim backend instead."
        )
    cu, _ = batch.attention_segments()
    B, T = batch.shape
    seg = seq_ids_from_cu_seqlens(cu).view(B, T)  # (B, T): segment id per token
    if impl == "flex_attention":
        mask = flex_block_mask(seg, device=batch.input_ids.device)
    else:
        mask = to_additive_4d(block_diagonal_mask(seg), dtype=_unwrapped(model).dtype)  # (B, 1, T, T)
    return model(**inputs, attention_mask=mask, position_ids=batch.position_ids, use_cache=False).logits
