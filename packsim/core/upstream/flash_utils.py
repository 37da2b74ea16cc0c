"""transformers' flash path (``modeling_flash_attention_utils``): where the kernels are picked, the
cache that holds them, and the registries a new ``attn_implementation`` name needs.

A flash implementation's kernels come from ``_lazy_imports(implementation, attention_wrapper=None,
allow_all_kernels=False)``, which returns five callables: (``flash_attn_func`` (B, T, H, D),
``flash_attn_varlen_func`` (total, H, D) with ``cu_seqlens`` (S+1,) int32,
``flash_attn_with_kvcache``, ``pad_input``, ``unpad_input``); a name it does not know goes to the
``kernels`` fallback (``integrations.hub_kernels.load_and_register_attn_kernel``), so a name of
packsim's own must be answered before the original runs (:func:`wrap_lazy_imports`).
``lazy_import_flash_attention`` calls it through the module global (the wrapper is seen) and keeps
the answer in a single-slot cache of module globals keyed by ``_loaded_implementation``
(:data:`CACHE`). Per version (read from 5.16.1 and 5.25.0; 5.24.0 inferred: packsim's pins of
these facts, written against 5.24, passed there as they do on 5.25.0):

- 5.16.1: ``_lazy_imports`` strips a ``paged|`` prefix first (``split_attention_implementation``);
  ``lazy_import_flash_attention`` sets ``_loaded_implementation`` BEFORE calling it and returns
  ``(five kernels, _process_flash_kwargs_fn)``; ``_flash_attention_forward`` is one if/elif/else:
  a 2D mask (``_upad_input``), ``elif is_fa_with_varlen_kwargs or is_fa_with_position_ids`` (the
  given ``cu_seq_lens_*``, else ``_prepare_from_posids``), else ``flash_fn``;
  ``_is_packed_sequence`` ends ``return batch_size == 1 and ...``; ``_process_flash_attention_kwargs``
  drops ``softcap`` silently when the kernel has no such parameter.
- 5.24.0, 5.25.0: the cache gains ``_process_with_kvcache_kwargs_fn`` (:data:`CACHE_FROM_5_24`);
  ``_loaded_implementation`` is set only after the import succeeded; the return is ``(five kernels,
  (_process_flash_kwargs_fn, _process_with_kvcache_kwargs_fn))`` (:func:`lazy_import` reads both);
  ``_flash_attention_forward`` tries a paged kv-cache branch first (``block_table``, ``k_cache``,
  ``v_cache``: never set in training), then separate ``if`` blocks: the 2D mask,
  ``is_fa_with_varlen_kwargs``, ``_is_packed_sequence(position_ids, batch_size)``, then ``flash_fn``; ``_is_packed_sequence``
  returns False early for ``batch_size != 1`` or one position; a kernel without ``softcap`` RAISES.
  5.25.0: ``_lazy_imports`` no longer reads ``paged|`` (model loading strips it, deprecated).

The same on all three, and what packsim relies on: the five-tuple; the decisions of the packed
traps (2D mask first, one segment per row; segments from positions at batch size 1 only; else one
causal sequence per row); ``AttentionInterface`` / ``AttentionMaskInterface`` are
``utils.generic.GeneralInterface`` subclasses whose classmethod ``register`` updates the class dict
``_global_mapping``; ``masking_utils._preprocess_mask_arguments`` returns early for a name not in
``ALL_MASK_ATTENTION_FUNCTIONS._global_mapping`` (so the mask must be registered too);
``modeling_utils.PreTrainedModel.get_correct_attn_implementation`` runs flash-attn's own checks
(``_flash_attn_can_dispatch``) only for ``^flash_attention_(\\d)$``. Neither version registers a
``paged|`` form of a registered name: continuous batching is not emulated.
tests/test_upstream_flash.py pins each fact per installed version.

Lessons: none directly (packsim.reference.flash_emulation puts the reference kernel in through it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["ABSENT", "CACHE", "CACHE_FROM_5_24", "answering", "answering_attn_requests",
           "cache_globals", "flash_functions", "fresh_cache", "lazy_import", "lazy_imports",
           "module", "pad_unpad", "register", "registries", "restore_entry", "unwrap_lazy_imports",
           "wrap_lazy_imports", "wrapped_for"]

# lazy_import_flash_attention's single-slot cache: module globals on 5.16.1, 5.24.0 and 5.25.0
CACHE = ("_loaded_implementation", "_flash_fn", "_flash_varlen_fn", "_flash_with_kvcache_fn", "_pad_fn",
         "_unpad_fn", "_process_flash_kwargs_fn")
# ... and the kv-cache kernel's keyword builder, from 5.24 on (5.16.1 has no such global)
CACHE_FROM_5_24 = ("_process_with_kvcache_kwargs_fn",)
_MARK = "_packsim_answers"  # set on a wrapper of _lazy_imports: the name it answers


def module():
    """``transformers.modeling_flash_attention_utils``, imported here (not at packsim's import)."""
    import transformers.modeling_flash_attention_utils as fa

    return fa


def cache_globals() -> tuple[str, ...]:
    """The cache globals this transformers holds: :data:`CACHE`, and :data:`CACHE_FROM_5_24` where there."""
    fa = module()
    return (*CACHE, *(name for name in CACHE_FROM_5_24 if hasattr(fa, name)))


@contextmanager
def fresh_cache() -> Iterator[None]:
    """Inside: the next ``lazy_import_flash_attention`` calls ``_lazy_imports`` again (``_loaded_implementation``
    None); after: every cache global (:func:`cache_globals`) as it was."""
    fa = module()
    saved = {name: getattr(fa, name) for name in cache_globals()}
    fa._loaded_implementation = None
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(fa, name, value)


def lazy_imports() -> Callable:
    """The ``_lazy_imports`` now in the module (a wrapper of packsim's, or transformers' own)."""
    return module()._lazy_imports


def lazy_import(implementation: str) -> tuple[tuple, Callable]:
    """``lazy_import_flash_attention(implementation)`` as (five kernels, the varlen keyword builder) on
    every version: 5.16.1 returns the builder itself, 5.24 / 5.25 a pair (varlen's, kv-cache's)."""
    kernels, process = module().lazy_import_flash_attention(implementation)
    return kernels, (process[0] if isinstance(process, tuple) else process)


def pad_unpad() -> tuple[Callable, Callable]:
    """transformers' own ``_pad_input`` / ``_unpad_input`` (what ``_lazy_imports`` returns for flash-attn 3/4)."""
    fa = module()
    return fa._pad_input, fa._unpad_input


def wrapped_for(fn) -> set[str]:
    """The names packsim's wrappers of ``_lazy_imports`` answer, along ``fn``'s ``__wrapped__`` chain."""
    names = set()
    while (name := getattr(fn, _MARK, None)) is not None:
        names.add(name)
        fn = fn.__wrapped__
    return names


def answering(original: Callable, name: str, kernels: Callable[[], tuple[Callable, Callable]]) -> Callable:
    """``original`` (a ``_lazy_imports``) answering ``name`` with ``kernels()`` = (flash_fn, varlen_fn), no
    kv-cache kernel and transformers' padding (:func:`pad_unpad`); every other call goes to ``original``
    as it came. ``kernels`` is called at each answer, so a kernel replaced later (a test's spy) is seen."""

    def _lazy_imports(implementation, *args, **kwargs):
        if implementation != name:
            return original(implementation, *args, **kwargs)
        flash_fn, varlen_fn = kernels()
        return (flash_fn, varlen_fn, None, *pad_unpad())

    _lazy_imports.__wrapped__ = original
    _lazy_imports.__doc__ = f"transformers' _lazy_imports, with {name!r} answered by packsim."
    setattr(_lazy_imports, _MARK, name)
    return _lazy_imports


def wrap_lazy_imports(name: str, kernels: Callable[[], tuple[Callable, Callable]], doc: str = "") -> bool:
    """Make ``_lazy_imports`` answer ``name`` (:func:`answering`), once; True if it wrapped now."""
    fa = module()
    if name in wrapped_for(fa._lazy_imports):
        return False
    fa._lazy_imports = answering(fa._lazy_imports, name, kernels)
    if doc:
        fa._lazy_imports.__doc__ = doc
    return True


def flash_functions() -> tuple[Callable, Callable]:
    """(``integrations.flash_attention.flash_attention_forward``, ``masking_utils.flash_attention_mask``):
    what ``"flash_attention_2"`` runs and the mask it gets (None, or the 2D padding mask)."""
    from transformers.integrations.flash_attention import flash_attention_forward
    from transformers.masking_utils import flash_attention_mask

    return flash_attention_forward, flash_attention_mask


def registries() -> tuple[dict, dict]:
    """The class-wide dicts: (``AttentionInterface._global_mapping``,
    ``AttentionMaskInterface._global_mapping``)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    return AttentionInterface._global_mapping, AttentionMaskInterface._global_mapping


def register(name: str) -> bool:
    """Register ``name`` as transformers' own flash attention and flash mask (:func:`flash_functions`);
    True if either registry changed."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    changed = False
    for interface, mapping, fn in zip((AttentionInterface, AttentionMaskInterface), registries(),
                                      flash_functions(), strict=True):
        if mapping.get(name) is not fn:
            interface.register(name, fn)
            changed = True
    return changed


ABSENT = object()  # a registry entry that was not there before


def unwrap_lazy_imports(wrapper: Callable, before: Callable) -> None:
    """Put ``_lazy_imports`` back as ``before``, if it is still ``wrapper`` (one wrapped on top stays)."""
    if lazy_imports() is wrapper:
        module()._lazy_imports = before


def restore_entry(mapping: dict, name: str, old: object, installed: Callable) -> None:
    """Put ``name``'s registry entry back as ``old`` (:data:`ABSENT`: removed), if it is still ``installed``."""
    if mapping.get(name) is not installed:
        return
    if old is ABSENT:
        del mapping[name]
    else:
        mapping[name] = old


@contextmanager
def answering_attn_requests(name: str, answer: Callable[[object], str]) -> Iterator[None]:
    """Inside: ``PreTrainedModel._check_and_adjust_attn_implementation`` answers a request for ``name``
    with ``answer(model)`` for a model whose class supports flash attention (``_supports_flash_attn``);
    transformers' own method again on leaving.

    Every way a model gets its attention implementation (``from_pretrained``, ``from_config``, its
    config, ``set_attn_implementation``) goes through that method, read from 5.16.1 and 5.25.0:
    ``(self, attn_implementation, is_init_check=False, allow_all_kernels=False)``, checking
    ``_supports_flash_attn`` before flash attention (tests/test_upstream_flash.py pins both).
    """
    from transformers import PreTrainedModel

    method = "_check_and_adjust_attn_implementation"
    original = PreTrainedModel.__dict__[method]

    @functools.wraps(original)
    def check_and_adjust(self, attn_implementation, *args, **kwargs):
        if attn_implementation == name and getattr(self, "_supports_flash_attn", False):
            attn_implementation = answer(self)
        return original(self, attn_implementation, *args, **kwargs)

    setattr(PreTrainedModel, method, check_and_adjust)
    try:
        yield
    finally:
        setattr(PreTrainedModel, method, original)
